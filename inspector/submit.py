"""`inspector submit`: upload a model to an inspector server, wait, check gates (CI).

Exit status: 0 done and every gate passed; 1 a gate failed; 2 an error (bad model or
input, the job failed, the server refused or could not be reached, a timeout).
Torch-free: this runs on CI machines that only need `pip install` and httpx.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from inspector.citags import ci_tags
from inspector.errors import UserError
from inspector.gates import (
    FIGURES,
    GateResult,
    check_budgets,
    check_findings,
    check_increases,
    gates_markdown,
    gates_table,
    parse_increase,
)
from inspector.units import format_bytes, format_count, parse_size
from inspector.upload_source import InputUpload, ModelUpload, resolve_input, resolve_model

__all__ = ["add_arguments", "submit", "SubmitError", "EXIT_OK", "EXIT_GATES", "EXIT_ERROR"]

EXIT_OK, EXIT_GATES, EXIT_ERROR = 0, 1, 2
FINAL = ("done", "failed", "timed_out", "out_of_memory", "killed")


class SubmitError(UserError):
    """Anything that stops a submission: the message says what, the hint what to do."""


# -- flags ------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `inspector submit` (cli.py builds the sub-parser, we fill it)."""
    p.description = (
        "Upload MODEL (file.py:Entry, DIR:pkg/model.py:Entry, archive.zip:pkg/model.py:Entry "
        "or model.pt2) to an inspector server, wait for the report and check the gates. "
        "Exit 0: passed; 1: a gate failed; 2: error."
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--input", metavar="SPEC|FILE", help="input spec JSON, a .json file or tensors")
    p.add_argument("--server", default=os.environ.get("INSPECTOR_SERVER"), metavar="URL",
                   help="the server (default: $INSPECTOR_SERVER)")  # fmt: skip
    p.add_argument("--token", default=None, help="API token (default: $INSPECTOR_TOKEN)")
    p.add_argument("--name", help="report name (default: the entrypoint)")
    p.add_argument("--tag", action="append", default=[], metavar="K=V", help="repeatable")
    p.add_argument("--no-ci-tags", dest="ci_tags", action="store_false",
                   help="do not add commit/branch/pr/ci_job tags from CI variables")  # fmt: skip
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--wait", dest="wait", action="store_true", default=True,
                      help="wait for the report and check the gates (default)")  # fmt: skip
    wait.add_argument("--no-wait", dest="wait", action="store_false", help="upload and exit")
    p.add_argument("--timeout", type=float, default=900, metavar="S", help="wait at most S s")
    _add_analysis(p)
    _add_gates(p)
    p.add_argument("--markdown", metavar="PATH", help="write the Markdown summary (PR comment)")
    p.add_argument("--json", metavar="PATH", help="write the result (report, gates) as JSON")


def _add_analysis(p: argparse.ArgumentParser) -> None:
    p.add_argument("--optimizer", choices=("none", "sgd", "momentum", "adam", "adamw"))
    p.add_argument("--dtype", choices=("float32", "bf16", "fp16"))
    p.add_argument("--device", choices=("auto", "cpu", "cuda"))
    p.add_argument("--fake", action="store_true", help="fake tensors: no weights allocated")


def _add_gates(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gates (exit 1 when one fails)")
    g.add_argument("--fail-on", choices=("error", "warning", "none"), default="error",
                   help="fail on findings of this severity or worse (default: error)")  # fmt: skip
    g.add_argument("--max-train-peak", type=_size, metavar="SIZE", help="e.g. 20GiB")
    g.add_argument("--max-forward-peak", type=_size, metavar="SIZE", help="e.g. 8GiB")
    g.add_argument("--max-params", type=_size, metavar="N", help="e.g. 7e9")
    g.add_argument("--max-flops", type=_size, metavar="N", help="forward FLOPs, e.g. 2e12")
    g.add_argument("--baseline", metavar="SLUG|tag:K=V",
                   help="compare with this report, or the newest done one with that tag")  # fmt: skip
    g.add_argument("--max-increase", action="append", default=[], type=_increase,
                   metavar="FIGURE=LIMIT",
                   help=f"vs the baseline, e.g. train_peak=10%% or params=1e6; figures: "
                   f"{', '.join(FIGURES)}; repeatable")  # fmt: skip


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _increase(text: str) -> Any:
    try:
        return parse_increase(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
