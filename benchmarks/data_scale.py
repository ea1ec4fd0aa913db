"""Scale benchmark of the data path: ``make bench-data``.

For each corpus size N (default 29,000, 290,000 and 2,900,000 pairs) it builds a synthetic
de-en corpus of N distinct pairs from Multi30k's training split (numbered copies:
:mod:`nmt.data.synthetic`) and measures, one process after the other:

* ``prepare``: a first preparation (``nmt-prepare``, no cache): wall time, the peak resident
  memory of the preparing process (exact, from the kernel), and the peak over the process tree
  (the encoding workers included) of the summed RSS and of the summed PSS, sampled every 50 ms;
  the preparation's own phase timings from its manifest;
* ``train``: a training run on the prepared cache (``nmt-train``, the second run on the data):
  seconds from process start to its first update (and to the moments its data was read and its
  model and batches were ready), from the run's events (``metrics.jsonl``: the start event's
  ``data_time`` and time, the first train event), its peak resident memory until then;
* ``ddp``: two DDP ranks (torchrun, gloo, CPU) on the same cache, run to rank 0's update
  ``--ddp-steps``: the summed PSS of the two ranks (``/proc/<pid>/smaps_rollup``; shared
  pages, such as the memory-mapped cache and the libraries, count once in total) when rank 0
  has its data, model and batches ready (with its anonymous and file-backed parts), its
  lowest value between update 1 and the last (``steady``: what stays between the updates'
  activations) and its peak.

The training runs use ``trainer.precision=32`` unless ``--precision`` says otherwise. The
machine's load average is recorded around each measurement: on a shared machine the
times are noisy. Writes JSON (default ``outputs/bench/bench-data-<timestamp>.json``) and prints
a table and the issue's targets where the sizes allow (``scripts/bench_data.py`` is the command
line)::

    python scripts/bench_data.py                          # or: make bench-data
    python scripts/bench_data.py --pairs 29000,290000     # some sizes only
    python scripts/bench_data.py --quick                  # 29,000 and 58,000 pairs: a smoke run
    python scripts/bench_data.py --set model=gru_bahdanau # any config override

The corpora and prepared caches live under ``--work`` (default ``outputs/bench/data``); each
size's cache is deleted before its first preparation, the corpora are kept for the next run.
"""

from __future__ import annotations

import collections
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.memory import TreeSampler, cmdline, kill_tree, load_average, rss, wait_with_rusage
from benchmarks.report import say as _say
from benchmarks.report import table
from nmt.data.corpus import fetch_multi30k, read_parallel
from nmt.data.synthetic import count_pairs, write_numbered_copies
from nmt.environment import child_environment, multi30k_source
from nmt.train.runlog import METRICS_FILE

SCHEMA = "nmt-bench-data/1"
MB = 1 << 20
TARGETS = {
    "prepare_seconds": 60.0,  # first preparation at 2.9M pairs
    "prepare_peak_bytes": 2 << 30,  # peak resident memory of the preparing process
    "prepare_peak_growth": 0.25,  # from 290k to 2.9M pairs
    "startup_seconds": 5.0,  # second run: process start to first update
    "ddp_pss_extra_bytes": 200 * MB,  # 2 ranks at 2.9M pairs over 2 ranks on Multi30k
}


def say(msg: str) -> None:
    """Progress on stderr."""
    _say("bench-data", msg)


# ------------------------------------------------------------------------------ running


@dataclass
class Watched:
    """A finished (or stopped) measured command."""

    returncode: int
    seconds: float  # start to exit, or to the awaited line
    matched: bool
    tail: str
    main_peak_rss: int  # the command's own process (kernel high-water mark)
    tree_rss: int  # peak over samples of the summed RSS of the selected processes
    tree_pss: int  # peak over samples of the summed PSS
    pss_at_match: int  # summed PSS sampled when the awaited line came
    marks: dict[str, float]  # seconds from start to the first line matching each mark
    marks_pss: dict[str, tuple[int, int, int]]  # summed PSS (total, anon, file) at each mark
    series: list[tuple[float, int]]  # (seconds from start, summed PSS) of every sample


