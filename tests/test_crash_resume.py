"""Crash safety: a real training process is SIGKILLed at seeded random moments (one of them in
the middle of a checkpoint write) and resumed each time; every checkpoint under a final name
loads after every kill, and the final weights equal those of an uninterrupted run bit for bit.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nmt.store import checkpoint as ckpt
from nmt.store.checkpoint import load_checkpoint, verify_checkpoint
from nmt.train.start import find_resume_checkpoint

from .helpers import REPO, assert_identical, run_in_process, tiny_run_overrides, training_outcome

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
            args = [*self.overrides, f"hydra.run.dir={self.run_dir}"]
        else:  # as the stopped run prints: the run's own config comes from its checkpoint
            args = [f"trainer.resume={self.run_dir}", f"hydra.run.dir={self.work / 'h'}"]
        self.starts += 1
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log, "a") as out:
            out.write(f"\n===== start {self.starts}\n")
            return subprocess.Popen(
                [sys.executable, "-m", "nmt.train", *args],
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


@pytest.mark.slow(seconds=22)
def test_sigkill_at_random_moments_then_resume_equals_uninterrupted_run(
    corpus: Path, tmp_path: Path, threads_restored: None
) -> None:
    rng = random.Random(FAULT_SEED)
    run_in_process(corpus, tmp_path, "reference", *FAULT_RUN)
    reference = load_checkpoint(tmp_path / "outputs" / "runs" / "reference/checkpoints/last.pt")

    run = FaultyRun(corpus, tmp_path)
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
