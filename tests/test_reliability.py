"""Reliability and security: crashes, corrupt or hostile checkpoints, bad downloads, hostile
corpora, impossible configs, and bounded memory when decoding.

The fault-injection test SIGKILLs a real training process at seeded random moments (one of them
in the middle of a checkpoint write), resumes it each time, and requires the final weights to
equal those of an uninterrupted run bit for bit.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import http.server
import io
import logging
import os
import pickle
import random
import re
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from nmt import atomic
from nmt.atomic import sha256_file
from nmt.config import ConfigError, TransformerConfig
from nmt.data import corpus
from nmt.data.batching import TokenDataset, make_batch
from nmt.data.corpus import (
    DataError,
    clean_pairs,
    fetch_multi30k,
    read_parallel,
)
from nmt.data.tokenizer import PAD_ID
from nmt.decode import search as search_mod
from nmt.decode.options import DecodeOptions
from nmt.decode.search import decode_dataset
from nmt.environment import Multi30kSource
from nmt.models.registry import create_model
from nmt.store import checkpoint as ckpt
from nmt.store.checkpoint import load_checkpoint, save_checkpoint, verify_checkpoint
from nmt.store.gate import CheckpointError
from nmt.train.command import train
from nmt.train.loop import Checkpointer
from nmt.train.start import find_resume_checkpoint

from .helpers import REPO, compose_config, tiny_run_overrides, write_subset

QUICK = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
TRAILER = struct.Struct("<8sQ32s")  # the checkpoint trailer: magic, payload length, sha256


# --------------------------------------------------------------------------- shared helpers


@pytest.fixture(scope="module")
def corpus_prefix(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 real Multi30k training pairs as plain files."""
    return write_subset(multi30k, tmp_path_factory.mktemp("corpus"), "train", 120)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """In-process training sets torch's thread count; put it back afterwards."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run_in_process(prefix: Path, work: Path, name: str, *extra: str) -> dict[str, Any]:
    """A seconds-long training run in this process; returns train()'s result."""
    cfg = compose_config("train", tiny_run_overrides(prefix, work, "trainer.threads=1", *extra))
    return train(cfg, work / "outputs" / "runs" / name)


