"""The service: a thin web layer (HTTP, persistence, queue, sandbox, pages) over `inspector`.

The web process never imports torch or user code: analysis runs in sandboxed children.
"""