EventTime = Callable[[dict[str, Any]], float | None]  # an event -> a Unix time, or None


def event_time(kind: str, key: str = "time", step: int = 0) -> EventTime:
    """A mark: the ``key`` time of the first ``kind`` event at ``step`` or later."""
    return lambda e: e.get(key) if e["event"] == kind and e["step"] >= step else None


class EventFollower:
    """Reads the events a running training appends to ``<run>/metrics.jsonl``, as they come."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.offset = 0

    def new(self) -> list[dict[str, Any]]:
        """The events whose lines were completed since the last call."""
        if not self.path.is_file():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.decode().splitlines() if line.strip()]


class _Marks:
    """The marks a watched run's events give: seconds from start, and the summed PSS then."""

    def __init__(self, marks: dict[str, EventTime], sampler: TreeSampler, wall: float) -> None:
        self.marks, self.sampler, self.wall = marks, sampler, wall
        self.seen: dict[str, float] = {}
        self.pss: dict[str, tuple[int, int, int]] = {}

    def note(self, event: dict[str, Any]) -> None:
        for name, mark in self.marks.items():
            when = mark(event)
            if name not in self.seen and when is not None:
                self.seen[name] = when - self.wall
                m = self.sampler.sample()
                self.pss[name] = (m.last_pss_sum, m.last_pss_anon, m.last_pss_file)


