"""The `inspector` command: `inspect` runs the analysis here; the service commands
(`serve`, `worker`, `db upgrade`, `gc`, `token`) come from the `inspector.commands`
entry-point group (the server registers them); `submit` is the torch-free CI client.

Exit codes: 0 done, 2 the user's input was wrong (UserError, bad flags), 1 our bug.
Importing this module imports neither torch nor the server stack: `--help` stays fast and
`inspect` never pulls in fastapi or sqlalchemy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from inspector import __version__
from inspector.ci.submit import add_arguments as add_submit_arguments
from inspector.ci.submit import submit as run_submit
from inspector.errors import InputSpecError, UserError
from inspector.schema.options import (
    AUTOCAST_DTYPES,
    COMPILE_LEVELS,
    DEFAULT_COMPILE,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_EXPORT,
    DEFAULT_OPTIMIZER,
    DEVICES,
    EXPORT_LEVELS,
    OPTIMIZERS,
)
from inspector.units import parse_size

if TYPE_CHECKING:
    from rich.console import Console

    from inspector.context import Options
    from inspector.report import Report

__all__ = ["main", "build_parser", "read_input_arg"]

ALL_DEPTHS = sys.maxsize


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script exits with it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return args.func(args)
    except UserError as exc:
        _print_user_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `inspector inspect ... | head`: the reader left, not a bug
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        return 1
    except Exception:  # anything else is our bug: show it, exit 1
        print("internal error (a bug in the inspector, please report it):", file=sys.stderr)
        traceback.print_exc()
        return 1


def _print_user_error(exc: UserError) -> None:
    where = f"{exc.location}: " if exc.location and exc.location not in exc.message else ""
    print(f"error: {where}{exc.message}", file=sys.stderr)
    if exc.user_traceback:
        print(exc.user_traceback.rstrip(), file=sys.stderr)
    if exc.hint:
        print(f"hint: {exc.hint}", file=sys.stderr)


# -- the parser -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inspector",
        description="Shapes, memory and gradient health of PyTorch models.",
    )
    parser.add_argument("--version", action="version", version=f"inspector {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_inspect(commands)
    _add_submit(commands)
    _add_plugin_commands(commands)
    return parser


def _add_inspect(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "inspect",
        help="inspect a model here and print (or save) its report",
        description="Inspect MODEL: file.py:entry, a .pt2 or TorchScript file, preset:NAME, "
        "or a Hugging Face config.json.",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument(
        "--input",
        metavar="SPEC|FILE",
        help='input spec as JSON (\'{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 8}}\'), '
        "a .json file holding one, or a tensor file (.pt, .safetensors)",
    )
    p.add_argument("--device", choices=DEVICES, default=DEFAULT_DEVICE)
    p.add_argument("--fake", action="store_true", help="fake tensors: allocate no weights")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=DEFAULT_OPTIMIZER)
    p.add_argument(
        "--dtype", choices=AUTOCAST_DTYPES, default=DEFAULT_DTYPE, help="activation dtype"
    )
    p.add_argument(
        "--budget",
        action="append",
        type=_size,
        default=[],
        metavar="SIZE",
        help="a memory budget for the largest-batch figure (20GiB, 16GB); repeatable",
    )
    p.add_argument("--depth", type=_depth, metavar="N", help="module tree depth, or 'all'")
    p.add_argument("--json", metavar="PATH|-", help="write the report JSON ('-': stdout only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--passes", type=_passes, metavar="A,B", help="run only these passes")
    p.add_argument(
        "--no-measure",
        dest="measure",
        action="store_false",
        help="skip the real memory measurement (one extra training step)",
    )
    p.add_argument(
        "--export",
        choices=EXPORT_LEVELS,
        default=DEFAULT_EXPORT,
        help="export readiness: fast = torch.export non-strict (default); all adds strict "
        "torch.export, TorchScript script and trace (deprecated by torch) and ONNX (slower)",
    )
    p.add_argument(
        "--compile",
        choices=COMPILE_LEVELS,
        default=DEFAULT_COMPILE,
        help="torch.compile readiness (Dynamo, eager backend): fast = graph breaks and the "
        "first failed guard per named dim (default); all also counts every recompile "
        "(one more compile per named dim); none skips it",
    )
    p.add_argument(
        "--serving",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serving memory: KV cache per token, prefill/decode peaks, sequences per GPU "
        "(default: on for presets and configs of decoder language models)",
    )
    p.add_argument(
        "--parallel",
        action="append",
        type=_plan,
        default=[],
        metavar="STRATEGY:N",
        help="per-rank training memory on N ranks: ddp:4, zero1:4, zero2:4, fsdp:8, "
        "fsdp:8,reshard=false, fsdp:8,param_dtype=bf16, fsdp:8,checkpoint=true, "
        "fsdp:8,offload=true (CPU offload: GPU peak, host bytes apart), tp:8, "
        "tp:8,sp (sequence parallel), fsdp:8+tp:8 (2-D, 64 ranks); repeatable. The input "
        "is one rank's batch (a TP group's); the fewest GPUs per accelerator size come "
        "with each strategy",
    )
    p.add_argument(
        "--fit",
        type=_fit_budget,
        metavar="BUDGET",
        help="search the cheapest changes (bf16 autocast, checkpointing, accumulation, "
        "optimizer, bf16 parameters, FSDP) that bring the training-step peak under BUDGET "
        "(24GiB, 80GB), each plan verified on fake tensors",
    )
    p.add_argument(
        "--batch",
        type=_fit_batch,
        metavar="B",
        help="with --fit: the effective batch per optimizer step the plan keeps "
        "(default: the input's batch)",
    )
    p.add_argument(
        "--blocks",
        action="append",
        type=_blocks,
        default=[],
        metavar="PATTERNS",
        help="the model's blocks, for checkpointing advice, fit plans and FSDP/TP units: "
        "module classes or path globs, comma-separated (LlamaDecoderLayer, layers.*); "
        "default: the model's repeated layers",
    )
    p.set_defaults(func=_cmd_inspect)


def _fit_budget(text: str) -> int:
    from inspector.schema.options import OptionError, fit_budget

    try:
        return fit_budget(text)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _blocks(text: str) -> list[str]:
    from inspector.schema.options import OptionError, block_patterns

    try:
        return block_patterns(text)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fit_batch(text: str) -> int:
    from inspector.schema.options import OptionError, fit_batch

    try:
        return fit_batch(text)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _plan(text: str) -> str:
    from inspector.schema.options import OptionError
    from inspector.schema.parallel import parse_plan

    try:
        return parse_plan(text).text
    except OptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _depth(text: str) -> int:
    if text.lower() == "all":
        return ALL_DEPTHS
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a depth: {text!r} (a number >= 0, or 'all')")
    return int(text)


def _passes(text: str) -> set[str]:
    names = {name.strip() for name in text.split(",") if name.strip()}
    if not names:
        raise argparse.ArgumentTypeError("--passes needs at least one pass name")
    return names


# -- inspect ----------------------------------------------------------------------------


def _cmd_inspect(args: argparse.Namespace) -> int:
    to_stdout = args.json == "-"
    spec = read_input_arg(args.input)
    options = _options(args)
    report = _run_inspection(args.model, spec, options, quiet_stdout=to_stdout)
    if args.json:
        _write_json(report, args.json)
    console = _console(stderr=to_stdout)
    if console is not None:
        from inspector.render.terminal import render_terminal

        render_terminal(report, depth=args.depth, console=console)
        if args.json and not to_stdout:
            console.print(f"report written to {args.json}", highlight=False, markup=False)
    return 0


def read_input_arg(value: str | None) -> str | None:
    """--input as `inspect_model` takes it: JSON text, or a tensor file path (checked by
    the loader, which can suggest a spec for the model). A `.json` path is read here."""
    if value is None or not value.strip().lower().endswith(".json"):
        return value
    try:
        text = Path(value).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputSpecError(
            f"cannot read the input spec file {value}: {exc.strerror or exc}",
            hint='Give a spec file, or the spec itself: --input \'{"x": {"shape": [8, 16]}}\'',
        ) from None
    _check_json(text, value)
    return text


def _check_json(text: str, source: str) -> None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputSpecError(
            f"{source}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno}).",
        ) from None


def _options(args: argparse.Namespace) -> Options:
    from inspector.context import Options

    if args.passes is not None:
        _check_passes(args.passes)
    if args.batch is not None and args.fit is None:
        raise UserError(
            "--batch is the effective batch of a --fit plan, and no --fit was given.",
            hint="Add --fit BUDGET, e.g. --fit 24GiB --batch 64.",
        )
    return Options(
        device=args.device,
        fake=args.fake,
        optimizer=args.optimizer,
        dtype=args.dtype,
        budgets_bytes=list(args.budget),
        depth=args.depth,
        seed=args.seed,
        passes=args.passes,
        measure=args.measure,
        export=args.export,
        compile=args.compile,
        serving=args.serving,
        parallel=list(args.parallel),
        fit_bytes=args.fit,
        fit_batch=args.batch,
        blocks=[p for patterns in args.blocks for p in patterns],
    )


def _check_passes(names: set[str]) -> None:
    from inspector.passes import PASSES

    known = [name for name, _ in PASSES]
    unknown = sorted(names - set(known))
    if unknown:
        raise UserError(
            f"--passes: unknown pass {', '.join(unknown)}.",
            hint=f"The passes are: {', '.join(known)}.",
        )


def _pipeline() -> Callable[..., Report]:
    """`inspect_model`, imported only when needed (it imports torch)."""
    from inspector.analyze import inspect_model

    return inspect_model


def _run_inspection(model: str, spec: str | None, options: Options, quiet_stdout: bool) -> Report:
    inspect_model = _pipeline()
    with _progress() as progress, _stdout_to_stderr(quiet_stdout):
        return inspect_model(model, spec, options, progress)


@contextmanager
def _progress() -> Iterator[Callable[[str, int], None] | None]:
    """A transient progress bar on stderr, only when a person watches stderr."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<10}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("load", total=100)

        def update(stage: str, percent: int) -> None:
            bar.update(task, description=stage, completed=percent)

        yield update


@contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """Keep stdout clean for `--json -`: prints from the user's model (Python or C level)
    go to stderr while it runs."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _write_json(report: Report, target: str) -> None:
    text = report.to_json(indent=2) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write the report to {target}: {exc.strerror or exc}") from None


def _console(stderr: bool) -> Console | None:
    """Where the tables go: stdout; with `--json -`, stderr when a person watches it."""
    stream = sys.stderr if stderr else sys.stdout
    if stderr and not stream.isatty():
        return None
    from rich.console import Console

    # Piped output is not squeezed into 80 columns.
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(file=stream, width=width, highlight=False)


# -- commands other packages add -------------------------------------------------------


def _add_plugin_commands(commands: argparse._SubParsersAction) -> None:
    """Commands from the `inspector.commands` entry-point group (the server's `serve`,
    `worker`, `db`, `gc`, `token`): the CLI reaches them without naming their package."""
    for entry in entry_points(group="inspector.commands"):
        try:
            add_commands = entry.load()
        except ImportError:  # a CI box with the client alone: its commands still work
            continue
        add_commands(commands)


def _add_submit(commands: argparse._SubParsersAction) -> None:
    submit = commands.add_parser("submit", help="send a model to an inspector server (CI)")
    add_submit_arguments(submit)
    submit.set_defaults(func=run_submit)


if __name__ == "__main__":
    sys.exit(main())
