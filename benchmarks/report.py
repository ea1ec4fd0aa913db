"""What the benchmarks print and write: progress lines, text tables, JSON files, and the
summary of a training run (read through :mod:`nmt.train.runlog`).

Standard library only at import time (the GPU check loads it before its wheels are installed).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


class SetupError(Exception):
    """A problem found before anything is measured (bad settings, missing files): the message
    tells the user what to change; the command-line wrappers exit with status 2."""


def say(tag: str, msg: str) -> None:
    """A progress line on stderr (tables and results go to stdout)."""
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    """A plain-text table with a rule under the header; ``align`` holds one letter per column,
    ``l`` (left) or ``r`` (right, also for the columns it does not reach)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    sides = align.ljust(len(header), "r")[: len(header)]

    def line(cells: list[str]) -> str:
        padded = [
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(cells, widths, sides, strict=True)
        ]
        return " | ".join(padded)

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def write_json(out: Path, result: dict[str, Any]) -> None:
    """Write ``result`` as indented JSON, creating the folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def json_out(out: str | Path | None, name: str, root: Path) -> Path:
    """Where a benchmark writes its JSON: ``out``, else
    ``root/outputs/bench/{name}-<date>_<time>.json``."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    return Path(out or root / "outputs" / "bench" / f"{name}-{stamp}.json")


def write_result(out: Path, result: dict[str, Any], text: str) -> None:
    """Write the JSON, then print the report and where the JSON went (with the seconds the
    benchmark took, where the result has them: ``seconds``)."""
    write_json(out, result)
    print(text)
    took = f"  ({result['seconds']:.0f} s)" if "seconds" in result else ""
    print(f"\nwritten: {out}{took}")


def run_summary(run_dir: Path) -> dict[str, Any] | None:
    """A training run's summary, derived from its ``metrics.jsonl``; a run from before that
    file existed has only ``summary.json``, which is read instead. None: neither is there."""
    from nmt.train.runlog import SUMMARY_FILE, read_events, summarize

    events = read_events(run_dir)
    if events:
        return summarize(events)
    old = Path(run_dir) / SUMMARY_FILE
    return json.loads(old.read_text()) if old.is_file() else None
