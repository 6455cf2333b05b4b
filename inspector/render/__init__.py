"""Renderers: they read a Report and display it (terminal tables, Markdown summary).

Imported lazily: `inspector.render.markdown` must stay importable without rich or torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["render_markdown", "render_terminal"]


def __getattr__(name: str) -> Any:
    if name == "render_terminal":
        from inspector.render.terminal import render_terminal

        return render_terminal
    if name == "render_markdown":
        from inspector.render.markdown import render_markdown

        return render_markdown
    raise AttributeError(f"module 'inspector.render' has no attribute {name!r}")
