"""Hostile: crashes the interpreter."""

import ctypes

ctypes.string_at(0)  # line 5
