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
from pathlib import Path
from typing import Any

from inspector.ci.citags import ci_tags
from inspector.ci.client import InspectorClient, progress_printer
from inspector.ci.gates import (
    GATE_FIGURES,
    GateResult,
    check_budgets,
    check_drift,
    check_findings,
    check_increases,
    gate_figures,
    gates_markdown,
    gates_table,
    parse_increase,
    report_drift,
)
from inspector.ci.upload_source import resolve_input, resolve_model
from inspector.errors import UserError
from inspector.schema.figures import FIGURES
from inspector.schema.options import (
    AUTOCAST_DTYPES,
    COMPILE_LEVELS,
    DEVICES,
    OPTIMIZERS,
    SERVING_CHOICES,
)
from inspector.units import parse_size

__all__ = ["add_arguments", "submit", "SubmitError", "EXIT_OK", "EXIT_GATES", "EXIT_ERROR"]

EXIT_OK, EXIT_GATES, EXIT_ERROR = 0, 1, 2


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
    p.add_argument("--optimizer", choices=OPTIMIZERS)
    p.add_argument("--dtype", choices=AUTOCAST_DTYPES)
    p.add_argument("--device", choices=DEVICES)
    p.add_argument("--fake", action="store_true", help="fake tensors: no weights allocated")
    p.add_argument("--serving", choices=SERVING_CHOICES, help="serving memory (default auto)")
    p.add_argument("--compile", choices=COMPILE_LEVELS,
                   help="torch.compile readiness: none, fast (default), all")  # fmt: skip
    p.add_argument("--parallel", action="append", default=[], metavar="STRATEGY:N",
                   help="per-rank memory on N ranks (fsdp:8, ddp:4); repeatable")  # fmt: skip
    p.add_argument("--fit", metavar="BUDGET",
                   help="the cheapest verified changes that fit BUDGET (24GiB)")  # fmt: skip
    p.add_argument("--batch", metavar="B",
                   help="with --fit: the effective batch the plan keeps")  # fmt: skip
    p.add_argument(
        "--rerun",
        action="store_true",
        help="run it again even if a done report has the same bytes and options",
    )
    p.add_argument("--blocks", metavar="PATTERNS",
                   help="the model's blocks: module classes or path globs (layers.*)")  # fmt: skip


