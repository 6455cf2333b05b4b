"""Architectures the project writes itself (used by presets when no library provides one)."""
