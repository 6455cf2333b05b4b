"""`--blocks`: the user names the blocks that checkpointing, fit plans and FSDP's units
take, by module class or path glob. Byte counts by hand on the 4-block MLP of
tests/test_distributed.py: each block Linear(256, 1024) + ReLU + Linear(1024, 256)."""

from __future__ import annotations

import json

import pytest
import torch
from test_distributed import fake, mlp  # noqa: F401 - the shared fixture

from inspector import cli
from inspector.distributed.fsdp import fsdp_rank_memory, shard_units
from inspector.errors import UserError
from inspector.memory.advice import blocks
from inspector.memory.namedblocks import match_blocks, named_blocks
from inspector.schema.options import OptionError, block_patterns
from inspector.schema.parallel import parse_plan
from server.api.errors import ApiError
from server.api.formfields import parse_options


def _paths(model: torch.nn.Module) -> list[str]:
    return [path for path, _ in blocks(model)]


def test_patterns_name_classes_and_path_globs() -> None:
    model = mlp()
    assert _paths(model) == ["0", "1", "2", "3"]  # the model's own: its repeated layers
    with named_blocks(("Linear",)):
        assert _paths(model) == ["0.0", "0.2", "1.0", "1.2", "2.0", "2.2", "3.0", "3.2"]
    with named_blocks(("torch.nn.modules.linear.Linear",)):
        assert len(_paths(model)) == 8  # the qualified class name works too
    with named_blocks(("[02]",)):
        assert _paths(model) == ["0", "2"]
    with named_blocks(("0", "0.*", "3")):  # a match inside a block is part of it
        assert _paths(model) == ["0", "3"]
    with named_blocks(("Sequential",)):  # the model itself is the root, never a block
        assert _paths(model) == ["0", "1", "2", "3"]
    assert _paths(model) == ["0", "1", "2", "3"]  # the names last as long as the block


def test_a_pattern_that_matches_nothing_says_what_the_model_has() -> None:
    with pytest.raises(UserError) as caught:
        match_blocks(mlp(), ("Linear", "layers.*"))
    text = str(caught.value)
    assert "--blocks layers.*: no module of the model matches" in text
    assert "Repeated classes: Sequential" in text and "Top-level modules: 0, 1, 2, 3" in text


def test_parsing_on_every_front_end() -> None:
    assert block_patterns(" LlamaDecoderLayer, layers.* ,") == ["LlamaDecoderLayer", "layers.*"]
    assert block_patterns(["a", "b,c"]) == ["a", "b", "c"]
    for bad in (",", " ", "x" * 201):
        with pytest.raises(OptionError):
            block_patterns(bad)
    form = {"optimizer": "adamw", "dtype": "float32", "device": None, "fake": True,
            "budget": None, "default_device": "cpu"}  # fmt: skip
    assert parse_options(**form, blocks="Block, head")["blocks"] == ["Block", "head"]
    assert "blocks" not in parse_options(**form, blocks="  ")  # absent when none
    with pytest.raises(ApiError):
        parse_options(**form, blocks=" , ")


def test_fsdp_wraps_the_named_blocks(fake) -> None:  # noqa: F811 - the fixture
    model, inputs, opts = fake
    with named_blocks(("Linear",)):
        assert len(shard_units(model)) == 8
        m = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:2"))
    assert m.units == 9  # 8 Linear units + the root
    # the largest unit is now one Linear(256, 1024): (256 * 1024 + 1024) * 4 B gathered
    # plus its reduce-scatter input, not a whole block's 2 x 2,102,272 B
    assert m.comm_bytes == 2 * (256 * 1024 + 1024) * 4  # 2,105,344
    assert m.param_bytes == 2_102_272 * 4 // 2  # sharding itself does not change


def test_cli_blocks_reach_the_report(tmp_path, capsys) -> None:
    (tmp_path / "m.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def make():\n    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 32), nn.ReLU(),"
        " nn.Linear(32, 8)) for _ in range(2)])\n"
        "def example_inputs():\n    return torch.randn(4, 8)\n"
    )
    entry = str(tmp_path / "m.py:make")
    assert cli.main(["inspect", entry, "--fake", "--blocks", "layers.*"]) == 2
    assert "--blocks layers.*: no module of the model matches" in capsys.readouterr().err
    out = tmp_path / "r.json"
    argv = ["inspect", entry, "--fake", "--passes", "graph,memory,distributed",
            "--parallel", "fsdp:2", "--blocks", "Linear", "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["memory"]["blocks"] == ["0.0", "0.2", "1.0", "1.2"]
    assert report["memory"]["named_blocks"] == ["Linear"]
    assert report["meta"]["options"]["blocks"] == ["Linear"]
    plan = report["distributed"]["plans"][0]
    assert plan["units"] == 5
    # the largest unit: Linear(8, 32), (8 * 32 + 32) * 4 = 1,152 B, gathered and reduced
    assert plan["comm_bytes"] == 2 * 1_152
    assert "4 named by Linear: 0.0 ... 1.2" in capsys.readouterr().out


def test_blocks_through_the_api_submit_and_page(tmp_path, monkeypatch) -> None:
    from api_support import api_env, upload
    from fastapi.testclient import TestClient
    from pages_data import small_report
    from pages_server import insert_job, make_settings

    from inspector.ci.submit import _form
    from inspector.cli import build_parser
    from server.app import create_app
    from server.db import make_engine, make_session_factory

    args = build_parser().parse_args(
        ["submit", "model.py:Net", "--server", "http://x", "--blocks", "Block,head"]
    )
    assert _form(args)["blocks"] == "Block,head"
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        response = upload(env, data={"blocks": _form(args)["blocks"]})
        assert response.status_code == 201, response.text
        assert env.job(response.json()["slug"]).options["blocks"] == ["Block", "head"]
        refused = upload(env, data={"blocks": ","})
        assert refused.status_code == 422 and "path globs" in refused.text
    report = small_report(name="named")
    report.memory.blocks, report.memory.named_blocks = ["h.0", "h.1", "h.2"], ["h.*"]
    settings = make_settings(tmp_path / "pages")
    factory = make_session_factory(make_engine(settings.database_url))
    with TestClient(create_app(settings)) as client:
        html = client.get(f"/r/{insert_job(factory, report, name='n')}").text
    row = html.split("<th>Blocks</th>", 1)[1].split("</tr>", 1)[0]
    assert ">3 <" in row and "named: <code>h.*</code>" in row and "<code>h.2</code>" in row
