"""A run's events as data: ``<run>/metrics.jsonl``, and ``summary.json`` derived from it.

Training appends one JSON object per line (main rank only), each with ``event``, ``step`` (the
optimizer updates done) and ``time`` (Unix seconds):

* ``start``: device (its name), device_type, precision, world_size, threads, torch, parameters,
  overrides, train_pairs, batches_per_epoch (this rank's), padding_share (of the first epoch's
  batches), data_time (Unix seconds when the data was ready), and ``resumed_from`` /
  ``init_from`` when the run continues or fine-tunes a checkpoint; written when the data, model
  and batches are ready, before the first update;
* ``train`` (one per log window): epoch, train_time (seconds of training so far), loss (per
  target token), lr, grad_norm (mean over the window), tokens (target tokens, all ranks),
  updates, seconds (training time of the window), tokens_per_s, skipped (updates not applied
  for a non-finite loss or gradient, fp16's overflows included; loss, grad_norm, tokens and
  seconds leave them out);
* ``validation``: loss, ppl, bleu, chrf, seconds (of the validation), best (a new best BLEU);
  a multilingual run's bleu and chrf are the means over its directions, and ``directions``
  holds each one's loss, bleu, chrf, sentences and sacreBLEU signatures;
* ``checkpoint``: path (relative to the run directory: ``step_N.pt`` after a validation,
  ``resume_N.pt`` for the clock's and a stop's), best;
* ``averaged``: checkpoints (the validations' step checkpoints averaged), path, and the
  validation scores;
* ``end``: epoch, train_time, stop_reason, best_bleu, best_step.

A resumed run appends to the same file, starting with a ``start`` event at the step it resumes
from; :func:`read_events` drops the events of the earlier session logged after that step (they
belong to updates the resumed run does again), so readers see one consistent history.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from nmt.atomic import atomic_write_bytes

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
EVENTS = ("start", "train", "validation", "checkpoint", "averaged", "end")


class RunLog:
    """Appends events to ``<run>/metrics.jsonl``; a disabled log (other DDP ranks) writes
    nothing."""

    def __init__(self, run_dir: Path | None) -> None:
        self.path = Path(run_dir) / METRICS_FILE if run_dir is not None else None

    def write(self, event: str, step: int, **fields: Any) -> dict[str, Any]:
        """Append one event (flushed at once, so a reader sees it while the run goes on)."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; expected one of: {', '.join(EVENTS)}")
        record = {"event": event, "step": int(step), "time": round(time.time(), 3), **fields}
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps(_plain(record), allow_nan=False)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")
        return record


def _plain(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become null (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events of ``<run>/metrics.jsonl`` as one consistent history (see the module doc).

    A last line cut short by a killed run is skipped with a warning; any other line that is
    not a JSON object raises ValueError naming the file and line. No file: an empty list.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    events: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "event" not in record or "step" not in record:
                raise ValueError("not an event object")
        except ValueError as e:
            if number == len(lines):
                log.warning("%s:%d: an unfinished last line is ignored", path, number)
                break
            raise ValueError(f"{path}:{number}: not a metrics event ({e})") from None
        if record["event"] == "start":  # a resumed session redoes the updates after its step
            events = [e for e in events if e["step"] <= record["step"]]
        events.append(record)
    return events


def of_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The events of one kind, in order."""
    return [e for e in events if e["event"] == kind]


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's outcome (``summary.json``), derived from its events alone."""
    starts, ends = of_kind(events, "start"), of_kind(events, "end")
    validations = of_kind(events, "validation")
    summary: dict[str, Any] = {"best_bleu": -1.0, "best_step": 0}
    if validations:
        best = max(validations, key=lambda e: (e["bleu"], -e["step"]))
        summary = {"best_bleu": best["bleu"], "best_step": best["step"]}
    last = events[-1] if events else {"step": 0}
    end = ends[-1] if ends and ends[-1] is last else None
    trains = of_kind(events, "train")
    summary.update(
        step=last["step"],
        epoch=end["epoch"] if end else (trains[-1]["epoch"] if trains else 0),
        train_time=end["train_time"] if end else (trains[-1]["train_time"] if trains else 0.0),
        stop_reason=end["stop_reason"] if end else "unfinished",
    )
    first, latest = (starts[0], starts[-1]) if starts else ({}, {})
    summary["overrides"] = latest.get("overrides", [])
    averaged = of_kind(events, "averaged")
    if averaged:
        summary["averaged_bleu"] = averaged[-1]["bleu"]
    if first.get("init_from"):
        summary["init_from"] = first["init_from"]
    if latest:
        keys = ("device", "device_type", "world_size", "threads", "precision", "torch")
        summary["hardware"] = {k: latest[k] for k in keys if k in latest}
    return summary


def write_summary(run_dir: Path) -> dict[str, Any]:
    """Derive ``summary.json`` from ``metrics.jsonl`` and write it; returns the summary."""
    summary = summarize(read_events(run_dir))
    atomic_write_bytes(Path(run_dir) / SUMMARY_FILE, json.dumps(summary, indent=2).encode())
    return summary
