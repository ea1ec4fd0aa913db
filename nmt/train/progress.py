"""The training progress bar: how far a run is toward whichever of its limits ends it first.

A run stops at ``trainer.max_steps``, at its time limit (``trainer.max_time``, or
``trainer.cpu_max_time`` on a CPU) or after ``trainer.max_epochs``, whichever comes first. The
bar fills with the largest of the three shares, and the time left is the least of what each
limit leaves at the run's rate so far. The bar is drawn only on a terminal: a log file or CI
output gets the log lines and no bar fragments.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from tqdm import tqdm

from nmt.cli import on_terminal


@dataclass(frozen=True)
class Limits:
    """A run's limits; 0 means none of that kind."""

    max_steps: int = 0
    time_limit: float = 0.0  # seconds of training
    max_epochs: int = 0


@dataclass(frozen=True)
class Position:
    """Where a run is: updates done, seconds of training, epochs done (a fraction mid-epoch)."""

    step: int
    train_time: float
    epochs: float


def share_done(limits: Limits, at: Position) -> float | None:
    """The share of the run done, by the limit nearest to being reached; None without limits."""
    shares = []
    if limits.max_steps > 0:
        shares.append(at.step / limits.max_steps)
    if limits.time_limit > 0:
        shares.append(at.train_time / limits.time_limit)
    if limits.max_epochs > 0:
        shares.append(at.epochs / limits.max_epochs)
    return min(max(shares), 1.0) if shares else None


def seconds_left(limits: Limits, at: Position) -> float | None:
    """Seconds of training until the first limit is reached, at the rate so far; None when no
    limit is set or the rate is not known yet."""
    left = []
    if limits.time_limit > 0:
        left.append(limits.time_limit - at.train_time)
    if at.train_time > 0:
        if limits.max_steps > 0 and at.step > 0:
            left.append((limits.max_steps - at.step) * at.train_time / at.step)
        if limits.max_epochs > 0 and at.epochs > 0:
            left.append((limits.max_epochs - at.epochs) * at.train_time / at.epochs)
    return max(min(left), 0.0) if left else None


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` (or ``m:ss`` under an hour)."""
    whole = int(round(seconds))
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def describe(limits: Limits, at: Position, figures: dict[str, str]) -> str:
    """The text after the bar: the step (of max_steps), time spent and left, and ``figures``."""
    step = f"step {at.step}" + (f"/{limits.max_steps}" if limits.max_steps else "")
    left = seconds_left(limits, at)
    timing = format_duration(at.train_time)
    if left is not None:
        timing += f" < {format_duration(left)} left"
    return ", ".join([step, timing, *(f"{k} {v}" for k, v in figures.items())])


class ProgressBar:
    """The bar of one training run (nothing at all off a terminal, or when ``enabled`` is
    False)."""

    def __init__(self, limits: Limits, enabled: bool, stream: TextIO | None = None) -> None:
        stream = stream if stream is not None else sys.stderr
        self.limits = limits
        self.figures: dict[str, str] = {}
        self.bar = tqdm(
            total=1000,
            bar_format="{percentage:3.0f}%|{bar}| {desc}",
            file=stream,
            disable=not on_terminal(stream, enabled),
            dynamic_ncols=True,
        )

    def note(self, **figures: str) -> None:
        """Figures (loss, BLEU, tokens/s...) the next :meth:`show` draws, replacing those of
        the same name."""
        self.figures.update(figures)

    def show(self, at: Position, **figures: str) -> None:
        """Draw the bar at ``at``, with ``figures`` noted first."""
        self.note(**figures)
        if self.bar.disable:
            return
        share = share_done(self.limits, at)
        self.bar.n = int(1000 * share) if share is not None else 0
        self.bar.set_description_str(describe(self.limits, at, self.figures), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
