"""Memory over a long training run: ``make bench-soak``.

Runs ``nmt-train`` (default ``experiment=cpu_quick``: the Transformer on Multi30k for its
30-minute budget; ``--minutes`` sets ``trainer.max_time``) and samples the resident memory of
the training process every ``--interval`` seconds. A sample taken in the middle of an update
includes that update's activations, so the figures compared are medians over windows: the
minute around ``--early`` (default 5) minutes and the last minute of training (before the
final evaluation starts). Writes JSON (default ``outputs/bench/bench-soak-<timestamp>.json``)
with every sample, the windows, the peak and the checks::

    python scripts/bench_soak.py                         # or: make bench-soak
    python scripts/bench_soak.py --minutes 10 --early 2  # a shorter soak
    python scripts/bench_soak.py --set trainer.precision=32 --set model=gru_bahdanau
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.memory import kill_tree, load_average, rss
from benchmarks.report import run_summary
from nmt.train.runlog import of_kind, read_events

# events written after the training loop: the averaged checkpoint, the end of the run
AFTER_TRAINING = ("averaged", "end")


@dataclass
class SoakSettings:
    """The training run to sample (``minutes`` of training, ``overrides``) and how."""

    minutes: float = 30.0
    early: float = 5.0  # minute of the first window
    interval: float = 5.0  # seconds between samples
    overrides: list[str] = field(
        default_factory=lambda: ["experiment=cpu_quick", "trainer.log_every=10"]
    )
    run_dir: Path | None = None  # default: a temporary folder
    cwd: Path | None = None  # where nmt-train runs (the repository)


def window(samples: list[tuple[float, int]], start: float, end: float) -> dict[str, Any] | None:
    """Median and range of the samples taken in [start, end) seconds."""
    vals = [v for t, v in samples if start <= t < end]
    if not vals:
        return None
    return {
        "from_s": start,
        "to_s": end,
        "samples": len(vals),
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
    }


def training_samples(
    samples: list[tuple[float, int]],
    validations: list[tuple[float, float]],
    steps: list[float],
    end: float,
    interval: float,
) -> list[tuple[float, int]]:
    """The samples taken while the run trained: before the end of training, and outside each
    validation, counted from one sample interval before it starts until the next update is
    logged (the checkpoint written after a validation belongs to it), or the end."""
    gaps = []
    for start, stop in validations:
        resume = next((t for t in steps if t > stop), end)
        gaps.append((start - 2 * interval, resume))
    return [(t, v) for t, v in samples if t < end and not any(a <= t <= b for a, b in gaps)]


def timeline(
    events: list[dict[str, Any]], origin: float
) -> tuple[list[tuple[float, float]], list[float], float | None]:
    """From a run's events, in seconds since ``origin`` (Unix time): each validation's (start,
    end), when each training window was logged, and when the training loop ended (the last
    event before the averaged checkpoint or the end of the run; None: it never ended)."""
    validations = [(v["time"] - v["seconds"] - origin, v["time"] - origin)
                   for v in of_kind(events, "validation")]  # fmt: skip
    steps = [e["time"] - origin for e in of_kind(events, "train")]
    after = next((i for i, e in enumerate(events) if e["event"] in AFTER_TRAINING), None)
    loop = events[:after] if after is not None else []
    end = loop[-1]["time"] - origin if loop else None
    return validations, steps, end


def soak(s: SoakSettings) -> dict[str, Any]:
    """Train, sample the trainer's resident memory, and compare the early and late windows."""
    run_dir = Path(s.run_dir or tempfile.mkdtemp(prefix="bench-soak-"))
    overrides = [
        f"trainer.max_time={int(s.minutes * 60)}",
        f"hydra.run.dir={run_dir}",
        *s.overrides,
    ]
    cmd = [sys.executable, "-u", "-m", "nmt.train", *overrides]
    samples: list[tuple[float, int]] = []
    tail: list[str] = []
    start, origin = time.monotonic(), time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=s.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            del tail[:-40]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            now, _ = rss(proc.pid)
            if now:
                samples.append((round(time.monotonic() - start, 1), now))
            time.sleep(s.interval)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
        proc.wait()
        reader.join(timeout=10)
    if proc.returncode != 0:
        raise SystemExit(f"training failed (exit {proc.returncode}):\n{''.join(tail)}")
    validations, steps, train_end = timeline(read_events(run_dir), origin)
    end = train_end if train_end is not None else samples[-1][0]
    training = training_samples(samples, validations, steps, end, s.interval)
    early = window(training, s.early * 60 - 30, s.early * 60 + 30)
    last = training[-1][0] if training else end
    late = window(training, last - 60, last + 1)
    summary = run_summary(run_dir) or {}
    checks = {}
    if early and late:
        growth = late["median"] / early["median"] - 1
        checks = {
            "growth_early_to_end": round(growth, 4),
            "flat_within_10pct": abs(growth) <= 0.10,
            "end_under_2_5GB": late["median"] < 2.5e9,
        }
    return {
        "command": " ".join(["nmt-train", *overrides]),
        "seconds_training": end,
        "samples": samples,
        "validations": validations,
        "step_lines": steps,
        "early": early,
        "end": late,
        "peak_rss": max(v for _, v in samples),
        "checks": checks,
        "summary": {k: summary[k] for k in ("step", "best_bleu", "averaged_bleu") if k in summary},
    }


def run(s: SoakSettings) -> dict[str, Any]:
    """The soak with the machine and its load around it: the JSON-ready result."""
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_start": load_average(),
        },
        **soak(s),
    }
    result["machine"]["load_end"] = load_average()
    return result


def report(result: dict[str, Any], early_minute: float) -> str:
    """The medians of the two windows, the peak and the checks."""
    gb = 1 << 30
    e, l_ = result["early"], result["end"]
    return (
        f"resident memory, median: at {early_minute:g} min {e['median'] / gb:.2f} GiB, "
        f"at the end {l_['median'] / gb:.2f} GiB; peak {result['peak_rss'] / gb:.2f} GiB\n"
        f"checks: {result['checks']}"
    )
