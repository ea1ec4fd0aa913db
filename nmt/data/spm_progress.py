"""A bar over sentencepiece training, which otherwise runs silently for many seconds.

The trainer reports its steps only in its C++ log on standard error: the sentences loaded and
normalized, then for a unigram model the seed pieces and each round of EM and pruning down to
the vocabulary size, for a BPE model every hundredth merge. On a terminal, :func:`followed`
puts a pipe in the place of standard error while the trainer runs, reads the steps from it
and draws them as a bar that knows its end: the number of EM rounds left follows from the
pieces still to prune (each round keeps ``SHRINKING`` of them, down to ``VOCAB_SLACK`` times the
vocabulary size), the number of merges from the vocabulary size and the alphabet. The trainer's
warnings and errors are written above the bar, its informational lines are not shown. Off a
terminal nothing changes: the trainer logs warnings and errors only, as before.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from nmt.cli import Progress

SHRINKING = 0.75  # sentencepiece's shrinking_factor: the share of pieces a pruning round keeps
VOCAB_SLACK = 1.1  # unigram training stops pruning at this many times the vocabulary size
SUB_ITERATIONS = 2  # sentencepiece's num_sub_iterations: EM steps per round
MERGES_PER_LINE = 100  # a BPE trainer logs every hundredth merge
SPECIAL = 4 + 256  # pad, unk, bos, eos and the 256 byte pieces of byte_fallback

# a log record's first line: absl's "I0000 00:00:... file.cc:123] ..." or glog's "LOG(INFO)"
RECORD = re.compile(r"^(?:([IWEF])\d{4} \S+ +\d+ \S+\] |.*?LOG\((INFO|WARNING|ERROR|FATAL)\) )")
ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog()"
LOADED = re.compile(r"Loaded all (\d+) sentences")
NORMALIZED = re.compile(r"Done! preprocessed (\d+) sentences")
ALPHABET = re.compile(r"Alphabet size=(\d+)")
SEEDS = re.compile(r"Initialized (\d+) seed")
EM_STEP = re.compile(r"EM sub_iter=(\d+) size=(\d+)")
MERGED = re.compile(r"Merged: .*merges=(\d+)")


def rounds_left(pieces: int, vocab_size: int) -> int:
    """EM rounds a unigram model of ``pieces`` has after this one: each prunes to ``SHRINKING``
    of the pieces, and the last is the one after which a pruning would reach the target."""
    target = VOCAB_SLACK * vocab_size
    left = 0
    while pieces * SHRINKING > target:
        pieces = int(pieces * SHRINKING)
        left += 1
    return left


class TrainerSteps:
    """The steps of one sentencepiece training, read from its log: ``done`` of ``total`` (the
    total firms up as the trainer reports the sizes it works with) and what it is doing."""

    def __init__(self, model_type: str, vocab_size: int) -> None:
        self.unigram = model_type == "unigram"
        self.vocab_size = vocab_size
        self.done = 0
        # loaded, normalized, then the seeds and one EM round at least, or one hundred merges
        self.total = 4 if self.unigram else 3
        self.rounds = 0
        self.status = "reading sentences"

    def feed(self, message: str) -> bool:
        """Take one log message (its text after the record prefix); True if a step ended."""
        if m := LOADED.search(message):
            self._step(1, f"normalizing {int(m[1]):,} sentences")
        elif m := NORMALIZED.search(message):
            what = "extracting seed pieces" if self.unigram else "merging"
            self._step(2, what)
        elif not self.unigram and (m := ALPHABET.search(message)):
            merges = max(1, self.vocab_size - SPECIAL - int(m[1]))
            self.total = 2 + math.ceil(merges / MERGES_PER_LINE)
            return False
        elif self.unigram and (m := SEEDS.search(message)):
            self._step(3, f"EM over {int(m[1]):,} seed pieces")
        elif self.unigram and (m := EM_STEP.search(message)):
            if int(m[1]) != SUB_ITERATIONS - 1:
                return False
            self.rounds += 1
            pieces = int(m[2])
            left = rounds_left(pieces, self.vocab_size)
            self.total = 3 + self.rounds + left
            status = f"EM round {self.rounds}: {pieces:,} pieces, {self.vocab_size:,} wanted"
            self._step(3 + self.rounds, status)
        elif not self.unigram and (m := MERGED.search(message)):
            merges = int(m[1])
            self._step(2 + merges // MERGES_PER_LINE, f"{merges:,} merges")
        else:
            return False
        return True

    def _step(self, done: int, status: str) -> None:
        self.done = max(self.done, done)
        self.total = max(self.total, self.done)
        self.status = status


class LogReader:
    """Sorts the trainer's log lines: informational ones feed ``steps`` and update ``bar``,
    warnings and errors (with the lines that continue them) are written above the bar."""

    def __init__(self, steps: TrainerSteps, bar: Any) -> None:
        self.steps, self.bar = steps, bar
        self.shown = False  # whether the record being continued is shown

    def line(self, text: str) -> None:
        text = text.rstrip("\n")
        record = RECORD.match(text)
        if record is None:
            if text.startswith(ABSL_NOTICE) or not text.strip():
                return
            if self.shown:
                self.bar.write(text)
            return
        level = record[1] or record[2][0]
        self.shown = level != "I"
        if self.shown:
            self.bar.write(text)
        elif self.steps.feed(text[record.end() :]):
            self.bar.total = self.steps.total
            self.bar.n = self.steps.done
            self.bar.set_postfix_str(self.steps.status)  # redraws


STDERR = 2  # the descriptor the trainer's C++ log is written to


def _terminal(stream: TextIO, saved: int) -> tuple[TextIO, bool]:
    """Where the bar can be drawn while the descriptor of standard error leads into the pipe:
    ``stream`` itself, or, when it writes where standard error did, a file over ``saved`` (a
    copy of the descriptor from before; the second value says it must be closed)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return stream, False
    if not os.path.samestat(os.fstat(fd), os.fstat(saved)):
        return stream, False
    stream.flush()
    return os.fdopen(os.dup(saved), "w", encoding="utf-8", errors="replace"), True


