"""The data scale and memory soak benchmarks (benchmarks.data_scale, benchmarks.soak; their
scripts bench_data.py, bench_soak.py) and the process-tree memory they read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import soak
from benchmarks.data_scale import event_time, watch
from benchmarks.memory import TreeSampler, descendants, kill_tree, pss, rss
from nmt.train.runlog import RunLog, read_events

from .helpers import REPO, TINY_TRANSFORMER


def test_watch_follows_the_runs_events_and_stops_it(tmp_path: Path) -> None:
    """Marks and the stop come from metrics.jsonl, not from the command's output; the command
    (a stand-in for nmt-train that never ends by itself) is killed at the awaited event."""
    code = (
        "import sys, time; from nmt.train.runlog import RunLog; log = RunLog(sys.argv[1]); "
        "print('step 1: loss 9', flush=True); time.sleep(0.3); "
        "log.write('start', 0, data_time=time.time() - 0.2); time.sleep(0.3); "
        "[log.write('train', s, loss=1.0) for s in (1, 2, 3)]; time.sleep(120)"
    )
    tic = time.monotonic()
    run = watch(
        [sys.executable, "-c", code, str(tmp_path)], dict(os.environ), REPO, tmp_path,
        until=event_time("train", step=2),
        marks={"data": event_time("start", "data_time"), "ready": event_time("start"),
               "first": event_time("train", step=1)},
    )  # fmt: skip
    assert run.matched and time.monotonic() - tic < 60  # stopped, not waited for
    assert run.returncode != 0  # killed
    assert run.marks["data"] < run.marks["ready"] <= run.marks["first"] <= run.seconds
    assert run.marks["ready"] - run.marks["data"] >= 0.15
    assert set(run.marks_pss) == {"data", "ready", "first"}
    assert "step 1: loss" in run.tail  # its output is kept for an error message


def test_tree_sampler_sees_a_child_and_its_memory() -> None:
    code = (
        "import subprocess, sys, time; b = bytearray(64 << 20); "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; b = bytearray(32 << 20); "
        "time.sleep(3)']); time.sleep(3); c.wait()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        with TreeSampler(proc.pid, interval=0.05) as sampler:
            proc.wait(timeout=60)
    finally:
        proc.kill()
    assert sampler.peak.samples >= 5
    assert len(sampler.peak.hwm) >= 2  # the child was found and counted
    assert sampler.peak.rss_sum >= 96 << 20  # both bytearrays, summed over the tree
    assert sampler.peak.pss_sum >= 96 << 20
    me = descendants(os.getpid())
    assert me[0] == os.getpid()
    assert rss(me[0])[0] > 0 and rss(me[0])[1] >= rss(me[0])[0] and pss(me[0]) > 0
    assert rss(2**22 + 12345) == (0, 0) and pss(2**22 + 12345) == 0  # no such process


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_tree_reaches_children_in_sessions_of_their_own(tmp_path: Path) -> None:
    # like torchrun: the launcher starts its workers with start_new_session, so a signal to
    # the launcher's process group misses them, and killing the launcher alone orphans them
    pids = tmp_path / "pids"
    code = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " start_new_session=True) for _ in range(2)]\n"
        f"open({str(pids)!r}, 'w').write(' '.join(str(k.pid) for k in kids))\n"
        "time.sleep(120)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        for _ in range(600):
            if pids.is_file() and pids.read_text():
                break
            launcher.poll()

            time.sleep(0.05)
        workers = [int(p) for p in pids.read_text().split()]
        assert all(_alive(w) for w in workers)
        kill_tree(launcher.pid)
        launcher.wait(timeout=30)
        for _ in range(200):  # the orphans are reaped by init, which may take a moment
            if not any(_alive(w) for w in workers):
                break
            time.sleep(0.05)
        assert not any(_alive(w) for w in workers)
    finally:
        launcher.kill()


@pytest.mark.slow(seconds=24)
def test_bench_data_smoke_run(multi30k: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    sets = [f"--set={o}" for o in (*TINY_TRANSFORMER, "data.vocab_size=600", "data.max_tokens=600")]
    cmd = [
        sys.executable, "scripts/bench_data.py", "--pairs", "2000,4000", "--ddp-steps", "1",
        "--work", str(tmp_path / "work"), "--data-root", str(multi30k.parent),
        "--out", str(out), *sets,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["pairs"] for r in result["sizes"]] == [2000, 4000]
    for r in result["sizes"]:
        assert r["prepare"]["kept_pairs"] > 0.99 * r["pairs"]
        assert r["prepare"]["seconds"] > 0 and r["prepare"]["peak_rss_bytes"] > 20 << 20
        assert r["prepare"]["tree_peak_rss_sum_bytes"] >= r["prepare"]["peak_rss_bytes"] * 0.5
        t = r["train"]
        assert 0 < t["data_seconds"] <= t["ready_seconds"] <= t["startup_seconds"]
        assert r["ddp"]["pss_sum_bytes"] > 100 << 20  # two ranks with torch loaded
    assert "2,000" in proc.stdout and "4,000" in proc.stdout
    assert not list((tmp_path / "work").glob("root_*"))  # caches removed after each size


def test_soak_windows_count_only_samples_taken_while_training() -> None:
    samples = [(float(t), 1000 + t) for t in range(0, 300, 5)]  # (seconds, RSS)
    steps = [float(t) for t in range(10, 240, 20)]  # an update logged every 20 s
    # a validation from 100 to 130 s (then its checkpoint until the update at 150 s), and a
    # last one from 230 to 245 s with no update after it; training ends at 250 s
    kept = soak.training_samples(samples, [(100.0, 130.0), (230.0, 245.0)], steps, 250.0, 5.0)
    times = [t for t, _ in kept]
    assert 85.0 in times and 155.0 in times and 215.0 in times
    assert not [t for t in times if 90.0 <= t <= 150.0]  # one interval before, until the update
    assert not [t for t in times if t >= 220.0]  # the last validation runs to the end
    window = soak.window(kept, 60.0, 120.0)
    assert window["samples"] == 6 and window["median"] == 1000 + 72.5  # 60..85 s only
    assert soak.window(kept, 400.0, 460.0) is None


def test_soak_timeline_from_the_run_events(tmp_path: Path, monkeypatch) -> None:
    """Validations span (time - seconds, time); training windows are the train events; the
    loop ends with the last event before the averaged checkpoint."""
    clock = iter([1000.0, 1010.0, 1030.0, 1031.0, 1040.0, 1050.0, 1052.0, 1060.0, 1070.0])
    monkeypatch.setattr("nmt.train.runlog.time.time", lambda: next(clock))
    log = RunLog(tmp_path)
    log.write("start", 0, device="cpu")
    log.write("train", 10, loss=5.0, tokens_per_s=900.0)
    log.write("validation", 10, loss=4.0, bleu=1.0, chrf=10.0, seconds=12.0, best=True)
    log.write("checkpoint", 10, path="checkpoints/best.pt", best=True)
    log.write("train", 20, loss=4.5, tokens_per_s=950.0)
    log.write("validation", 20, loss=3.5, bleu=2.0, chrf=12.0, seconds=5.0, best=True)
    log.write("checkpoint", 20, path="checkpoints/best.pt", best=True)
    log.write("averaged", 20, checkpoints=["step_10", "step_20"], bleu=2.5)
    log.write("end", 20, epoch=1, train_time=50.0, stop_reason="max_steps")
    validations, steps, end = soak.timeline(read_events(tmp_path), origin=1000.0)
    assert validations == [(18.0, 30.0), (45.0, 50.0)]
    assert steps == [10.0, 40.0]
    assert end == 52.0  # the checkpoint after the last validation; averaging is left out
    assert soak.timeline(read_events(tmp_path / "none"), 0.0) == ([], [], None)