def _launch(
    cmd: list[str], env: dict[str, str], cwd: Path
) -> tuple[subprocess.Popen, collections.deque[str], threading.Thread]:
    """Start ``cmd`` in a session of its own; its output's last lines are kept (for an error
    message) by a reader thread."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    tail: collections.deque[str] = collections.deque(maxlen=60)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, tail, reader


def watch(
    cmd: list[str],
    env: dict[str, str],
    cwd: Path,
    run_dir: Path | None = None,
    until: EventTime | None = None,
    select: Any = None,
    timeout: float = 3600,
    marks: dict[str, EventTime] | None = None,
) -> Watched:
    """Run ``cmd``, sampling its process tree and following the events of the training run it
    writes into ``run_dir``; with ``until``, stop it (its whole process tree) as soon as an event
    gives that time. ``marks``: the times, from start, that the first event giving each records
    (the summed PSS is sampled when the event is seen)."""
    start, wall = time.monotonic(), time.time()
    proc, tail, reader = _launch(cmd, env, cwd)
    sampler = TreeSampler(proc.pid, interval=0.05, select=select)
    seen = _Marks(marks or {}, sampler, wall)
    follower = EventFollower(run_dir) if run_dir is not None else None
    matched_at: float | None = None
    main_peak = pss_at_match = 0
    try:
        with sampler:
            if until is None:
                code, main_peak = wait_with_rusage(proc.pid)
                proc.returncode = code
            else:
                while proc.poll() is None and time.monotonic() < start + timeout:
                    events = follower.new() if follower is not None else []
                    for event in events:
                        seen.note(event)
                    if any(until(e) is not None for e in events):
                        matched_at, main_peak = time.monotonic(), rss(proc.pid)[1]
                        pss_at_match = sampler.sample().last_pss_sum
                        break
                    time.sleep(0.02)
    finally:  # an interrupted benchmark leaves no process behind (torchrun's ranks included)
        if proc.poll() is None:
            kill_tree(proc.pid)
        proc.wait()
    reader.join(timeout=10)
    end = matched_at if matched_at is not None else time.monotonic()
    return Watched(
        returncode=proc.returncode,
        seconds=end - start,
        matched=matched_at is not None,
        tail="".join(tail),
        main_peak_rss=main_peak,
        tree_rss=sampler.peak.rss_sum,
        tree_pss=sampler.peak.pss_sum,
        pss_at_match=pss_at_match,
        marks=seen.seen,
        marks_pss=seen.pss,
        series=[(t - start, v) for t, v in sampler.peak.series],
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ one size


def make_corpus(base: Path, work: Path, pairs: int) -> Path:
    """The synthetic corpus of ``pairs`` pairs (reused when present); returns its prefix."""
    prefix = work / "corpus" / f"synthetic_{pairs}"
    stamp = Path(f"{prefix}.json")
    files = [Path(f"{prefix}.de"), Path(f"{prefix}.en")]
    if stamp.is_file() and all(f.is_file() for f in files):
        info = json.loads(stamp.read_text())
        if info.get("pairs") == pairs and info.get("sizes") == [f.stat().st_size for f in files]:
            return prefix
    say(f"writing a synthetic corpus of {pairs:,} pairs")
    write_numbered_copies(base / "train.de.gz", base / "train.en.gz", prefix, ("de", "en"), pairs)
    assert count_pairs(*files) == pairs
    stamp.write_text(json.dumps({"pairs": pairs, "sizes": [f.stat().st_size for f in files]}))
    return prefix


def write_valid(base: Path, work: Path) -> Path:
    prefix = work / "corpus" / "val"
    src, tgt = read_parallel(base / "val.de.gz", base / "val.en.gz")
    for lang, lines in (("de", src), ("en", tgt)):
        Path(f"{prefix}.{lang}").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return prefix


def bench_size(pairs: int, s: DataScaleSettings, base: Path, valid: Path) -> dict[str, Any]:
    """Preparation, start-up and DDP memory at one corpus size."""
    prefix = make_corpus(base, s.work, pairs)
    root = s.work / f"root_{pairs}"
    shutil.rmtree(root, ignore_errors=True)  # a first preparation: no caches at all
    data = [
        "data=parallel", "data.src_lang=de", "data.tgt_lang=en", f"data.train={prefix}",
        f"data.valid={valid}", "data.test=[]", f"data.root={root}",
        f"data.num_workers={s.workers}", *s.overrides,
    ]  # fmt: skip
    text_bytes = sum(Path(f"{prefix}.{lang}").stat().st_size for lang in ("de", "en"))
    result: dict[str, Any] = {"pairs": pairs, "text_bytes": text_bytes}
    say(f"{pairs:,} pairs: first preparation")
    result["prepare"] = measure_preparation(data, s)
    train = [
        *data, "trainer.device=cpu", f"trainer.precision={s.precision}",
        "trainer.log_every=1", "trainer.val_every=1000000",
        "trainer.max_steps=1000000", "trainer.progress=false", "trainer.attention_sentences=0",
        f"outputs={s.work / 'outputs'}",
    ]  # fmt: skip
    say(f"{pairs:,} pairs: a training run on the prepared data, to its first update")
    result["train"] = measure_startup(train, s)
    if s.ddp_steps:
        say(f"{pairs:,} pairs: 2 DDP ranks (gloo) to update {s.ddp_steps}")
        result["ddp"] = measure_ddp(train, s)
    if not s.keep_caches:
        shutil.rmtree(root, ignore_errors=True)
    return result


def _env() -> dict[str, str]:
    return child_environment(PYTHONUNBUFFERED="1")


def measure_preparation(data: list[str], s: DataScaleSettings) -> dict[str, Any]:
    """A first ``nmt-prepare`` with the ``data`` overrides: time, memory, phases, cache size."""
    before = load_average()
    prep = watch([sys.executable, "-m", "nmt.data.prepare", *data], _env(), s.cwd)
    if prep.returncode != 0:
        raise SystemExit(f"nmt-prepare failed:\n{prep.tail}")
    cache = Path(prep.tail.strip().splitlines()[-1])
    manifest = json.loads((cache / "manifest.json").read_text())
    return {
        "seconds": prep.seconds,
        "peak_rss_bytes": prep.main_peak_rss,
        "tree_peak_rss_sum_bytes": prep.tree_rss,
        "tree_peak_pss_sum_bytes": prep.tree_pss,
        "workers": manifest["workers"],
        "phases": {k: manifest.get(k) for k in ("sample_seconds", "spm_seconds", "encode_seconds")},
        "kept_pairs": manifest["pairs"],
        "cache_bytes": sum(p.stat().st_size for p in cache.iterdir()),
        "load_before": before,
        "load_after": load_average(),
    }


def measure_startup(train: list[str], s: DataScaleSettings) -> dict[str, Any]:
    """A training run on the prepared data, stopped at its first update: the seconds to it."""
    before = load_average()
    run_dir = s.work / "outputs" / "one"
    shutil.rmtree(run_dir, ignore_errors=True)  # events of an earlier run are not this one's
    run = watch(
        [sys.executable, "-m", "nmt.train", *train, f"hydra.run.dir={run_dir}"],
        _env(),
        s.cwd,
        run_dir,
        until=event_time("train", step=1),
        marks={"data": event_time("start", "data_time"), "ready": event_time("start")},
    )
    if not run.matched:
        raise SystemExit(f"training never reached its first update:\n{run.tail}")
    return {
        "startup_seconds": run.seconds,
        # process start to: data prepared and valid set read; model, optimizer and sampler
        # built (the start event); the first update is what follows (its train event)
        "data_seconds": run.marks.get("data"),
        "ready_seconds": run.marks.get("ready"),
        "peak_rss_bytes": run.main_peak_rss,
        "load_before": before,
        "load_after": load_average(),
    }


def _is_rank(pid: int) -> bool:
    """A DDP rank process (not the torchrun launcher)."""
    line = cmdline(pid)
    return "nmt.train" in line and "torch.distributed.run" not in line


def measure_ddp(train: list[str], s: DataScaleSettings) -> dict[str, Any]:
    """Two DDP ranks (torchrun, gloo) run to update ``s.ddp_steps``: their summed memory."""
    before = load_average()
    ddp_dir = s.work / "outputs" / "ddp"
    shutil.rmtree(ddp_dir, ignore_errors=True)
    launch = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        f"--master-port={free_port()}", "-m", "nmt.train", *train, "trainer.threads=1",
        f"hydra.run.dir={ddp_dir}",
    ]  # fmt: skip
    ddp = watch(
        launch,
        {**_env(), "OMP_NUM_THREADS": "1"},
        s.cwd,
        ddp_dir,
        until=event_time("train", step=s.ddp_steps),
        select=_is_rank,
        marks={"ready": event_time("start"), "first": event_time("train", step=1)},
    )
    if not ddp.matched:
        raise SystemExit(f"DDP training never reached update {s.ddp_steps}:\n{ddp.tail}")
    ready = ddp.marks_pss.get("ready", (None, None, None))
    first = ddp.marks.get("first", 1e9)
    return {
        "ranks": 2,
        "steps": s.ddp_steps,
        # summed PSS when rank 0 has its data, model and batches (before any update):
        # total, anonymous (heap) and file-backed (mapped cache and libraries) parts
        "ready_pss_sum_bytes": ready[0],
        "ready_pss_anon_bytes": ready[1],
        "ready_pss_file_bytes": ready[2],
        "pss_sum_bytes": ddp.pss_at_match,
        # the lowest summed PSS from update 1 to the last: what stays between the updates'
        # activations (model, optimizer, data), the steadiest of these figures
        "steady_pss_sum_bytes": min(
            (v for t, v in ddp.series if first <= t <= ddp.seconds), default=None
        ),
        "peak_pss_sum_bytes": ddp.tree_pss,
        "peak_rss_sum_bytes": ddp.tree_rss,
        "seconds": ddp.seconds,
        "load_before": before,
        "load_after": load_average(),
    }


# ------------------------------------------------------------------------------ report


def targets(sizes: dict[int, dict[str, Any]]) -> list[str]:
    """The issue's targets, for the sizes measured (2.9M, 290k and Multi30k-size rows)."""
    lines = []
    big, mid, small = sizes.get(2_900_000), sizes.get(290_000), sizes.get(29_000)

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    if big:
        p = big["prepare"]
        lines.append(
            f"first preparation at 2.9M: {p['seconds']:.1f} s (target <= 60 s: "
            f"{mark(p['seconds'] <= TARGETS['prepare_seconds'])}), peak "
            f"{p['peak_rss_bytes'] / MB:.0f} MB (target <= 2048 MB: "
            f"{mark(p['peak_rss_bytes'] <= TARGETS['prepare_peak_bytes'])})"
        )
        s = big["train"]["startup_seconds"]
        lines.append(
            f"second run to its first update at 2.9M: {s:.1f} s (target <= 5 s: "
            f"{mark(s <= TARGETS['startup_seconds'])})"
        )
    if big and mid:
        growth = big["prepare"]["peak_rss_bytes"] / mid["prepare"]["peak_rss_bytes"] - 1
        lines.append(
            f"preparation peak growth 290k -> 2.9M: {100 * growth:+.0f}% (target <= +25%: "
            f"{mark(growth <= TARGETS['prepare_peak_growth'])})"
        )
    if big and small and "ddp" in big and "ddp" in small:
        for key, when in (("ready_pss_sum_bytes", "with data and batches ready"),
                          ("steady_pss_sum_bytes", "steady between updates"),
                          ("peak_pss_sum_bytes", "peak")):  # fmt: skip
            if big["ddp"].get(key) is None or small["ddp"].get(key) is None:
                continue
            extra = big["ddp"][key] - small["ddp"][key]
            lines.append(
                f"2 DDP ranks, PSS {when}, 2.9M minus 29k pairs: {extra / MB:+.0f} MB "
                f"(target <= 200 MB: {mark(extra <= TARGETS['ddp_pss_extra_bytes'])})"
            )
    return lines


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / MB:.0f}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def report(result: dict[str, Any]) -> str:
    header = ["pairs", "text MB", "prep s", "prep peak MB", "tree RSS MB", "tree PSS MB",
              "workers", "data s", "ready s", "update s", "train peak MB", "ranks PSS ready",
              "anon", "file", "steady", "peak"]  # fmt: skip
    rows = []
    for r in result["sizes"]:
        p, t, d = r["prepare"], r["train"], r.get("ddp", {})
        rows.append([
            f"{r['pairs']:,}", _mb(r["text_bytes"]), _s(p["seconds"]), _mb(p["peak_rss_bytes"]),
            _mb(p["tree_peak_rss_sum_bytes"]), _mb(p["tree_peak_pss_sum_bytes"]),
            str(p["workers"]), _s(t["data_seconds"]), _s(t["ready_seconds"]),
            _s(t["startup_seconds"]), _mb(t["peak_rss_bytes"]),
            _mb(d.get("ready_pss_sum_bytes")), _mb(d.get("ready_pss_anon_bytes")),
            _mb(d.get("ready_pss_file_bytes")), _mb(d.get("steady_pss_sum_bytes")),
            _mb(d.get("peak_pss_sum_bytes")),
        ])  # fmt: skip
    m = result["machine"]
    lines = [f"{m['cpus']} CPUs, load average {m['load_start']} at the start", table(header, rows)]
    return "\n".join([*lines, *targets({r["pairs"]: r for r in result["sizes"]})])


