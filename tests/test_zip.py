"""Zip uploads: path tricks, links, too many files and bombs are refused (422 through the API,
ZipRefused in `server.ziputil`); `safe_extract` writes only inside its target."""

from __future__ import annotations

import io
import stat
import struct
import zipfile

import pytest
from api_support import MLP_SOURCE, api_env, upload

from server.ziputil import ZipRefused, check_zip, safe_extract

MiB = 1024**2


def make_zip(entries: list[tuple[str | zipfile.ZipInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return buffer.getvalue()


def symlink_entry(name: str, target: str) -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16  # how `zip -y` stores a link
    return info, target.encode()


def declared_size(data: bytes, name: str, size: int) -> bytes:
    """Rewrite one entry's uncompressed size in the central directory (a lying header)."""
    out = bytearray(data)
    at = out.find(b"PK\x01\x02")
    while at != -1:
        (length,) = struct.unpack("<H", out[at + 28 : at + 30])  # file name length
        if out[at + 46 : at + 46 + length] == name.encode():
            out[at + 24 : at + 28] = struct.pack("<I", size)  # uncompressed size
        at = out.find(b"PK\x01\x02", at + 4)
    return bytes(out)


PKG = [("pkg/__init__.py", b""), ("pkg/model.py", MLP_SOURCE)]
CASES = {
    "dotdot": (make_zip([*PKG, ("pkg/../../evil.py", b"x")]), "'..' in a path"),
    "absolute": (make_zip([*PKG, ("/etc/cron.d/evil", b"x")]), "absolute paths"),
    "symlink": (make_zip([*PKG, symlink_entry("pkg/data", "/etc/passwd")]), "symbolic links"),
    "too_many": (
        make_zip([*PKG] + [(f"pkg/f{i}.txt", b"") for i in range(30)]),
        "entries; the limit is 20",
    ),
    # 1 GB of zeros declared by a 1 KB archive
    "bomb_declared": (
        declared_size(make_zip([*PKG, ("pkg/zeros.bin", b"\0" * 1024)]), "pkg/zeros.bin", 10**9),
        "'pkg/zeros.bin': declares 1000000000 bytes",
    ),
    # 50 MiB of real zeros deflate to ~50 KB: a ratio near 1000, under the total limit
    "bomb_ratio": (make_zip([*PKG, ("pkg/zeros.bin", b"\0" * (50 * MiB))]), "zip bomb"),
}


@pytest.fixture
def env(tmp_path, monkeypatch):
    overrides = {"max_zip_files": 20, "max_zip_uncompressed_bytes": 100 * MiB}
    with api_env("sqlite", tmp_path, monkeypatch, **overrides) as env:
        yield env


@pytest.mark.parametrize("case", list(CASES))
def test_refused_through_the_api(env, case):
    data, expected = CASES[case]
    r = upload(env, data, filename="pkg.zip", data={"entrypoint": "pkg/model.py:Net"})
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("pkg.zip: zip refused:") and expected in message, message
    assert env.client.get("/api/v1/reports").json()["total"] == 0


def test_same_archive_without_the_bad_entry_is_accepted(env):
    r = upload(env, make_zip(PKG), filename="pkg.zip", data={"entrypoint": "pkg/model.py:Net"})
    assert r.status_code == 201, r.text


def test_bomb_in_a_pt2_is_refused(env):
    data, _ = CASES["bomb_ratio"]
    r = upload(env, data, filename="net.pt2", data={"entrypoint": ""})
    assert r.status_code == 422 and ".pt2 archive" in r.json()["error"]["message"]


def test_check_zip_directly(tmp_path):
    path = tmp_path / "a.zip"
    for case, (data, expected) in CASES.items():
        path.write_bytes(data)
        with pytest.raises(ZipRefused) as info:
            check_zip(path, max_files=20, max_bytes=100 * MiB)
        assert expected in str(info.value), case
    path.write_bytes(make_zip(PKG))
    check_zip(path, max_files=2, max_bytes=len(MLP_SOURCE))  # exactly at both limits
    with pytest.raises(ZipRefused, match="unpacks to more than"):
        check_zip(path, max_files=2, max_bytes=len(MLP_SOURCE) - 1)
    path.write_bytes(b"PK\x03\x04 broken")
    with pytest.raises(ZipRefused, match="not a readable zip"):
        check_zip(path, 20, MiB)


def test_safe_extract(tmp_path):
    path = tmp_path / "pkg.zip"
    path.write_bytes(make_zip(PKG))
    dest = tmp_path / "out"
    safe_extract(path, dest)
    assert (dest / "pkg" / "model.py").read_bytes() == MLP_SOURCE
    path.write_bytes(CASES["dotdot"][0])
    with pytest.raises(ZipRefused):
        safe_extract(path, tmp_path / "out2")
    assert not (tmp_path / "evil.py").exists()


def test_a_package_zipped_by_submit_loads_as_a_package_once_extracted(tmp_path):
    """`inspector submit mypkg:model.py:Net` zips the folder; the worker extracts it into
    the job's upload/ and the child loads upload/mypkg/model.py:Net."""
    from inspector.ci.upload_source import resolve_model
    from inspector.loaders.load import load_model
    from inspector.loaders.userimports import forget_user_modules

    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text(MLP_SOURCE.decode())
    (pkg / "model.py").write_text("from .layers import Net as Base\nfrom mypkg.layers import Net\n")
    zipped = resolve_model(f"{pkg}:model.py:Net")
    (tmp_path / "up.zip").write_bytes(zipped.data)
    safe_extract(tmp_path / "up.zip", tmp_path / "job" / "upload")
    try:
        loaded = load_model(f"{tmp_path / 'job' / 'upload'}/{zipped.entrypoint}")
        # Linear(8, 16) + Linear(16, 4): 8 * 16 + 16 + 16 * 4 + 4 = 144 + 68 = 212
        assert sum(p.numel() for p in loaded.model.parameters()) == 212
        assert type(loaded.model).__module__ == "mypkg.layers"
    finally:
        forget_user_modules()
