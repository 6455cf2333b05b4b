"""Uploads are checked before anything is queued: size, kind, syntax, entrypoint, input
spec, tensor files, tags and options. Each refusal is 422/413 with a message and stores nothing."""

from __future__ import annotations

import io
import json
import struct
import zipfile

import pytest
from api_support import MLP_SOURCE, api_env, upload


@pytest.fixture
def env(tmp_path, monkeypatch):
    with api_env("sqlite", tmp_path, monkeypatch, max_upload_bytes=64 * 1024) as env:
        yield env


def refused(response, status: int = 422) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["message"]


def assert_nothing_stored(env) -> None:
    assert env.client.get("/api/v1/reports").json()["total"] == 0
    assert env.enqueued == []
    uploads = env.settings.data_dir / "uploads"
    assert not uploads.exists() or not any(uploads.rglob("*"))
    tmp = env.settings.data_dir / "tmp"
    assert not tmp.exists() or not any(tmp.iterdir())  # staged files cleaned up


def test_syntax_error_names_file_and_line(env):
    source = b"import torch\n\nclass Net(:\n    pass\n"
    message = refused(upload(env, source))
    assert message.startswith("model.py:3:11: syntax error")
    assert "class Net(:" in message
    assert_nothing_stored(env)


def test_unknown_entrypoint_lists_what_is_defined(env):
    message = refused(upload(env, data={"entrypoint": "model.py:make_model"}))
    assert "'make_model' not found in model.py (defined: Net, build)" in message
    assert "model.py:Net" in message


def test_entrypoint_forms(env):
    assert upload(env, data={"entrypoint": "build"}).status_code == 201  # file part optional
    assert upload(env, data={"entrypoint": "./model.py:Net"}).status_code == 201
    message = refused(upload(env, data={"entrypoint": "other.py:Net"}))
    assert "other.py" in message and "model.py:Net" in message
    assert "not a Python name" in refused(upload(env, data={"entrypoint": "model.py:Net()"}))
    assert "entrypoint is needed" in refused(upload(env, data={"entrypoint": ""}))


def test_entrypoint_bound_by_assignment_or_import(env):
    source = (
        MLP_SOURCE
        + b"\nAlias = Net\ntry:\n    from collections import OrderedDict as OD\n"
        + b"except ImportError:\n    pass\n"
    )
    for entry in ("Alias", "OD"):
        assert upload(env, source, data={"entrypoint": entry}).status_code == 201


def test_unsupported_kind(env):
    message = refused(upload(env, b"x", filename="model.pkl"))
    assert ".py" in message and ".pt2" in message


def test_path_in_filename_is_dropped(env):
    r = upload(env, filename="../../evil.py", data={"entrypoint": "evil.py:Net"})
    assert r.status_code == 201, r.text
    job = env.job(r.json()["slug"])
    assert (job.upload_filename, job.entrypoint) == ("evil.py", "evil.py:Net")


# The library's own messages (inspector.schema.inputspec is the one grammar).
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ('{"x": {"shape": [2, 8]', "not valid JSON"),
        ('{"x":\n  {"shape": [2, 8]]}', "at line 2, column"),
        ('"x"', "must be a JSON object or list, not a string"),
        ('{"x": [2, 8]}', 'x: [2, 8] is a list of numbers; a tensor is written {"shape": [2, 8]}'),
        ('{"x": {"shape": [2, -1]}}', "x: shape entry -1 must be a positive size"),
        ('{"x": {"shape": [-2, 8]}}', "x: shape entry -2 must be a positive size"),
        ('{"x": {"shape": [2, 8], "dtype": "float8"}}', 'x: unknown dtype "float8"'),
        ('{"x": {"shape": [2, 8], "dtype": "complex64"}}', 'x: unknown dtype "complex64"'),
        ('{"x": {"shape": ["2B", 8]}, "dims": {"B": 2}}', "x: shape entry '2B' is not a dim name"),
        ('{"x": {"shape": [2, 8]}, "dims": {"2B": 2}}', "dim name '2B' in \"dims\" is not a name"),
        ('{"x": {"shape": [2, 8], "dtpye": "int64"}}', "x: unknown key 'dtpye' in a tensor spec"),
        ('{"x": {"shape": ["B", 8]}}', "dim 'B' in the shape of x has no value"),
        ('{"x": {"shape": ["B", 8]}, "dims": {"B": 0}}', "dim 'B' in \"dims\" is 0"),
        ('[{"shape": [2, 8], "low": 5, "high": 1}]', '[0]: "low" (5) must be below "high" (1)'),
        ('[{"shape": [2], "dtype": "int8", "high": 1000}]', "do not fit int8"),
    ],
)  # fmt: skip
def test_bad_input_spec(env, spec, expected):
    message = refused(upload(env, data={"input": spec}))
    assert message.startswith("input spec: ") and expected in message, message
    assert_nothing_stored(env)


