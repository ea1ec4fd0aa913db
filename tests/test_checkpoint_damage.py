"""Damaged and hostile checkpoints, and errors while writing them: truncations and flipped bits
are refused naming the file, resuming falls back to the newest checkpoint that verifies, a
checkpoint that would run code when unpickled is refused, a full disk or an unwritable
directory stops training with the previous checkpoint intact."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import logging
import os
import pickle
import re
import stat
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt import atomic
from nmt.store import checkpoint as ckpt
from nmt.store.checkpoint import load_checkpoint, save_checkpoint, verify_checkpoint
from nmt.store.gate import CheckpointError
from nmt.train.loop import Checkpointer
from nmt.train.start import find_resume_checkpoint

from .helpers import REPO, run_in_process, tiny_run_overrides

QUICK = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
TRAILER = struct.Struct("<8sQ32s")  # the checkpoint trailer: magic, payload length, sha256


@pytest.fixture(scope="module")
def small_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 6-step run with checkpoints at steps 2, 4 and 6; returns its run dir."""
    threads = torch.get_num_threads()
    work = tmp_path_factory.mktemp("small_run")
    try:
        run_in_process(
            corpus, work, "run", "trainer.max_steps=6", "trainer.val_every=2",
            "trainer.keep_last=5", "trainer.precision=32", "trainer.val_sentences=4",
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return work / "outputs" / "runs" / "run"


def clone_run(src: Path, dst: Path) -> Path:
    """Copy a run directory, keeping hard links between its checkpoint files."""
    by_inode: dict[int, Path] = {}
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        inode = path.stat().st_ino
        if inode in by_inode:
            os.link(by_inode[inode], target)
        else:
            target.write_bytes(path.read_bytes())
            by_inode[inode] = target
    return dst


def truncate(path: Path, size: int) -> None:
    """Cut a file to ``size`` bytes (negative: that many bytes fewer), in place."""
    data = path.read_bytes()
    path.write_bytes(data[:size] if size >= 0 else data[: len(data) + size])


def flip_bit(path: Path, bit: int) -> None:
    """Invert one bit of a file, in place (keeps hard links pointing at the damaged file)."""
    with open(path, "r+b") as f:
        f.seek(bit // 8)
        byte = f.read(1)[0]
        f.seek(bit // 8)
        f.write(bytes([byte ^ (1 << (bit % 8))]))


def with_trailer(body: bytes) -> bytes:
    """Bytes with the trailer save_checkpoint writes: the checksum of ``body`` passes."""
    return body + TRAILER.pack(ckpt.MAGIC, len(body), hashlib.sha256(body).digest())


# --------------------------------------------------------------------------- 2. corrupt files


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: truncate(p, 0), "truncated"),
        (lambda p: truncate(p, 30), "truncated"),
        (lambda p: truncate(p, -1), "no valid trailer"),
        (lambda p: truncate(p, -TRAILER.size), "no valid trailer"),
        (lambda p: truncate(p, p.stat().st_size // 2), "no valid trailer"),
        (lambda p: flip_bit(p, 8 * 1000 + 3), "sha256 does not match"),
        (lambda p: flip_bit(p, 8 * (p.stat().st_size - 1)), "sha256 does not match"),
        (lambda p: flip_bit(p, 8 * (p.stat().st_size - 40)), "truncated or padded"),
        (lambda p: flip_bit(p, 8 * (p.stat().st_size - 48)), "no valid trailer"),
    ],
    ids=["empty", "30-bytes", "minus-1", "no-trailer", "half", "bit-body", "bit-digest",
         "bit-length", "bit-magic"],
)  # fmt: skip
def test_damaged_checkpoint_is_refused_naming_the_file(
    tmp_path: Path, damage: Callable[[Path], None], message: str
) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint({"w": torch.randn(40, 40), "step": 3}, path)
    damage(path)
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


@QUICK
@given(data=st.data())
def test_any_single_bit_flip_or_truncation_is_detected(tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / "c.pt"
    save_checkpoint({"w": torch.arange(50.0), "name": "x"}, path)
    size = path.stat().st_size
    if data.draw(st.booleans(), label="truncate"):
        truncate(path, data.draw(st.integers(0, size - 1), label="keep"))
    else:
        flip_bit(path, data.draw(st.integers(0, 8 * size - 1), label="bit"))
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        load_checkpoint(path)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_resume_falls_back_to_the_previous_good_checkpoint(
    small_run: Path, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    run = clone_run(small_run, tmp_path / "run")
    ckpts = run / "checkpoints"
    assert (ckpts / "last.pt").samefile(ckpts / "step_00000006.pt")  # a hard link
    if damage == "truncate":
        truncate(ckpts / "last.pt", -1000)
    else:
        flip_bit(ckpts / "last.pt", 8 * 5000)
    with pytest.raises(CheckpointError, match=re.escape(str(ckpts / "last.pt"))):
        load_checkpoint(ckpts / "last.pt")
    caplog.set_level(logging.WARNING, logger="nmt.train")
    chosen = find_resume_checkpoint(str(run), tmp_path / "outputs")
    assert chosen == ckpts / "step_00000004.pt"
    warning = caplog.text
    assert str(ckpts / "last.pt") in warning and str(chosen) in warning
    assert "falling back" in warning


def test_resumed_training_continues_from_the_fallback(
    small_run: Path, corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    threads_restored: None,
) -> None:  # fmt: skip
    run = clone_run(small_run, tmp_path / "outputs" / "runs" / "run")
    flip_bit(run / "checkpoints" / "last.pt", 8 * 7000 + 1)
    caplog.set_level(logging.INFO)
    result = run_in_process(
        corpus, tmp_path, "unused", "trainer.max_steps=8", "trainer.val_every=2",
        "trainer.keep_last=5", "trainer.precision=32", "trainer.val_sentences=4",
        f"trainer.resume={run}",
    )  # fmt: skip
    assert result["state"]["step"] == 8
    assert re.search(r"resuming from \S*step_00000004\.pt at step 4", caplog.text)
    assert "falling back" in caplog.text
    log_lines = (run / "train.log").read_text().splitlines()
    assert any("falling back" in line and "step_00000004.pt" in line for line in log_lines)
    assert any("is corrupted" in line and "last.pt" in line for line in log_lines)
    for step in (4, 6, 8):  # the damaged step 6 was written again
        verify_checkpoint(run / "checkpoints" / f"step_{step:08d}.pt")
    assert load_checkpoint(run / "checkpoints" / "last.pt")["state"]["step"] == 8


def test_no_good_checkpoint_left_is_an_error_listing_them(small_run: Path, tmp_path: Path) -> None:
    run = clone_run(small_run, tmp_path / "run")
    for path in (run / "checkpoints").glob("step_*.pt"):
        truncate(path, 100)
    with pytest.raises(CheckpointError, match="no usable checkpoint") as err:
        find_resume_checkpoint(str(run), tmp_path)
    for step in (2, 4, 6):
        assert f"step_{step:08d}.pt" in str(err.value)


def test_missing_last_uses_the_newest_step_file(small_run: Path, tmp_path: Path) -> None:
    run = clone_run(small_run, tmp_path / "run")
    (run / "checkpoints" / "last.pt").unlink()  # e.g. killed between step file and link
    assert find_resume_checkpoint(str(run), tmp_path) == run / "checkpoints/step_00000006.pt"


def test_a_damaged_last_falls_back_to_a_newer_resume_file_before_the_step_files(
    small_run: Path, tmp_path: Path
) -> None:
    run = clone_run(small_run, tmp_path / "run")
    ckpts = run / "checkpoints"
    resume = ckpts / "resume_00000007.pt"  # the clock's or a stop's, after step 6's validation
    payload = load_checkpoint(ckpts / "step_00000006.pt")
    payload["state"]["step"] = 7
    save_checkpoint(payload, resume)
    (ckpts / "last.pt").unlink()
    os.link(resume, ckpts / "last.pt")
    truncate(ckpts / "last.pt", -1000)  # the resume file is torn with it
    assert find_resume_checkpoint(str(run), tmp_path) == ckpts / "step_00000006.pt"
    save_checkpoint(payload, resume)  # a whole one again, no longer last.pt's file
    truncate(ckpts / "last.pt", 100)
    assert find_resume_checkpoint(str(run), tmp_path) == resume


def test_explicitly_named_damaged_file_is_not_replaced(small_run: Path, tmp_path: Path) -> None:
    run = clone_run(small_run, tmp_path / "run")
    named = run / "checkpoints" / "step_00000004.pt"
    flip_bit(named, 8 * 3000)
    with pytest.raises(CheckpointError, match=re.escape(str(named))):
        find_resume_checkpoint(str(named), tmp_path)


# --------------------------------------------------------------------------- 3. hostile pickles


class WritesMarker:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: Path, via: str) -> None:
        self.marker, self.via = marker, via

    def __reduce__(self) -> tuple:
        if self.via == "os.system":
            return (os.system, (f"touch '{self.marker}'",))
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def hostile_body(marker: Path, kind: str) -> bytes:
    """A torch.save zip (or a bare pickle) whose unpickling would run code."""
    evil = {"model": {"w": torch.zeros(2)}, "state": WritesMarker(marker, kind.split("+")[1])}
    if kind.startswith("pickle"):
        return pickle.dumps(evil, protocol=2)
    buf = io.BytesIO()
    torch.save(evil, buf)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["zip+os.system", "zip+exec", "pickle+exec"])
def test_checkpoint_that_would_run_code_is_refused(tmp_path: Path, kind: str) -> None:
    witness = tmp_path / "witness"
    unsafe_body = hostile_body(witness, kind)
    if kind.startswith("pickle"):
        pickle.loads(unsafe_body)
    else:
        torch.load(io.BytesIO(unsafe_body), weights_only=False)
    assert witness.exists()  # the payload really runs code when unpickled unsafely

    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    path.write_bytes(with_trailer(hostile_body(marker, kind)))
    verify_checkpoint(path)  # the checksum passes: only the safe loader stands in the way
    with pytest.raises(CheckpointError, match="could not be loaded safely") as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)
    assert not marker.exists()


# --------------------------------------------------------------------------- writing errors


class FullDisk:
    """Stands in for ``os`` inside nmt.atomic: file fsyncs fail with ENOSPC after a few."""

    def __init__(self, succeed: int) -> None:
        self.succeed = succeed

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def fsync(self, fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            if self.succeed <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.succeed -= 1
        os.fsync(fd)


def fill_disk_for_checkpoints(monkeypatch: pytest.MonkeyPatch, succeed: int) -> None:
    """Checkpoint writes (only those) see a disk that fills up after ``succeed`` file syncs."""
    disk, real = FullDisk(succeed), ckpt.atomic_file

    @contextlib.contextmanager
    def on_full_disk(path: Path) -> Iterator[BinaryIO]:
        with monkeypatch.context() as m:
            m.setattr(atomic, "os", disk)
            with real(path) as f:
                yield f

    monkeypatch.setattr(ckpt, "atomic_file", on_full_disk)


def test_full_disk_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path)
    before = path.read_bytes()
    fill_disk_for_checkpoints(monkeypatch, succeed=0)
    with pytest.raises(CheckpointError, match="No space left on device") as err:
        save_checkpoint({"step": 2, "w": torch.zeros(1000)}, path)
    assert str(path) in str(err.value) and "unchanged" in str(err.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_full_disk_during_training_stops_with_last_checkpoint_intact(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads_restored: None
) -> None:
    fill_disk_for_checkpoints(monkeypatch, succeed=1)
    with pytest.raises(CheckpointError, match=r"step_00000004\.pt: No space left") as err:
        run_in_process(
            corpus, tmp_path, "full", "trainer.max_steps=6", "trainer.val_every=2",
            "trainer.val_sentences=4",
        )  # fmt: skip
    ckpts = tmp_path / "outputs" / "runs" / "full" / "checkpoints"
    assert "previous checkpoint" in str(err.value)
    assert load_checkpoint(ckpts / "last.pt")["state"]["step"] == 2
    assert sorted(p.name for p in ckpts.iterdir()) == ["best.pt", "last.pt", "step_00000002.pt"]


def test_checkpoint_dir_under_a_regular_file_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    saver = Checkpointer(blocker / "checkpoints", keep_last=2)
    with pytest.raises(CheckpointError, match="could not write checkpoint") as err:
        saver.save({"state": {"step": 1}}, is_best=True)
    assert str(blocker / "checkpoints" / "step_00000001.pt") in str(err.value)


def test_unwritable_output_dir_fails_before_reading_data(corpus: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    overrides = tiny_run_overrides(corpus, tmp_path, "trainer.max_steps=2")
    overrides = [o for o in overrides if not o.startswith("outputs=")]
    proc = subprocess.run(
        [sys.executable, "-m", "nmt.train", *overrides, f"outputs={blocker / 'sub'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Not a directory" in proc.stderr and str(blocker / "sub") in proc.stderr
    assert not (tmp_path / "data").exists()


def test_checkpointer_sweeps_temporaries_and_keeps_the_newest(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    stale = [ckpts / ".step_00000009.pt.dead.tmp", ckpts / ".last.pt.tmp"]
    for p in stale:
        p.write_bytes(b"half a checkpoint")
    saver = Checkpointer(ckpts, keep_last=2)
    for step in (8, 9, 10, 100_000_000, 99_999_999):
        saver.save({"state": {"step": step}}, is_best=step == 9)
    assert not any(p.exists() for p in stale)
    names = sorted(p.name for p in ckpts.iterdir())
    assert names == ["best.pt", "last.pt", "step_100000000.pt", "step_99999999.pt"]
    assert load_checkpoint(ckpts / "best.pt")["state"]["step"] == 9
    assert load_checkpoint(ckpts / "last.pt")["state"]["step"] == 99_999_999
