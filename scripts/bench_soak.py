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

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from nmt.procmem import kill_tree, load_average, rss

REPO = Path(__file__).resolve().parents[1]
# the trainer's line when its loop ends (before the final averaging and evaluation)
STEP = re.compile(r"\] step \d+: loss")
VALIDATION = re.compile(r"validation at step \d+: .*\(([\d.]+)s\)")
TRAIN_END = re.compile(r"best validation BLEU [\d.]+ at step \d+|at step \d+ \(no validation yet\)")


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


def soak(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="bench-soak-"))
    overrides = [
        f"trainer.max_time={int(args.minutes * 60)}",
        f"hydra.run.dir={run_dir}",
        *args.set,
    ]
    cmd = [sys.executable, "-u", "-m", "nmt.train", *overrides]
    samples: list[tuple[float, int]] = []
    train_end: list[float] = []
    validations: list[tuple[float, float]] = []  # (start, end) seconds since the start
    steps: list[float] = []  # when each "step N:" line was read
    tail: list[str] = []
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
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
            now = time.monotonic() - start
            if STEP.search(line):
                steps.append(now)
            if m := VALIDATION.search(line):
                validations.append((now - float(m.group(1)), now))
            if not train_end and TRAIN_END.search(line):
                train_end.append(now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            now, _ = rss(proc.pid)
            if now:
                samples.append((round(time.monotonic() - start, 1), now))
            time.sleep(args.interval)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
        proc.wait()
        reader.join(timeout=10)
    if proc.returncode != 0:
        raise SystemExit(f"training failed (exit {proc.returncode}):\n{''.join(tail)}")
    end = train_end[0] if train_end else samples[-1][0]
    training = training_samples(samples, validations, steps, end, args.interval)
    early = window(training, args.early * 60 - 30, args.early * 60 + 30)
    last = training[-1][0] if training else end
    late = window(training, last - 60, last + 1)
    summary = (
        json.loads((run_dir / "summary.json").read_text())
        if (run_dir / "summary.json").is_file()
        else {}
    )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training time")
    parser.add_argument("--early", type=float, default=5.0, help="minute of the first window")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--set",
        action="append",
        default=["experiment=cpu_quick", "trainer.log_every=10"],
        help="a config override (repeatable), after experiment=cpu_quick trainer.log_every=10",
    )
    parser.add_argument("--run-dir", default=None, help="the run's directory (default: a temp)")
    parser.add_argument("--out", default=None, help="the JSON file (default: outputs/bench/...)")
    args = parser.parse_args(argv)
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_start": load_average(),
        },
        **soak(args),
    }
    result["machine"]["load_end"] = load_average()
    out = Path(
        args.out
        or REPO / "outputs" / "bench" / f"bench-soak-{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    gb = 1 << 30
    e, l_ = result["early"], result["end"]
    print(
        f"resident memory, median: at {args.early:g} min {e['median'] / gb:.2f} GiB, "
        f"at the end {l_['median'] / gb:.2f} GiB; peak {result['peak_rss'] / gb:.2f} GiB"
    )
    print(f"checks: {result['checks']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
