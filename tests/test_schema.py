"""Each torch-free vocabulary of `inspector.schema` is tied to what the torch side does with
it: a choice the schema offers that the library cannot honour fails here, not in a job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.errors import InspectorError, UserError
from inspector.inputspec import DTYPES, TORCH_DTYPES
from inspector.memory.analysis import AUTOCAST_DTYPES as TORCH_AUTOCAST
from inspector.memory.optimizer import STATE_COPIES, make_optimizer, optimizer_state_bytes
from inspector.passes.export import TARGETS
from inspector.rules import RULES
from inspector.schema import options, statuses
from inspector.schema.figures import FIGURES, SUMMARY_FIGURES
from inspector.schema.findings import RULE_IDS, RULE_THEMES
from inspector.schema.inputspec import FLOAT_DTYPES, INT_RANGES, SPEC_DTYPES

MLP_SOURCE = """from torch import nn
def build():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
"""


@pytest.mark.parametrize("name", options.OPTIMIZERS)
def test_every_optimizer_has_state_rules_and_a_torch_optimizer(name: str) -> None:
    layer = nn.Linear(4, 3)  # 4 * 3 + 3 = 15 parameters
    optimizer = make_optimizer(name, list(layer.parameters()))
    assert (optimizer is None) == (name == "none")
    state = optimizer_state_bytes(list(layer.parameters()), name)
    # copies of the 15 float32 values (15 * 4 bytes each), plus for Adam a float32 step
    # scalar per parameter tensor (weight, bias: 2 * 4 bytes)
    steps = 2 * 4 if name in ("adam", "adamw") else 0
    assert sum(state.values()) == STATE_COPIES[name] * 15 * 4 + steps, state


def test_optimizer_tables_cover_exactly_the_schema_choices() -> None:
    assert set(STATE_COPIES) == set(options.OPTIMIZERS)
    assert options.DEFAULT_OPTIMIZER in options.OPTIMIZERS
    assert Options().optimizer == options.DEFAULT_OPTIMIZER


def test_every_autocast_dtype_has_a_torch_dtype() -> None:
    assert set(TORCH_AUTOCAST) == set(options.AUTOCAST_DTYPES)
    assert TORCH_AUTOCAST["bf16"] is torch.bfloat16 and TORCH_AUTOCAST["fp16"] is torch.float16
    assert Options().dtype == options.DEFAULT_DTYPE
    assert options.autocast_dtype("BFloat16") == "bf16"
    with pytest.raises(options.OptionError, match="use one of float32, bf16, fp16"):
        options.autocast_dtype("int8")


def test_spec_dtype_names_are_torch_dtypes_with_their_ranges() -> None:
    assert set(SPEC_DTYPES.values()) == set(TORCH_DTYPES)
    for name, dtype in TORCH_DTYPES.items():
        assert str(dtype) == f"torch.{name}"
        assert dtype.is_floating_point == (name in FLOAT_DTYPES)
        if name in INT_RANGES:
            info = torch.iinfo(dtype)
            assert INT_RANGES[name] == (info.min, info.max)
    assert set(DTYPES) == set(SPEC_DTYPES)


def test_export_levels_choose_targets() -> None:
    assert options.EXPORT_LEVELS == ("none", "fast", "all")
    assert Options().export == options.DEFAULT_EXPORT
    assert len(TARGETS) >= 4  # "all" tries every target; "fast" a subset (tests/test_export.py)


def test_statuses_cover_every_failure_kind_the_child_writes() -> None:
    assert UserError.kind in statuses.FAILURE_KINDS
    assert {"internal", "out_of_memory", "timed_out", "killed"} <= set(statuses.FAILURE_KINDS)
    assert set(statuses.STATUS_OF_KIND.values()) <= set(statuses.FINAL_STATUSES)
    assert set(statuses.JOB_STATUSES) == set(statuses.RUNNING_STATUSES) | set(
        statuses.FINAL_STATUSES
    )
    assert max(map(len, statuses.JOB_STATUSES)) <= 16  # server.models.Job.status is String(16)
    assert statuses.status_label("out_of_memory") == "out of memory"
    assert issubclass(UserError, InspectorError)


def test_every_figure_reads_a_real_report(tmp_path: Path) -> None:
    model = tmp_path / "mlp.py"
    model.write_text(MLP_SOURCE)
    spec = '{"input": {"shape": ["B", 16]}, "dims": {"B": 8}}'
    report = inspect_model(f"{model}:build", spec, Options(passes={"graph", "memory"}))
    values = {key: figure.read(report) for key, figure in FIGURES.items()}
    # MLP: Linear(16, 32) + Linear(32, 4) = 16*32+32 + 32*4+4 = 676 parameters
    assert values["params"] == values["trainable_params"] == 676
    assert values["param_bytes"] == 676 * 4
    assert values["grad_bytes"] == 676 * 4
    assert values["optimizer_bytes"] >= 2 * 676 * 4  # AdamW: two moments per parameter
    unset = [key for key, value in values.items() if value is None]
    # serving and compile: not asked
    assert unset == ["graph_break_count", "kv_bytes_per_token", "prefill_peak_bytes"], unset
    assert set(SUMMARY_FIGURES) <= set(FIGURES)
    assert FIGURES["train_peak_bytes"].of(report).endswith(("KiB", "MiB"))


def test_schema_imports_no_torch() -> None:
    code = (
        "import sys; import inspector.schema.options, inspector.schema.inputspec, "
        "inspector.schema.figures, inspector.schema.statuses, inspector.schema.presets; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_rule_themes_are_the_registrys_modules() -> None:
    """The public list of rule ids (and their themes) is exactly what the library registers."""
    registered = {
        theme: {r.id for r in RULES.values() if r.check.__module__ == f"inspector.rules.{theme}"}
        for theme in RULE_THEMES
    }
    assert registered == {theme: set(ids) for theme, ids in RULE_THEMES.items()}
    assert set(RULES) == RULE_IDS


def test_the_reports_severity_type_is_the_schemas() -> None:
    from typing import get_args

    from inspector.report import Severity
    from inspector.schema.findings import SEVERITIES

    assert get_args(Severity) == SEVERITIES