@contextlib.contextmanager
def followed(
    progress: Progress, label: str, model_type: str, vocab_size: int
) -> Iterator[dict[str, Any]]:
    """The logging arguments of ``SentencePieceTrainer.train`` for a training in the block: on
    a terminal (``progress.drawn``), a bar labelled ``label`` that follows the trainer's log,
    read from a pipe that stands in for standard error meanwhile; otherwise the trainer's
    warnings and errors only, on standard error."""
    if not progress.drawn:
        yield {"minloglevel": 1}
        return
    steps = TrainerSteps(model_type, vocab_size)
    saved = os.dup(STDERR)
    terminal, own = _terminal(progress.stream, saved)
    try:
        with progress.steps(label, steps.total, steps.status, terminal) as bar:
            reader = LogReader(steps, bar)
            read_fd, write_fd = os.pipe()

            def drain() -> None:
                with os.fdopen(read_fd, encoding="utf-8", errors="replace") as lines:
                    for text in lines:
                        reader.line(text)

            thread = threading.Thread(target=drain, name="sentencepiece log", daemon=True)
            thread.start()
            sys.stderr.flush()
            os.dup2(write_fd, STDERR)
            os.close(write_fd)  # standard error is now the pipe's only writer
            try:
                yield {"minloglevel": 0}
            finally:
                os.dup2(saved, STDERR)  # the pipe closes: the reader reads to its end
                thread.join()
            bar.total = bar.n = steps.total  # the vocabulary is complete
            bar.set_postfix_str(f"{vocab_size:,} pieces")
    finally:
        os.close(saved)
        if own:
            terminal.close()
