"""Hostile: prints 20 MB to stdout, then carries on as a normal model."""

import sys

for _ in range(200):
    sys.stdout.write("x" * 100_000)