@pytest.mark.parametrize(
    "spec",
    [
        '{"x": {"shape": ["B", 8], "dtype": "torch.float32"}, "dims": {"B": 2}}',
        '[{"shape": [8, 16]}, {"shape": [8, 4], "dtype": "int64", "high": 10}]',
        '{"b": {"ids": {"shape": [2, 5], "dtype": "long", "high": 9}, "m": [{"shape": [2]}]}}',
        '{"dims": {"B": 4}}',
        '{"x": {"shape": [2, 8]}, "scale": 0.5}',  # a scalar is passed to forward as is
    ],
)
def test_good_input_specs(env, spec):
    assert upload(env, data={"input": spec}).status_code == 201


def _safetensors(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 64


def test_tensor_input_files(env):
    good = _safetensors({"x": {"dtype": "F32", "shape": [2, 8], "data_offsets": [0, 64]}})
    r = upload(env, data={"input": ""}, input_file=("x.safetensors", good))
    assert r.status_code == 201, r.text
    job = env.job(r.json()["slug"])
    assert (job.input_filename, job.input_spec) == ("x.safetensors", None)
    assert (
        env.settings.data_dir / "uploads" / job.input_sha256[:2] / job.input_sha256[2:]
    ).exists()
    assert "not a safetensors" in refused(
        upload(env, data={"input": ""}, input_file=("x.safetensors", b"junk-junk"))
    )
    assert ".safetensors" in refused(upload(env, data={"input": ""}, input_file=("x.pkl", b"data")))
    assert "not both" in refused(upload(env, input_file=("x.pt", b"PK..")))


def test_tags_and_options(env):
    assert "key=value" in refused(upload(env, data={"tags": "branch"}))
    assert "given twice" in refused(upload(env, data={"tags": "a=1,a=2"}))
    assert "optimizer 'lbfgs'" in refused(upload(env, data={"optimizer": "lbfgs"}))
    assert "dtype" in refused(upload(env, data={"dtype": "int8"}))
    assert "device" in refused(upload(env, data={"device": "tpu"}))
    assert "budget" in refused(upload(env, data={"budget": "lots"}))
    assert "compile 'max': use one of none, fast, all" in refused(
        upload(env, data={"compile": "max"})
    )
    r = upload(
        env, data={"dtype": "bfloat16", "fake": "true", "budget": "16GB, 80GiB", "device": "cpu"}
    )
    options = env.job(r.json()["slug"]).options
    assert options == {
        "optimizer": "adamw",
        "dtype": "bf16",
        "device": "cpu",
        "fake": True,
        "budgets_bytes": [16 * 10**9, 80 * 1024**3],
        "export": "fast",
        "compile": "fast",
        "serving": None,  # auto: the serving pass decides
    }


def test_file_over_the_limit_is_413(env):
    big = b"#" * (64 * 1024 + 1)  # one byte over max_upload_bytes; the body is under the slack
    message = refused(upload(env, big), 413)
    assert "larger than 65536 bytes" in message
    assert_nothing_stored(env)


def test_body_over_the_limit_is_413_before_parsing(env):
    huge = b"#" * (64 * 1024 + 2 * 1024 * 1024)  # past max_upload_bytes + 1 MiB of slack
    assert env.client.post("/api/v1/reports", files={"model": ("m.py", huge)}).status_code == 413
    # Without Content-Length (chunked), the bytes are counted as they arrive.
    boundary = "b0undary"
    body = (
        f"--{boundary}\r\n".encode()
        + b'Content-Disposition: form-data; name="model"; filename="m.py"\r\n\r\n'
        + huge
        + f"\r\n--{boundary}--\r\n".encode()
    )
    chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    r = env.client.post("/api/v1/reports", content=chunks, headers=headers)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    assert_nothing_stored(env)


def _zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_zip_package(env):
    package = _zip({"pkg/__init__.py": b"", "pkg/model.py": MLP_SOURCE, "README": b"hi"})
    r = upload(env, package, filename="pkg.zip", data={"entrypoint": "pkg/model.py:Net"})
    assert r.status_code == 201, r.text
    job = env.job(r.json()["slug"])
    assert (job.upload_kind, job.entrypoint, job.name) == (
        "zip",
        "pkg/model.py:Net",
        "pkg/model.py:Net",
    )
    message = refused(upload(env, package, filename="pkg.zip", data={"entrypoint": "model.py:Net"}))
    assert "pkg/__init__.py, pkg/model.py" in message
    bad = _zip({"pkg/model.py": b"def f(:\n"})
    message = refused(upload(env, bad, filename="pkg.zip", data={"entrypoint": "pkg/model.py:f"}))
    assert message.startswith("pkg/model.py:1:")


RELATIVE_MODEL = b"from torch import nn\n\nfrom .layers import Net\n"
NESTED_MODEL = b"from torch import nn\n\nfrom ..layers import Net\n"


def test_zip_package_with_relative_imports_needs_its_init(env):
    with_init = {
        "pkg/__init__.py": b"",
        "pkg/layers.py": MLP_SOURCE,
        "pkg/model.py": RELATIVE_MODEL,
    }
    r = upload(env, _zip(with_init), filename="pkg.zip", data={"entrypoint": "pkg/model.py:Net"})
    assert r.status_code == 201, r.text
    without = {k: v for k, v in with_init.items() if k != "pkg/__init__.py"}
    r = upload(env, _zip(without), filename="pkg.zip", data={"entrypoint": "pkg/model.py:Net"})
    assert refused(r) == (
        "pkg/model.py:3: `from .layers import Net` is a relative import, but pkg.zip has no "
        "pkg/__init__.py: add an empty pkg/__init__.py so pkg/model.py is imported as part of "
        "its package."
    )
    assert r.json()["error"]["detail"] == {
        "file": "pkg/model.py", "line": 3, "missing": ["pkg/__init__.py"]
    }  # fmt: skip


def test_nested_relative_import_needs_every_init_up_to_its_level(env):
    entries = {"pkg/sub/__init__.py": b"", "pkg/layers.py": MLP_SOURCE,
               "pkg/sub/model.py": NESTED_MODEL}  # fmt: skip
    data = {"entrypoint": "pkg/sub/model.py:Net"}
    message = refused(upload(env, _zip(entries), filename="pkg.zip", data=data))
    assert (
        "`from ..layers import Net` is a relative import, but pkg.zip has no pkg/__init__.py"
        in message
    )
    entries["pkg/__init__.py"] = b""
    assert upload(env, _zip(entries), filename="pkg.zip", data=data).status_code == 201


def test_single_file_with_a_relative_import_is_refused(env):
    message = refused(upload(env, RELATIVE_MODEL))
    assert message.startswith("model.py:3: `from .layers import Net` is a relative import")
    assert "Upload a .zip of the package folder" in message and "pkg/model.py:Net" in message
    assert_nothing_stored(env)


def test_pt2_archive(env):
    archive = _zip({"model/archive_format": b"pt2", "model/models/model.json": b"{}"})
    r = upload(env, archive, filename="net.pt2", data={"entrypoint": "", "input": ""})
    assert r.status_code == 201, r.text
    job = env.job(r.json()["slug"])
    assert (job.upload_kind, job.entrypoint, job.name) == ("pt2", "net.pt2", "net.pt2")
    message = refused(upload(env, b"not a zip", filename="net.pt2", data={"entrypoint": ""}))
    assert "not a readable zip" in message
