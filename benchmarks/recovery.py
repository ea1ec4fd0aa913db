"""Recovery from a rank's death under torchrun: ``make bench-recovery``.

Starts ``torchrun --nproc-per-node=2 --max-restarts=1 -m nmt.train`` (default
``experiment=cpu_quick``, the trainer's default checkpoints: one per validation, none by the
clock), waits until rank 0 has logged update ``--kill-at`` (``metrics.jsonl``'s ``train``
events), SIGKILLs rank 1 and watches the restarted group continue the same run directory.
Measures the seconds from the death to the restarted group's ``start`` event (its checkpoint
loaded, the next update its first) and to its first ``train`` event (``log_every`` updates
later), and the updates lost: the step logged before the kill minus the step resumed from.
Writes JSON (default ``outputs/bench/bench-recovery-<timestamp>.json``)::

    python scripts/bench_recovery.py                                   # or: make bench-recovery
    python scripts/bench_recovery.py --set trainer.save_every_minutes=1
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.memory import PROC, descendants, kill_tree, load_average
from benchmarks.report import SetupError
from nmt.environment import SEPARATE_STORE, child_environment
from nmt.train.runlog import of_kind, read_events


@dataclass
class RecoverySettings:
    """The run whose rank 1 is killed, and when."""

    run_dir: Path
    kill_at: int = 100  # the update logged before rank 1 is killed
    overrides: list[str] = field(default_factory=lambda: ["experiment=cpu_quick"])
    max_steps: int = 0  # 0: kill_at + 2 log windows
    cwd: Path | None = None  # where torchrun runs (the repository)
    timeout: float = 1800.0  # seconds for the whole run
    to_end: bool = False  # let the run finish (else stop it once the restart logged its first)


def torchrun_environment(**extra: str) -> dict[str, str]:
    """This process's environment for torchrun as ``make train`` starts it: each restarted
    worker group with a store of its own (:data:`nmt.environment.SEPARATE_STORE`)."""
    return child_environment(**{SEPARATE_STORE: "1", "PYTHONUNBUFFERED": "1", **extra})


def torchrun_command(nproc: int, restarts: int, *args: str) -> list[str]:
    """``torchrun --nproc-per-node=N --max-restarts=R -m nmt.train ARGS`` with this Python, as
    ``make train NPROC=N RESTARTS=R ARGS=...`` runs it."""
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        f"--max-restarts={restarts}", "-m", "nmt.train", *args,
    ]  # fmt: skip


def worker_ranks(launcher: int) -> dict[int, int]:
    """The processes below ``launcher`` that torchrun started as workers, by global rank."""
    found = {}
    for pid in descendants(launcher):
        try:
            raw = (PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        env = dict(v.split(b"=", 1) for v in raw.split(b"\0") if b"=" in v)
        if b"TORCHELASTIC_RUN_ID" in env and b"RANK" in env:
            found[int(env[b"RANK"])] = pid
    return found


def wait_for(done: Callable[[], Any], proc: subprocess.Popen, what: str, timeout: float) -> Any:
    """Poll ``done`` every 50 ms until it returns something true; SetupError (with the process
    killed) when the process ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = done()
        if value:
            return value
        if proc.poll() is not None:
            raise SetupError(f"torchrun exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            kill_tree(proc.pid)
            raise SetupError(f"no {what} in {timeout:.0f} s")
        time.sleep(0.05)


def events(run_dir: Path) -> list[dict[str, Any]]:
    return read_events(run_dir) if (run_dir / "metrics.jsonl").is_file() else []


def kill_rank_at(
    proc: subprocess.Popen, run_dir: Path, step: int, rank: int, timeout: float
) -> dict[str, Any]:
    """SIGKILL worker ``rank`` once rank 0 logged update ``step`` or later (a ``train`` event);
    returns the step logged and the time of the kill (Unix seconds)."""

    def logged() -> int:
        steps = [e["step"] for e in of_kind(events(run_dir), "train")]
        return max(steps) if steps and max(steps) >= step else 0

    seen = wait_for(logged, proc, f"update {step} in {run_dir}", timeout)
    pid = wait_for(lambda: worker_ranks(proc.pid).get(rank), proc, f"rank {rank}", timeout)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    # read now: a restart that resumes an earlier step drops the later events from the file
    last = of_kind(events(run_dir), "train")[-2:]
    pace = None  # seconds per update before the kill, between its last two log lines
    if len(last) == 2 and last[1]["step"] > last[0]["step"]:
        pace = round((last[1]["time"] - last[0]["time"]) / (last[1]["step"] - last[0]["step"]), 3)
    return {"killed_rank": rank, "step_logged": seen, "killed_at": killed_at,
            "seconds_per_update_before": pace}  # fmt: skip


def recovery_figures(run_dir: Path, kill: dict[str, Any]) -> dict[str, Any]:
    """From the run's events: when the restarted group started and first logged, and the
    updates lost."""
    evs = events(run_dir)
    starts = of_kind(evs, "start")
    if len(starts) < 2:
        raise SetupError(f"{run_dir}: the restarted group wrote no start event")
    restart = starts[-1]
    after = [e for e in of_kind(evs, "train") if e["time"] > restart["time"]]
    first = after[0] if after else None
    return {
        "starts": len(starts),
        "resumed_from": restart.get("resumed_from"),
        "resumed_step": restart["step"],
        "updates_lost": kill["step_logged"] - restart["step"],
        "death_to_start_s": round(restart["time"] - kill["killed_at"], 2),
        "death_to_first_log_s": round(first["time"] - kill["killed_at"], 2) if first else None,
        "first_log_step": first["step"] if first else None,
    }


def _restarted_and_logged(run_dir: Path) -> bool:
    evs = events(run_dir)
    starts = of_kind(evs, "start")
    return len(starts) >= 2 and any(e["time"] > starts[-1]["time"] for e in of_kind(evs, "train"))


def run(s: RecoverySettings) -> dict[str, Any]:
    """Train under torchrun, kill rank 1 at ``s.kill_at``, let the group restart and log its
    first window (and finish, with ``s.to_end``)."""
    max_steps = s.max_steps or s.kill_at + 100
    args = [*s.overrides, f"trainer.max_steps={max_steps}", f"hydra.run.dir={s.run_dir}"]
    cmd = torchrun_command(2, 1, *args)
    log = s.run_dir.parent / f"{s.run_dir.name}.console.log"
    s.run_dir.parent.mkdir(parents=True, exist_ok=True)
    env = torchrun_environment()
    began = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=s.cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            kill = kill_rank_at(proc, s.run_dir, s.kill_at, 1, s.timeout)
            if s.to_end:
                status = proc.wait(timeout=s.timeout)
            else:  # the figures are in once the restarted group logged its first window
                wait_for(lambda: _restarted_and_logged(s.run_dir), proc, "a log line after the "
                         "restart", s.timeout)  # fmt: skip
                status = 0
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()
    if status != 0:
        tail = log.read_text()[-3000:]
        raise SetupError(f"torchrun exited with {status} after the kill:\n{tail}")
    figures = recovery_figures(s.run_dir, kill)
    end = of_kind(events(s.run_dir), "end")
    return {
        "torchrun": " ".join(["torchrun", *cmd[3:]]),
        "overrides": args,
        "kill_at": s.kill_at,
        **kill,
        **figures,
        "final_step": end[-1]["step"] if end else None,  # None: stopped after the figures
        "wall_s": round(time.time() - began, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average": load_average(),
        },  # fmt: skip
        "run_dir": str(s.run_dir),
        "console_log": str(log),
    }


def report(result: dict[str, Any]) -> str:
    """The figures in a few lines."""
    return "\n".join([
        f"rank {result['killed_rank']} killed after update {result['step_logged']}; the "
        f"restarted group resumed from {result['resumed_from']} (step {result['resumed_step']})",
        f"updates lost: {result['updates_lost']}",
        f"death -> restarted group's first update: {result['death_to_start_s']} s; -> its first "
        f"log line (step {result['first_log_step']}): {result['death_to_first_log_s']} s",
    ])  # fmt: skip
