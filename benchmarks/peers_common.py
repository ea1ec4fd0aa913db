"""What every peer toolkit of ``make bench-peers`` shares (:mod:`benchmarks.peers`).

A peer is a module (:mod:`benchmarks.peer_eole`, :mod:`benchmarks.peer_marian`,
:mod:`benchmarks.peer_joeynmt`) that knows how to install one toolkit at a pinned version into
a virtual environment of its own, how to write that toolkit's training config for a
:class:`TrainJob`, and how to read that toolkit's training log into :class:`Window` rows.
The orchestrator (:mod:`benchmarks.peers`) runs the toolkits in alternating rounds and turns
the windows into figures; nothing here imports a peer's package: peers run as processes of
their own venv's python.

Every toolkit reads the same :class:`Workspace`: the Multi30k text files and one joint
sentencepiece model (ids 0-3 ``<unk> <pad> <s> </s>``), written by
:func:`benchmarks.joeynmt_setup.prepare_joey_dir`.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nmt.environment import child_environment

# the model shape every toolkit is asked for: nmt's default Transformer (TransformerConfig)
SHAPE = {
    "transformer": {
        "layers": 3,
        "width": 256,
        "heads": 4,
        "ffn": 1024,
        "dropout": 0.1,
        "label_smoothing": 0.1,
        "tied": "all three embeddings (joint vocabulary)",
    },
    # nmt's default GRU + Bahdanau model (GRUBahdanauConfig)
    "gru": {"embedding": 256, "hidden": 512, "encoder": "1-layer bidirectional GRU"},
}


@dataclass(frozen=True)
class Workspace:
    """The prepared files every toolkit reads: ``data/{train,val,val300,test_2016_flickr}.{de,en}``
    and ``spm/spm_joint8k.{model,vocab}`` under ``root``."""

    root: Path
    # nmt's data.root: its own Multi30k preparation of the same lines
    data_root: Path = Path("data")
    src: str = "de"
    tgt: str = "en"

    def text(self, split: str, lang: str) -> Path:
        return self.root / "data" / f"{split}.{lang}"

    @property
    def spm_model(self) -> Path:
        return self.root / "spm" / "spm_joint8k.model"

    @property
    def spm_vocab(self) -> Path:
        return self.root / "spm" / "spm_joint8k.vocab"


@dataclass(frozen=True)
class TrainJob:
    """One training segment a toolkit runs: ``steps`` updates of ``model`` in ``precision``,
    aiming at ``tgt_tokens_per_step`` target tokens per update, logging every ``log_every``
    updates, with ``threads`` threads, its files under ``work``."""

    model: str  # "transformer" or "gru"
    precision: str  # "32" or "bf16"
    steps: int
    tgt_tokens_per_step: int
    threads: int
    work: Path
    log_every: int = 1
    seed: int = 1234


@dataclass(frozen=True)
class Window:
    """One logging window of a toolkit's training log: the last update it covers, how many
    updates it covers, its seconds and the target tokens it trained on (EOS included, padding
    excluded, as the toolkit counts them)."""

    step: int
    steps: int
    seconds: float
    tgt_tokens: float

    @property
    def tokens_per_s(self) -> float:
        return self.tgt_tokens / self.seconds


@dataclass
class Command:
    """A process to run: argv, its working folder, extra environment, where its output goes
    (``log``: stdout and stderr together) and the file its windows are read from."""

    argv: list[str]
    cwd: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    windows_from: Path | None = None  # the file the windows are read from, if not ``log``
    stdout: Path | None = None  # standard output into this file, apart from ``log``
    stdin: Path | None = None  # standard input read from this file

    @property
    def windows_file(self) -> Path:
        return self.windows_from or self.log


def command(argv: list[str], work: Path, log: str | Path, threads: int, **more: Any) -> Command:
    """A :class:`Command` run in ``work`` with its output into ``work/log`` (``log`` itself
    when absolute) and ``threads`` OpenMP and MKL threads."""
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return Command(argv=argv, cwd=work, log=work / log, env=env, **more)


@dataclass(frozen=True)
class Finished:
    """How a process ended: exit code, seconds, peak resident memory, and when the stop
    signal was sent (seconds after the start; None when it was not)."""

    rc: int
    seconds: float
    peak_rss_bytes: int
    signalled: float | None = None


GRACE_SECONDS = 600  # after the stop signal, before the process is killed


def run(
    cmd: Command, limit: float, stop_after: float | None = None, stop_signal: int | None = None
) -> Finished:
    """Run ``cmd`` (without the caller's PYTHONPATH); ``stop_after`` seconds after its start
    send ``stop_signal`` (SIGTERM when None) and give it :data:`GRACE_SECONDS` to exit; kill
    it at ``limit`` seconds in any case. The caller waits on the process itself, so its
    seconds are exact (timers send the signals)."""
    env = child_environment(**cmd.env)
    env.pop("PYTHONPATH", None)
    signalled: list[float] = []
    with ExitStack() as stack:
        log = stack.enter_context(cmd.log.open("w"))
        out = stack.enter_context(cmd.stdout.open("w")) if cmd.stdout else log
        inp = stack.enter_context(cmd.stdin.open()) if cmd.stdin else subprocess.DEVNULL
        tic = time.perf_counter()
        proc = subprocess.Popen(cmd.argv, cwd=cmd.cwd, env=env, stdin=inp, stdout=out, stderr=log)
        timers = [threading.Timer(limit, proc.kill)]

        def stop() -> None:
            signalled.append(time.perf_counter() - tic)
            proc.send_signal(stop_signal or signal.SIGTERM)
            grace = threading.Timer(GRACE_SECONDS, proc.kill)
            timers.append(grace)
            grace.start()

        if stop_after is not None:
            timers.append(threading.Timer(stop_after, stop))
        for timer in list(timers):
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            for timer in list(timers):
                timer.cancel()
    seconds = time.perf_counter() - tic
    rc = os.waitstatus_to_exitcode(status)
    return Finished(rc, seconds, usage.ru_maxrss * 1024, signalled[0] if signalled else None)


def fresh(folder: Path) -> Path:
    """``folder``, emptied: a run's files never mix with an earlier run's."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def failure(name: str, what: str, rc: int, cmd: Command) -> RuntimeError:
    """The error of a toolkit's process that failed: its command and the end of its log."""
    tail = "\n".join(cmd.log.read_text(errors="replace").splitlines()[-20:])
    return RuntimeError(f"{name} failed (exit {rc}) in {what}: {' '.join(cmd.argv)}\n{tail}")


NATIVE = "native"  # the toolkit's own translator
CT2 = "ctranslate2"  # CTranslate2, on the toolkit's own conversion of its model


@dataclass(frozen=True)
class Decoding:
    """One decoding of ``src`` into ``out`` at ``beam``, in batches of one sentence when
    ``one_at_a_time``, by the toolkit's own translator (``engine`` :data:`NATIVE`) or by one of
    the other engines its module lists in ``ENGINES`` (:data:`CT2`: CTranslate2, decoding the
    model its module's ``convert_command`` wrote)."""

    src: Path
    out: Path
    beam: int = 5
    one_at_a_time: bool = False
    engine: str = NATIVE


@dataclass(frozen=True)
class RecipeJob:
    """One training run of a toolkit's own recipe for ``seconds`` of wall-clock time (the
    harness sends the toolkit's stop signal then), with ``threads`` threads, under ``work``."""

    seconds: float
    threads: int
    work: Path
    seed: int = 1234


class Peer(Protocol):
    """What a peer module provides (module attributes and functions)."""

    NAME: str
    VERSION: str
    REQUIREMENTS: tuple[tuple[str, ...], ...]  # pip install steps into the fresh venv, in order
    PROBE: str  # python code run by the venv's python that prints the versions as JSON
    PRECISIONS: dict[str, tuple[str, ...]]  # model -> precisions the toolkit offers on a CPU
    DIFFERENCES: dict[str, list[str]]  # model -> how its model differs from nmt's

    def train_command(self, python: Path, job: TrainJob, ws: Workspace) -> Command: ...

    def parse_train_log(self, text: str) -> list[Window]: ...

    # the budgeted run of the toolkit's own recipe and the decoding of its result
    RECIPE: dict[str, Any]  # source, settings and what was adapted
    STOP_SIGNAL: int | None  # sent at the deadline (None: the toolkit stops by itself)

    def recipe_command(self, python: Path, job: RecipeJob, ws: Workspace) -> Command: ...

    def decode_command(
        self, python: Path, job: RecipeJob, ws: Workspace, d: Decoding
    ) -> Command: ...


def steady_windows(windows: Sequence[Window], skip_steps: int) -> list[Window]:
    """The windows that start after the first ``skip_steps`` updates (warm-up left out)."""
    return [w for w in windows if w.step - w.steps >= skip_steps]


def window_stats(windows: Sequence[Window], skip_steps: int) -> dict[str, Any]:
    """Throughput of a segment over its steady windows: the median of the windows' target
    tokens/s, the overall rate, and seconds per update."""
    timed = steady_windows(windows, skip_steps)
    if not timed:
        last = windows[-1].step if windows else 0
        raise ValueError(f"no logging window after the first {skip_steps} updates (last {last})")
    steps = sum(w.steps for w in timed)
    seconds = sum(w.seconds for w in timed)
    tokens = sum(w.tgt_tokens for w in timed)
    return {
        "timed_windows": len(timed),
        "timed_steps": steps,
        "first_timed_step": timed[0].step - timed[0].steps + 1,
        "window_tokens_per_s": [round(w.tokens_per_s, 1) for w in timed],
        "tgt_tokens_per_s": statistics.median(w.tokens_per_s for w in timed),
        "tgt_tokens_per_s_overall": tokens / seconds,
        "step_seconds_median": statistics.median(w.seconds / w.steps for w in timed),
        "tgt_tokens_per_step_mean": tokens / steps,
    }
