"""The CI examples in docs/ci/ parse as YAML, and every `inspector submit` command in them
is accepted by the real argument parser (the same flags the end-to-end tests run)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from inspector.cli import build_parser

DOCS = Path(__file__).resolve().parent.parent / "docs" / "ci"
FAKE_VALUES = {"github.base_ref": "main"}


def _scripts(node) -> list[str]:
    """Every string under `run:` / `script:` keys, anywhere in the document."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("run", "script", "before_script"):
                found += (
                    [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)]
                )
            else:
                found += _scripts(value)
    elif isinstance(node, list):
        for item in node:
            found += _scripts(item)
    return found


def _submit_commands(text: str) -> list[list[str]]:
    text = re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: FAKE_VALUES.get(m[1], "x"), text)
    text = re.sub(r"\$\{?(\w+)\}?", "main", text)  # shell variables
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line.split(" || ")[0]) if "inspector submit" in line else []
        if words[:2] == ["inspector", "submit"]:
            commands.append(words[1:])
    return commands


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml"])
def test_ci_example_parses_and_its_commands_are_valid(name):
    document = yaml.safe_load((DOCS / name).read_text())
    commands = [c for script in _scripts(document) for c in _submit_commands(script)]
    assert len(commands) == 2  # the baseline run and the gated pull/merge request
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)  # SystemExit (a test error) on an unknown flag
        assert args.max_train_peak == 20 * 1024**3 and args.max_params == 7 * 10**9
    gated = parser.parse_args(commands[1])
    assert gated.baseline == "tag:branch=main" and gated.markdown == "inspector.md"
    assert [(i.figure, i.amount, i.percent) for i in gated.max_increase] == [
        ("train_peak", 10.0, True), ("params", 5.0, True),
    ]  # fmt: skip


def test_github_workflow_posts_the_comment_even_when_the_gate_fails():
    steps = yaml.safe_load((DOCS / "github-actions.yml").read_text())["jobs"]["inspect"]["steps"]
    post = next(s for s in steps if "gh pr comment" in s.get("run", ""))
    assert post["if"].startswith("always()")