def _add_gates(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gates (exit 1 when one fails)")
    g.add_argument("--fail-on", choices=("error", "warning", "none"), default="error",
                   help="fail on findings of this severity or worse (default: error)")  # fmt: skip
    g.add_argument("--max-train-peak", type=_size, metavar="SIZE", help="e.g. 20GiB")
    g.add_argument("--max-forward-peak", type=_size, metavar="SIZE", help="e.g. 8GiB")
    g.add_argument("--max-params", type=_size, metavar="N", help="e.g. 7e9")
    g.add_argument("--max-flops", type=_size, metavar="N", help="forward FLOPs, e.g. 2e12")
    g.add_argument("--max-graph-breaks", type=_count, metavar="N",
                   help="torch.compile graph breaks on the sample, e.g. 0")  # fmt: skip
    g.add_argument(
        "--baseline",
        metavar="SLUG|tag:K=V",
        help="compare with this report, or the newest done one with that tag",
    )
    g.add_argument("--max-increase", action="append", default=[], type=_increase,
                   metavar="FIGURE=LIMIT",
                   help=f"vs the baseline, e.g. train_peak=10%% or params=1e6; figures: "
                   f"{', '.join(GATE_FIGURES)}; repeatable")  # fmt: skip
    g.add_argument("--fail-on-drift", action="store_true",
                   help="fail when the versions (torch, CUDA, transformers) or options "
                   "(dtype, optimizer, batch, device) differ from the baseline's "
                   "(default: a warning)")  # fmt: skip


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, e.g. 0")
    return int(text)


def _increase(text: str) -> Any:
    try:
        return parse_increase(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- the run ----------------------------------------------------------------------------


def submit(args: argparse.Namespace) -> int:
    """Upload, wait, gate, summarise; returns the exit status."""
    server = _server(args)
    token = args.token or os.environ.get("INSPECTOR_TOKEN") or None
    budgets = _budgets(args)
    _check_gate_flags(args, budgets)
    model, inputs = resolve_model(args.model), resolve_input(args.input)
    with InspectorClient(server, token) as client:
        baseline = _find_baseline(client, args.baseline) if args.baseline else None
        created = client.upload(model, inputs, _form(args))
        print(f"uploaded: {created['url']}", file=sys.stderr, flush=True)
        if created.get("reused_from"):
            print(f"note: same upload and options as report {created['reused_from']}: its "
                  "result is reused (--rerun runs it again)", file=sys.stderr)  # fmt: skip
        if not args.wait:
            print(created["url"])
            return EXIT_OK
        body = client.wait(created["slug"], args.timeout, progress_printer())
        if body["status"] != "done":
            return _failed(client, args, body)
        gates = _gates(args, body, baseline, budgets)
        _print_summary(body, baseline, gates, args.baseline)
        exit_code = EXIT_GATES if any(g.verdict == "fail" for g in gates) else EXIT_OK
        _write_outputs(client, args, body, baseline, gates, exit_code)
    return exit_code


def _server(args: argparse.Namespace) -> str:
    server = (args.server or "").strip()
    if not server.startswith(("http://", "https://")):
        raise SubmitError(
            f"--server {server!r}: give the server's URL" if server else "no server given",
            hint="Use --server https://inspector.example.com or set $INSPECTOR_SERVER.",
        )
    return server


def _budgets(args: argparse.Namespace) -> dict[str, float]:
    given = {
        "train_peak": args.max_train_peak,
        "forward_peak": args.max_forward_peak,
        "params": args.max_params,
        "flops": args.max_flops,
        "graph_breaks": args.max_graph_breaks,
    }
    return {name: limit for name, limit in given.items() if limit is not None}


def _check_gate_flags(args: argparse.Namespace, budgets: dict[str, float]) -> None:
    if args.max_increase and not args.baseline:
        raise SubmitError(
            "--max-increase needs a baseline to compare with",
            hint="Add --baseline SLUG or --baseline tag:branch=main.",
        )
    if not args.wait and (budgets or args.max_increase or args.markdown or args.json):
        raise SubmitError(
            "--no-wait cannot check gates or write results: the report is not done yet",
            hint="Drop --no-wait (waiting is the default).",
        )


def _form(args: argparse.Namespace) -> dict[str, Any]:
    tags = ci_tags(os.environ) if args.ci_tags else {}
    for item in args.tag:  # given by hand: they win over the CI variables
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SubmitError(f"--tag {item!r}: write tags as key=value, e.g. branch=main")
        tags[key.strip()] = value.strip()
    return {
        "name": args.name,
        "tags": [f"{k}={v}" for k, v in tags.items()],
        "optimizer": args.optimizer,
        "dtype": args.dtype,
        "device": args.device,
        "fake": "true" if args.fake else None,
        "serving": args.serving,
        "compile": args.compile,
        "parallel": args.parallel or None,
        "fit": args.fit,
        "fit_batch": args.batch,
        "blocks": args.blocks,
        "rerun": "true" if args.rerun else None,
    }


def _find_baseline(client: InspectorClient, spec: str) -> dict | None:
    """A slug, or `tag:K=V[,K=V]` (the newest done report with those tags; None if none)."""
    if spec.startswith("tag:"):
        tags = [t.strip() for t in spec[4:].split(",") if t.strip()]
        if not tags or not all("=" in t for t in tags):
            raise SubmitError(f"--baseline {spec!r}: write tag:key=value, e.g. tag:branch=main")
        found = client.newest_done(tags)
        if found is None:
            print(f"note: no done report tagged {', '.join(tags)} yet: relative gates are "
                  "skipped", file=sys.stderr)  # fmt: skip
            return None
        return client.report(found["slug"])  # the row has no report: its figures and set-up
    body = client.report(spec)
    if body["status"] != "done":
        raise SubmitError(f"baseline {spec!r} is {body['status']}, not done: pick another report")
    return body


def _gates(
    args: argparse.Namespace, body: dict, baseline: dict | None, budgets: dict[str, float]
) -> list[GateResult]:
    figures = gate_figures(body)
    gates = check_budgets(figures, budgets)
    if args.max_increase:
        old = gate_figures(baseline) if baseline is not None else None
        gates += check_increases(figures, old, args.max_increase)
    if baseline is not None:
        gates.append(check_drift(report_drift(body, baseline), args.fail_on_drift))
    findings = check_findings(figures, args.fail_on)
    return gates + ([findings] if findings else [])


# -- output -----------------------------------------------------------------------------

# The figures of the API's report row the summary prints.
_SUMMARY = tuple(
    FIGURES[key]
    for key in (
        "params",
        "flops_forward",
        "train_peak_bytes",
        "forward_peak_bytes",
        "graph_break_count",
    )
)


def _print_summary(
    body: dict, baseline: dict | None, gates: list[GateResult], baseline_spec: str | None
) -> None:
    print(f"Report {body['name']!r}: {body['url']}")
    figures = gate_figures(body)
    for figure in _SUMMARY:
        print(f"  {figure.label:<28} {figure.format(figures.get(figure.key))}")
    print(f"  {'Findings':<28} {body['findings_errors']} errors, "
          f"{body['findings_warnings']} warnings")  # fmt: skip
    if baseline is not None:
        print(f"Baseline {baseline['name']!r}: {baseline['url']}")
    elif baseline_spec:
        print(f"Baseline: none found for {baseline_spec}")
    if gates:
        print("\n" + gates_table(gates))
    failed = sum(g.verdict == "fail" for g in gates)
    print(f"\nResult: FAIL ({failed} of {len(gates)} gates failed)" if failed else "\nResult: pass")


def _failed(client: InspectorClient, args: argparse.Namespace, body: dict) -> int:
    """The job did not finish: show its error as the user's own, exit 2."""
    error = body.get("error") or {}
    stage = f" during {error['stage']}" if error.get("stage") else ""
    print(f"Report {body['name']!r}: {body['url']}", file=sys.stderr)
    print(f"error: the job {body['status']}{stage}: {error.get('message') or 'no message'}",
          file=sys.stderr)  # fmt: skip
    if error.get("traceback") and error.get("kind") != "internal":
        print(str(error["traceback"]).rstrip(), file=sys.stderr)
    _write_outputs(client, args, body, None, [], EXIT_ERROR)
    return EXIT_ERROR


def _write_outputs(
    client: InspectorClient,
    args: argparse.Namespace,
    body: dict,
    baseline: dict | None,
    gates: list[GateResult],
    exit_code: int,
) -> None:
    if args.markdown:
        _write(args.markdown, _markdown(client, body, baseline, gates))
    if args.json:
        _write(args.json, json.dumps(_result(body, baseline, gates, exit_code), indent=2) + "\n")


def _markdown(
    client: InspectorClient, body: dict, baseline: dict | None, gates: list[GateResult]
) -> str:
    if body["status"] == "done":
        text = client.markdown(body["slug"], baseline["slug"] if baseline else None)
    else:
        text = _failure_markdown(body)
    extra = [gates_markdown(gates)] if gates else []
    if baseline is not None:
        extra.append(f"Baseline: [{baseline['slug']}]({baseline['url']})")
    return "\n\n".join([text.rstrip("\n"), *extra]) + "\n"


def _failure_markdown(body: dict) -> str:
    from inspector.render.markdown import escape_markdown

    error = body.get("error") or {}
    return (
        f"### Model Graph Inspector: {escape_markdown(body['name'])}\n\n"
        f"**{escape_markdown(body['status'])}**: {escape_markdown(error.get('message') or '')}"
        f"\n\n[Full report]({body['url']})\n"
    )


def _result(body: dict, baseline: dict | None, gates: list[GateResult], exit_code: int) -> dict:
    keep = ("slug", "name", "status", "url", "api_url", "tags", "error", "report")
    figures = gate_figures(body)
    return {
        **{k: body.get(k) for k in keep},
        "figures": {figure.key: figures.get(figure.key) for figure in _SUMMARY},
        "baseline": {k: baseline.get(k) for k in ("slug", "name", "url")} if baseline else None,
        "gates": [g.to_dict() for g in gates],
        "passed": exit_code == EXIT_OK,
        "exit_code": exit_code,
    }


def _write(target: str, text: str) -> None:
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SubmitError(f"cannot write {target}: {exc.strerror or exc}") from None
