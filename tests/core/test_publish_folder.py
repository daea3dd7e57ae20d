"""Model folders (GGUF conversions, adapter merges, 16-bit copies) appear whole or not at all."""

import pytest

from turborag.core.model import publish_folder


def test_a_written_folder_is_renamed_into_place(tmp_path):
    out = tmp_path / "models" / "merged-x"
    publish_folder(out, lambda tmp: (tmp.mkdir(parents=True), (tmp / "config.json").write_text("{}")))
    assert (out / "config.json").read_text() == "{}"
    assert [p.name for p in out.parent.iterdir()] == ["merged-x"]


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    """A full disk mid-save: the error reaches the caller, and the half-written temp folder is removed (each
    failed attempt used to leave ~1 GB behind, which fills the disk further)."""
    out = tmp_path / "merged-x"

    def write(tmp):
        tmp.mkdir()
        (tmp / "model.safetensors").write_bytes(b"\0" * 1024)
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        publish_folder(out, write)
    assert list(tmp_path.iterdir()) == []