@pytest.fixture(scope="module")
def small_run(corpus_prefix: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 6-step run with checkpoints at steps 2, 4 and 6; returns its run dir."""
    threads = torch.get_num_threads()
    work = tmp_path_factory.mktemp("small_run")
    try:
        run_in_process(
            corpus_prefix, work, "run", "trainer.max_steps=6", "trainer.val_every=2",
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


def assert_identical(a: Any, b: Any, where: str = "payload") -> None:
    """Bit-for-bit equality of nested checkpoint contents."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def training_outcome(payload: dict[str, Any]) -> dict[str, Any]:
    """What must match between runs: all of a checkpoint except wall-clock timings."""
    state = {k: v for k, v in payload["state"].items() if k != "train_time"}
    state["history"] = [
        {k: v for k, v in h.items() if k != "seconds"} for h in payload["state"]["history"]
    ]
    keys = ("model", "optimizer", "scheduler", "scaler", "rng", "tokenizers")
    return {"state": state, **{k: payload[k] for k in keys}}


# --------------------------------------------------------------------------- 1. fault injection

FAULT_SEED = 20240611
FAULT_RUN = (
    "trainer.max_steps=42",
    "trainer.val_every=3",
    "trainer.keep_last=100",
    "trainer.seed=11",
    "trainer.patience=0",
    "trainer.precision=32",
    "trainer.val_sentences=4",
    "model.dropout=0.1",
)
STEP_TMP = re.compile(r"^\.step_\d+\.pt\..*\.tmp$")


class FaultyRun:
    """One training run driven through repeated SIGKILLs and resumes in subprocesses."""

    def __init__(self, prefix: Path, work: Path) -> None:
        self.overrides = tiny_run_overrides(prefix, work, "trainer.threads=1", *FAULT_RUN)
        self.work = work
        self.run_dir = work / "faulty"
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.starts = 0
        self.log = work / "faulty_console.log"

    def spawn(self) -> subprocess.Popen:
        """Start (first time) or resume (afterwards) the run."""
        if self.starts == 0:
            extra = [f"hydra.run.dir={self.run_dir}"]
        else:
            extra = [f"trainer.resume={self.run_dir}", f"hydra.run.dir={self.work / 'h'}"]
        self.starts += 1
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log, "a") as out:
            out.write(f"\n===== start {self.starts}\n")
            return subprocess.Popen(
                [sys.executable, "-m", "nmt.train", *self.overrides, *extra],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def step_files(self) -> dict[str, int]:
        """Step checkpoint names and their inodes (a rewritten file gets a new inode)."""
        if not self.ckpt_dir.is_dir():
            return {}
        with os.scandir(self.ckpt_dir) as it:
            return {e.name: e.inode() for e in it if ckpt.STEP_FILE.match(e.name)}

    def temporaries(self) -> list[str]:
        """Step checkpoint files being written (or left half-written by a kill)."""
        if not self.ckpt_dir.is_dir():
            return []
        return [n for n in os.listdir(self.ckpt_dir) if STEP_TMP.match(n)]

    def check_newest_readable(self) -> None:
        """last.pt (when present) verifies; so does every complete step file."""
        last = self.ckpt_dir / "last.pt"
        if last.exists():
            verify_checkpoint(last)

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


def wait_until(
    run: FaultyRun, proc: subprocess.Popen, done: Callable[[], bool], poll: float
) -> None:
    """Poll ``done`` while checking that the newest checkpoint stays readable."""
    deadline = time.monotonic() + 180
    checks = 0
    while not done():
        if proc.poll() is not None:
            pytest.fail(f"training exited ({proc.returncode}) before the kill:\n{run.tail()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no progress in 180 s:\n{run.tail()}")
        checks += 1
        if checks % max(1, int(0.05 / poll)) == 0:
            run.check_newest_readable()
        time.sleep(poll)


def kill_round(run: FaultyRun, kind: str, rng: random.Random) -> str:
    """Start or resume the run, SIGKILL it as ``kind`` says; returns a description."""
    proc = run.spawn()
    before = run.step_files()
    if kind == "startup":
        delay = rng.uniform(0.2, 3.0)
        time.sleep(delay)
        what = f"{delay:.2f}s after start"
    elif kind == "write":
        wait_until(run, proc, lambda: bool(run.temporaries()), poll=0.0003)
        what = "while a step file was being written"
    else:
        wanted = 2 if kind == "two" else 1
        delay = rng.uniform(0.0, 0.4)

        def written() -> bool:
            now = run.step_files()
            return sum(now[n] != before.get(n) for n in now) >= wanted

        wait_until(run, proc, written, poll=0.003)
        time.sleep(delay)
        what = f"{delay:.2f}s after its checkpoint no. {wanted}"
    if proc.poll() is not None:
        pytest.fail(f"training exited ({proc.returncode}) before the kill:\n{run.tail()}")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    return what


def check_after_kill(run: FaultyRun) -> tuple[int, list[str]]:
    """Every checkpoint under a final name loads; returns the resumable step and leftovers."""
    leftovers = run.temporaries()
    run.check_newest_readable()
    for name in run.step_files():
        load_checkpoint(run.ckpt_dir / name)
    resume = find_resume_checkpoint(str(run.run_dir), run.work / "outputs")
    assert resume is not None
    return int(load_checkpoint(resume)["state"]["step"]), leftovers


@pytest.mark.slow(seconds=25)
def test_sigkill_at_random_moments_then_resume_equals_uninterrupted_run(
    corpus_prefix: Path, tmp_path: Path, one_thread: None
) -> None:
    rng = random.Random(FAULT_SEED)
    run_in_process(corpus_prefix, tmp_path, "reference", *FAULT_RUN)
    reference = load_checkpoint(tmp_path / "outputs" / "runs" / "reference/checkpoints/last.pt")

    run = FaultyRun(corpus_prefix, tmp_path)
    later = ["startup", "write", "one", "two"]
    rng.shuffle(later)
    kills: list[str] = []
    mid_write = 0
    for kind in ["one", *later]:
        for _attempt in range(3):  # a kill aimed at a write can land just after the rename
            what = kill_round(run, kind, rng)
            step, leftovers = check_after_kill(run)
            kills.append(f"{what}: resumable at step {step}, temporary files {leftovers}")
            if kind != "write" or leftovers:
                mid_write += bool(leftovers)
                break
    assert len(kills) >= 5 and mid_write >= 1, kills

    proc = run.spawn()
    assert proc.wait(timeout=300) == 0, run.tail()
    final = load_checkpoint(run.ckpt_dir / "last.pt")
    assert final["state"]["step"] == 42, kills
    assert_identical(training_outcome(final), training_outcome(reference))
    assert run.temporaries() == []  # the interrupted write's leftovers were swept
    assert len(set(kills)) == len(kills)  # each kill hit a different moment


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
    small_run: Path, corpus_prefix: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    one_thread: None,
) -> None:  # fmt: skip
    run = clone_run(small_run, tmp_path / "outputs" / "runs" / "run")
    flip_bit(run / "checkpoints" / "last.pt", 8 * 7000 + 1)
    caplog.set_level(logging.INFO)
    result = run_in_process(
        corpus_prefix, tmp_path, "unused", "trainer.max_steps=8", "trainer.val_every=2",
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
    disk, write = FullDisk(succeed), ckpt.atomic_write_bytes

    def write_to_full_disk(path: Path, data: bytes) -> None:
        with monkeypatch.context() as m:
            m.setattr(atomic, "os", disk)
            write(path, data)

    monkeypatch.setattr(ckpt, "atomic_write_bytes", write_to_full_disk)


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
    corpus_prefix: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    fill_disk_for_checkpoints(monkeypatch, succeed=1)
    with pytest.raises(CheckpointError, match=r"step_00000004\.pt: No space left") as err:
        run_in_process(
            corpus_prefix, tmp_path, "full", "trainer.max_steps=6", "trainer.val_every=2",
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


def test_unwritable_output_dir_fails_before_reading_data(
    corpus_prefix: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    overrides = tiny_run_overrides(corpus_prefix, tmp_path, "trainer.max_steps=2")
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


# --------------------------------------------------------------------------- 4. downloads


@pytest.fixture
def serve() -> Iterator[Callable[[bytes, bool], Multi30kSource]]:
    """A loopback HTTP server standing in for the Multi30k URL.

    ``serve(body, announce_length)`` sets what every request gets and returns the source that
    fetches from the server; with ``announce_length=False`` the body ends with the connection
    (no Content-Length).
    """
    content: dict[str, Any] = {"body": b"", "length": True}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            self.send_response(200)
            if content["length"]:
                self.send_header("Content-Length", str(len(content["body"])))
            self.end_headers()
            self.wfile.write(content["body"])

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    source = Multi30kSource(url=f"http://127.0.0.1:{server.server_address[1]}")

    def set_content(body: bytes, announce_length: bool = True) -> Multi30kSource:
        content.update(body=body, length=announce_length)
        return source

    yield set_content
    server.shutdown()
    server.server_close()


def test_partial_download_without_length_is_caught_by_the_checksum(
    tmp_path: Path, multi30k: Path, serve: Callable[[bytes, bool], Multi30kSource]
) -> None:
    real = (multi30k / "val.en.gz").read_bytes()
    source = serve(real[: len(real) // 2], False)
    with pytest.raises(DataError, match=r"sha256 mismatch for val\.en\.gz.*deleted"):
        fetch_multi30k(tmp_path, ["en"], ["val"], source)
    assert list((tmp_path / "multi30k").iterdir()) == []


def test_wrong_file_of_the_right_size_is_deleted_and_reported(
    tmp_path: Path, multi30k: Path, serve: Callable[[bytes, bool], Multi30kSource]
) -> None:
    real = bytearray((multi30k / "val.en.gz").read_bytes())
    real[len(real) // 2] ^= 0x01
    source = serve(bytes(real), True)
    with pytest.raises(DataError, match=r"expected 14f7d25d.*got .*deleted") as err:
        fetch_multi30k(tmp_path, ["en"], ["val"], source)
    assert "127.0.0.1" in str(err.value)
    assert list((tmp_path / "multi30k").iterdir()) == []


def test_leftovers_of_an_interrupted_download_are_never_used(
    tmp_path: Path, multi30k: Path, serve: Callable[[bytes, bool], Multi30kSource],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    real = (multi30k / "val.en.gz").read_bytes()
    base = tmp_path / "multi30k"
    base.mkdir()
    (base / ".val.en.gz.abc123.tmp").write_bytes(real)  # a killed transfer's temporary file
    (base / "val.en.gz").write_bytes(real[:1000])  # a partial copy under the final name
    source = serve(real, True)
    caplog.set_level(logging.WARNING, logger="nmt.data")
    fetch_multi30k(tmp_path, ["en"], ["val"], source)
    assert sha256_file(base / "val.en.gz") == corpus.MULTI30K_SHA256["val.en.gz"]
    assert sorted(p.name for p in base.iterdir()) == ["val.en.gz"]  # the leftover is deleted
    assert "val.en.gz has sha256" in caplog.text and "fetching it again" in caplog.text


# --------------------------------------------------------------------------- 5. hostile corpora

NASTY = st.text(
    alphabet=st.sampled_from(
        ["a", "Z", "ß", "狗", "🙂", " ", "\t", "\r", "\0", "\x0b", "\x0c", "\x1c", "\x85",
         "\u2028", "\u00a0", "\ufeff", "<", ">", "1"]
    ),
    max_size=12,
)  # fmt: skip
BLANK = st.text(  # never empty: an empty last line without a final newline is no line at all
    alphabet=st.sampled_from([" ", "\t", "\r", "\x0b", "\u3000", "\0"]), min_size=1, max_size=4
)


def tagged(i: int, noise: tuple[str, str]) -> str:
    """A line carrying its index as ``[i]`` between two bits of noise (no brackets in noise)."""
    return f"{noise[0]}[{i}]{noise[1]}"


def encode_file(lines: list[str], bom: bool, crlf: bool, final_newline: bool) -> bytes:
    eol = "\r\n" if crlf else "\n"
    text = eol.join(lines) + (eol if final_newline and lines else "")
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8", "surrogatepass")


def write_pair(tmp: Path, src: bytes, tgt: bytes, gz: bool | str) -> tuple[Path, Path]:
    """Write both sides; ``gz``: True (gzipped), False (plain) or "fake" (plain, named .gz)."""
    suffix = ".gz" if gz else ""
    paths = tmp / f"c.de{suffix}", tmp / f"c.en{suffix}"
    for path, data in zip(paths, (src, tgt), strict=True):
        path.write_bytes(gzip.compress(data, mtime=0) if gz is True else data)
    return paths


def read_and_clean(src: Path, tgt: Path) -> tuple[list[str], list[str]] | DataError:
    """read_parallel + clean_pairs, as prepare_data runs them; a DataError is returned."""
    try:
        kept_src, kept_tgt, stats = clean_pairs(*read_parallel(src, tgt))
    except DataError as err:
        return err
    assert stats["kept"] == len(kept_src) == len(kept_tgt)
    return kept_src, kept_tgt


@QUICK
@given(
    src=st.binary(max_size=300), tgt=st.binary(max_size=300),
    gz=st.sampled_from([False, True, "fake"]),
    prefix=st.sampled_from([b"", b"\xef\xbb\xbf", b"\xed\xa0\x80", b"\0\0", b"\r\n"]),
)  # fmt: skip
def test_random_bytes_give_a_result_or_a_data_error(
    tmp_path: Path, src: bytes, tgt: bytes, gz: bool | str, prefix: bytes
) -> None:
    paths = write_pair(tmp_path, prefix + src, tgt, gz)
    out = read_and_clean(*paths)
    if isinstance(out, DataError):
        assert any(str(p) in str(out) for p in paths), out
    else:
        assert all("\n" not in x and x == x.strip() and x for x in out[0] + out[1])


@QUICK
@given(
    rows=st.lists(
        st.tuples(st.booleans(), st.tuples(NASTY, NASTY), st.tuples(NASTY, NASTY), BLANK),
        max_size=25,
    ),
    src_style=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    tgt_style=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    gz=st.booleans(),
)
def test_valid_text_stays_aligned_line_by_line(
    tmp_path: Path, rows: list, src_style: tuple, tgt_style: tuple, gz: bool
) -> None:
    """BOM, CRLF, NUL, separators, blank sides: pair i of the output is line i of both files."""
    src_lines, tgt_lines, expected = [], [], []
    for i, (blank_side, s_noise, t_noise, blank) in enumerate(rows):
        src_lines.append(tagged(i, s_noise))
        tgt_lines.append(blank if blank_side else tagged(i, t_noise))
        if not blank_side:
            expected.append(i)
    paths = write_pair(
        tmp_path, encode_file(src_lines, *src_style), encode_file(tgt_lines, *tgt_style), gz
    )
    out = read_and_clean(*paths)
    assert not isinstance(out, DataError), out
    kept_src, kept_tgt = out
    ids = [[int(m) for m in re.findall(r"\[(\d+)\]", x)] for x in (*kept_src, *kept_tgt)]
    assert ids == [[i] for i in expected] * 2


@QUICK
@given(
    lines=st.lists(NASTY, min_size=1, max_size=20),
    bad_line=st.integers(0, 19),
    bad=st.sampled_from([b"\xed\xa0\x80", b"\xff", b"\xc3", b"\xe2\x82", b"\xf8\x88\x80\x80\x80"]),
    style=st.tuples(st.booleans(), st.booleans()),
    gz=st.booleans(),
)  # fmt: skip
def test_invalid_utf8_names_file_and_line(
    tmp_path: Path, lines: list[str], bad_line: int, bad: bytes, style: tuple, gz: bool
) -> None:
    bad_line %= len(lines)
    raw = [x.encode() for x in lines]
    raw[bad_line] = raw[bad_line][: len(raw[bad_line]) // 2] + bad + b"x"
    eol = b"\r\n" if style[1] else b"\n"
    data = (b"\xef\xbb\xbf" if style[0] else b"") + eol.join(raw) + eol
    src, tgt = write_pair(tmp_path, b"ok\n" * len(lines), data, gz)
    out = read_and_clean(src, tgt)
    assert isinstance(out, DataError)
    assert f"{tgt}:{bad_line + 1}: invalid UTF-8" in str(out)


@QUICK
@given(n_src=st.integers(0, 30), n_tgt=st.integers(0, 30), final_newline=st.booleans())
def test_mismatched_line_counts_never_pair_silently(
    tmp_path: Path, n_src: int, n_tgt: int, final_newline: bool
) -> None:
    src = encode_file([f"s{i}" for i in range(n_src)], False, False, final_newline)
    tgt = encode_file([f"t{i}" for i in range(n_tgt)], False, True, True)
    paths = write_pair(tmp_path, src, tgt, False)
    out = read_and_clean(*paths)
    if n_src == n_tgt:
        assert out == ([f"s{i}" for i in range(n_src)], [f"t{i}" for i in range(n_tgt)])
    else:
        assert isinstance(out, DataError)
        assert f"{paths[0]} has {n_src} lines" in str(out)
        assert f"{paths[1]} has {n_tgt} lines" in str(out)


def test_extremely_long_and_whitespace_lines_keep_alignment(tmp_path: Path) -> None:
    long = "Wort " * 400_000  # a 2 MB line
    src = ["eins", long, " \t ", "\0\0", "vier"]
    tgt = ["one", "two", "three", "four", "five " * 300_000]
    paths = write_pair(
        tmp_path, encode_file(src, True, True, True), encode_file(tgt, False, False, False), True
    )
    kept_src, kept_tgt = read_and_clean(*paths)  # type: ignore[misc]
    assert kept_src == ["eins", long.strip(), "vier"]
    assert kept_tgt == ["one", "two", ("five " * 300_000).strip()]


# --------------------------------------------------------------------------- 6. config errors


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.lr=-0.001", "optim.lr"),
        ("model.heads=3", "model.heads"),
        ("data.max_tokens=90", "data.max_tokens"),
    ],
)
def test_invalid_config_stops_train_before_any_data_is_read(
    corpus_prefix: Path, tmp_path: Path, override: str, key: str
) -> None:
    cfg = compose_config("train", tiny_run_overrides(corpus_prefix, tmp_path, override))
    with pytest.raises(ConfigError, match=re.escape(key)):
        train(cfg, tmp_path / "outputs" / "runs" / "x")
    assert not (tmp_path / "data").exists()
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "group, valid", [("model", ["transformer", "gru_bahdanau"]), ("data", ["multi30k_de_en"])]
)
def test_unknown_group_option_lists_the_valid_ones(group: str, valid: list[str]) -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_config("train", [f"{group}=no_such_thing"])
    assert "no_such_thing" in str(err.value)
    for name in valid:
        assert name in str(err.value)


# --------------------------------------------------------------------------- 7. decoding memory


def test_decoding_a_huge_line_among_thousands_stays_within_budget(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    torch.set_num_threads(1)  # tiny tensors: more threads only wait for each other
    rng = np.random.default_rng(0)
    vocab = 40
    lengths = [5000, *rng.integers(1, 13, size=3000).tolist()]
    src = [rng.integers(4, vocab, size=n).tolist() for n in lengths]
    data = TokenDataset(src, [[5]] * len(src))
    torch.manual_seed(0)
    cfg = OmegaConf.structured(
        TransformerConfig(d_model=16, heads=2, d_ff=32, enc_layers=1, dec_layers=1,
                          max_positions=128)
    )  # fmt: skip

    model = create_model(
        cfg, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=PAD_ID, shared_vocab=True
    )
    opts = DecodeOptions(max_output_len_a=1.2, max_output_len_b=4, max_tokens=600)
    batches: list[np.ndarray] = []
    encoded: list[tuple[int, int]] = []
    real_make_batch, real_encode = make_batch, model.encode

    def recording_make_batch(ds: TokenDataset, idx: Any) -> Any:
        batches.append(np.asarray(idx))
        return real_make_batch(ds, idx)

    def recording_encode(src_ids: torch.Tensor, src_lens: torch.Tensor) -> Any:
        encoded.append(tuple(src_ids.shape))
        return real_encode(src_ids, src_lens)

    monkeypatch.setattr(search_mod, "make_batch", recording_make_batch)
    monkeypatch.setattr(model, "encode", recording_encode)
    start = time.perf_counter()
    hyps = decode_dataset(model, data, opts, torch.device("cpu"))
    seconds = time.perf_counter() - start

    assert len(hyps) == len(src)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(src)))  # each once
    for idx in batches:
        src_lens = data.src_lens[idx]
        caps = opts.caps(src_lens)
        cost = len(idx) * int(np.maximum(src_lens + 1, caps + 1).max())
        assert cost <= opts.max_tokens or len(idx) == 1
    assert max(b * s for b, s in encoded) <= opts.max_tokens
    assert max(s for _, s in encoded) <= 128  # the long line is cut to the model's positions
    assert max(len(h.tokens) for h in hyps) <= 127
    assert seconds < 30