# ------------------------------------------------------------------------------ main


@dataclass
class DataScaleSettings:
    """Corpus sizes to measure and how (the fields of ``scripts/bench_data.py``'s options)."""

    sizes: list[int]
    work: Path  # corpora, caches and runs
    data_root: Path  # where Multi30k is (or is fetched)
    cwd: Path  # where the measured commands run (the repository)
    command: list[str]  # the command line, recorded in the JSON
    quick: bool = False
    workers: int = 0  # data.num_workers (0: the cores)
    ddp_steps: int = 6  # DDP updates before the ranks' memory is read (0: no DDP run)
    precision: str = "32"
    keep_caches: bool = False
    overrides: list[str] = field(default_factory=list)


def run(s: DataScaleSettings) -> dict[str, Any]:
    """Every size, one after the other: the JSON-ready result."""
    (s.work / "corpus").mkdir(parents=True, exist_ok=True)
    base = fetch_multi30k(s.data_root, ["de", "en"], ["train", "val"], multi30k_source())
    valid = write_valid(base, s.work)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "quick": s.quick,
        "command": s.command,
        "machine": {
            "host": platform.node(),
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "load_start": load_average(),
        },
        "targets": TARGETS,
        "sizes": [],
    }
    for pairs in s.sizes:
        result["sizes"].append(bench_size(pairs, s, base, valid))
    result["machine"]["load_end"] = load_average()
    return result
