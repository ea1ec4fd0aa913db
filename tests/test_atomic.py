"""One atomic, durable writer for every file that must not be torn (nmt.atomic)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nmt import atomic
from nmt.data.corpus import fetch_multi30k
from nmt.environment import Multi30kSource
from nmt.store.checkpoint import load_checkpoint, save_checkpoint


class FsyncLog:
    """Records what each ``os.fsync`` in nmt.atomic synced: a file's inode or a directory's."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int]] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            st = os.fstat(fd)
            self.calls.append(("dir" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
            real(fd)

        monkeypatch.setattr(atomic.os, "fsync", fsync)

    def synced(self, path: Path) -> bool:
        """The file's data was synced, then the directory holding its new name."""
        file_call = ("file", path.stat().st_ino)
        dir_call = ("dir", path.parent.stat().st_ino)
        return (
            file_call in self.calls
            and dir_call in self.calls
            and self.calls.index(file_call) < self.calls.index(dir_call)
        )


def test_write_syncs_the_file_then_its_directory(tmp_path: Path, monkeypatch) -> None:
    log = FsyncLog(monkeypatch)
    target = tmp_path / "sub" / "manifest.json"
    atomic.atomic_write_bytes(target, b"{}")
    assert target.read_bytes() == b"{}"
    assert log.synced(target)


def test_checkpoints_and_downloads_share_the_durable_writer(
    tmp_path: Path, monkeypatch, multi30k: Path
) -> None:
    log = FsyncLog(monkeypatch)
    ckpt = tmp_path / "run" / "step_1.pt"
    save_checkpoint({"state": {"step": 1}}, ckpt)
    assert load_checkpoint(ckpt)["state"]["step"] == 1
    source = Multi30kSource(mirror=multi30k)
    got = fetch_multi30k(tmp_path / "data", ["de"], ["val"], source) / "val.de.gz"
    assert log.synced(ckpt) and log.synced(got)


def test_new_file_gets_the_umask_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        atomic.atomic_write_bytes(tmp_path / "spm.model", b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "spm.model").stat().st_mode) == 0o644


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "package.json"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk gone"), atomic.atomic_file(target) as f:
        f.write(b"half of the new")
        raise RuntimeError("disk gone")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["package.json"]
