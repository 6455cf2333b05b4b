"""Zip uploads are untrusted: refuse path tricks, links and bombs before anything unpacks them."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path, PurePosixPath

__all__ = ["ZipRefused", "check_zip", "safe_extract", "read_member"]

# A zip entry with a declared size this many times its compressed size is treated as a bomb.
MAX_RATIO = 200
_RATIO_MIN_BYTES = 1024 * 1024  # small entries may compress well without harm


class ZipRefused(ValueError):
    """The archive breaks a rule; the message says which entry and why."""


def check_zip(path: Path, max_files: int, max_bytes: int) -> list[zipfile.ZipInfo]:
    """Check every entry; returns the entries (files and directories) when all are safe."""
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ZipRefused(f"not a readable zip archive: {exc}") from exc
    if len(infos) > max_files:
        raise ZipRefused(f"the archive has {len(infos)} entries; the limit is {max_files}")
    total = 0
    for info in infos:
        _check_entry(info)
        total += info.file_size
        if total > max_bytes:
            raise ZipRefused(
                f"the archive unpacks to more than {max_bytes} bytes (the limit); "
                "upload only the source files the model needs"
            )
    return infos


def _check_entry(info: zipfile.ZipInfo) -> None:
    name = info.filename
    if not name or "\x00" in name:
        raise ZipRefused(f"entry {name!r}: empty or NUL in its name")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise ZipRefused(f"entry {name!r}: absolute paths are not allowed")
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        raise ZipRefused(f"entry {name!r}: '..' in a path is not allowed")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise ZipRefused(f"entry {name!r}: symbolic links are not allowed")
    if info.flag_bits & 0x1:
        raise ZipRefused(f"entry {name!r}: encrypted entries are not supported")
    packed = max(info.compress_size, 1)
    if info.file_size > _RATIO_MIN_BYTES and info.file_size / packed > MAX_RATIO:
        raise ZipRefused(
            f"entry {name!r}: declares {info.file_size} bytes from {info.compress_size} "
            f"compressed (ratio over {MAX_RATIO}): refused as a zip bomb"
        )


def read_member(path: Path, name: str, max_bytes: int) -> bytes:
    """One entry's bytes, reading at most `max_bytes` whatever the header claims."""
    with zipfile.ZipFile(path) as archive, archive.open(name) as member:
        data = member.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ZipRefused(f"entry {name!r} is larger than {max_bytes} bytes")
    return data


def safe_extract(path: Path, dest: Path, max_files: int = 2000, max_bytes: int = 500 << 20) -> None:
    """Extract after `check_zip`, writing only regular files and directories under `dest`,
    and counting real bytes written (headers can lie about sizes)."""
    infos = check_zip(path, max_files, max_bytes)
    dest = Path(dest).resolve()
    budget = max_bytes
    with zipfile.ZipFile(path) as archive:
        for info in infos:
            target = (dest / info.filename).resolve()
            if not target.is_relative_to(dest):
                raise ZipRefused(f"entry {info.filename!r} would land outside the target")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            budget -= _copy_bounded(archive, info, target, budget)


def _copy_bounded(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, budget: int
) -> int:
    written = 0
    with archive.open(info) as src, open(target, "wb") as out:
        while chunk := src.read(1 << 20):
            written += len(chunk)
            if written > budget:
                raise ZipRefused(f"entry {info.filename!r}: unpacks to more than allowed")
            out.write(chunk)
    return written
