"""The zygote: a sandboxed process with torch and the pipeline imported that forks one
confined child per job (`python -m inspector.zygote SOCKET_FD SECCOMP_FD`).

It never runs user code itself: it imports, learns what a first analysis imports (in a
throwaway child, on a built-in model), and then only forks. Each forked child confines
itself (`confine.py`) before it reads the upload; the worker watches it like a fresh child.
"""
