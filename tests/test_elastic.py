"""Training that survives its machines, with real torchrun processes (gloo on CPU): a rank
SIGKILLed at a seeded update is restarted by torchrun and the run ends bit-identical to an
uninterrupted one; two torchrun agents (c10d rendezvous, the documented multi-node command)
equal one agent with two processes; a preemption signal checkpoints, exits for a restart (the
run's end written even when rank 0 is the slow one) and the restart loses no update; a changed
world size continues exactly or is refused."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.memory import descendants, kill_tree
from benchmarks.recovery import (
    RecoverySettings,
    kill_rank_at,
    run,
    torchrun_command,
    torchrun_environment,
    wait_for,
    worker_ranks,
)
from nmt.store.checkpoint import load_checkpoint, numbered_name
from nmt.train.runlog import of_kind, read_events

from .helpers import (
    DETERMINISTIC,
    REPO,
    assert_identical,
    made_once,
    run_in_process,
    tiny_run_overrides,
    training_outcome,
)
from .test_distributed import free_port

SEED = 20261202  # chooses the updates at which ranks are killed or signalled
STEPS = 12  # 4 batches per rank per epoch with 2 ranks: 3 epochs
RUN = (
    f"trainer.max_steps={STEPS}",
    "trainer.val_every=4",
    "trainer.log_every=1",
    "trainer.val_sentences=4",
    "trainer.patience=0",
    "trainer.keep_last=100",
    "trainer.device=cpu",
    "model.dropout=0.1",  # each rank draws its own dropout masks: a restart restores each one's
    "model.attn_dropout=0.0",
)
ENV = torchrun_environment(OMP_NUM_THREADS="1")  # as make train starts torchrun
DOCS = REPO / "docs" / "how-to" / "multi-gpu.md"


def overrides(corpus: Path, work: Path, *extra: str) -> list[str]:
    return tiny_run_overrides(corpus, work, *RUN, *extra)


def torchrun(args: list[str], log: Path, timeout: float = 300) -> int:
    """Run a torchrun command to its end, its output into ``log``; its exit status."""
    with open(log, "a") as out:
        proc = subprocess.Popen(args, cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)


def final(run_dir: Path) -> dict[str, Any]:
    return training_outcome(load_checkpoint(run_dir / "checkpoints" / "last.pt"))


# The reference runs are made once for the whole run (made_once: by the first worker of
# `make test` that needs one) and only read.


@pytest.fixture(scope="module")
def reference(corpus: Path, shared_tmp: Path) -> Path:
    """The run dir of an uninterrupted 2-process run (one agent)."""

    def make(work: Path) -> None:
        cmd = torchrun_command(2, 0, *overrides(corpus, work), f"hydra.run.dir={work / 'run'}")
        log = work / "reference.log"
        assert torchrun(cmd, log) == 0, log.read_text()[-3000:]

    return made_once(shared_tmp, "elastic-reference", make) / "run"


def in_process_reference(corpus: Path, shared_tmp: Path, name: str, *extra: str) -> Path:
    """The run dir of an uninterrupted run in one process (``run_in_process``), made once."""
    import torch

    def make(work: Path) -> None:
        threads = torch.get_num_threads()
        try:
            run_in_process(corpus, work, "run", *extra)
        finally:
            torch.set_num_threads(threads)

    return made_once(shared_tmp, name, make) / "outputs" / "runs" / "run"


@pytest.fixture(scope="module")
def one_process_reference(corpus: Path, shared_tmp: Path) -> Path:
    """The run of RUN in one process, with its dropout (the submitit and clock tests')."""
    return in_process_reference(corpus, shared_tmp, "elastic-one-process", *RUN)


@pytest.fixture(scope="module")
def accumulated_reference(corpus: Path, shared_tmp: Path) -> Path:
    """The run of RUN without dropout in one process accumulating 2 batches: the updates of
    2 ranks (the tests of two-process runs that compare weights up to the order of sums)."""
    return in_process_reference(corpus, shared_tmp, "elastic-accumulated", *RUN[:6],
                                *DETERMINISTIC, "trainer.accumulate=2")  # fmt: skip


@pytest.mark.slow(seconds=45)
def test_a_rank_killed_at_a_seeded_update_restarts_and_ends_as_if_never_killed(
    corpus: Path, reference: Path, tmp_path: Path
) -> None:
    kill_at = random.Random(SEED).randint(5, STEPS - 2)
    # no hydra.run.dir: the restarted workers make a new timestamped one unless the job's own
    # run directory is handed to them; the clock checkpoints every few updates, rank 0 decides
    args = [*overrides(corpus, tmp_path), "trainer.save_every_minutes=0.02"]
    cmd = torchrun_command(2, 2, *args)
    runs = tmp_path / "outputs" / "runs"
    log = tmp_path / "console.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT)
        try:
            run_dir = wait_for(lambda: next(iter(runs.glob("*/metrics.jsonl")), None), proc,
                               "the run directory", 120).parent  # fmt: skip
            kill = kill_rank_at(proc, run_dir, kill_at, 1, 120)
            assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
    # one run directory: others hold at most the .hydra folder of a worker killed early
    assert [p for p in runs.iterdir() if {q.name for q in p.iterdir()} - {".hydra"}] == [run_dir]
    events = read_events(run_dir)
    starts = of_kind(events, "start")
    assert len(starts) == 2, kill
    text = (run_dir / "train.log").read_text()
    assert f"torchrun restart 1: continuing {run_dir}" in text
    resumed = re.findall(r"resuming from (.+) at step (\d+)", text)
    assert resumed and int(resumed[-1][1]) == starts[1]["step"] <= kill["step_logged"]
    assert of_kind(events, "end")[-1]["step"] == STEPS
    assert_identical(final(run_dir), final(reference))
    assert not (tmp_path / "outputs" / ".restarts").exists() or not any(
        (tmp_path / "outputs" / ".restarts").iterdir()
    )  # the finished job's record is gone


def documented_multinode_command() -> tuple[dict[str, str], list[str]]:
    """The torchrun command of the docs' multi-node section (HOST:29400 left to fill in): the
    variables it sets and its words from ``torchrun`` on."""
    lines = [ln.strip() for ln in DOCS.read_text().splitlines()]
    found = [ln for ln in lines if " torchrun " in f" {ln} " and "--nnodes=2" in ln]
    assert len(found) == 1, found
    words = found[0].split()
    at = words.index("torchrun")
    return dict(w.split("=", 1) for w in words[:at]), words[at:]


@pytest.mark.slow(seconds=25)
def test_two_agents_with_c10d_rendezvous_equal_one_agent_with_two_processes(
    corpus: Path, reference: Path, tmp_path: Path
) -> None:
    variables, words = documented_multinode_command()
    assert words[-2:] == ["-m", "nmt.train"] and "--nproc-per-node=1" in words
    env = {**ENV, **variables}
    endpoint = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    cmd += [w.replace("HOST:29400", endpoint) for w in words[1:]]
    run_dir = tmp_path / "run"
    cmd += [*overrides(corpus, tmp_path), f"hydra.run.dir={run_dir}"]
    logs = [open(tmp_path / f"agent{i}.log", "w") for i in range(2)]  # noqa: SIM115
    agents = [
        subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        for log in logs
    ]
    try:
        statuses = [a.wait(timeout=300) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                kill_tree(a.pid)
        for f in logs:
            f.close()
    text = "".join((tmp_path / f"agent{i}.log").read_text()[-2000:] for i in range(2))
    assert statuses == [0, 0], text
    start = of_kind(read_events(run_dir), "start")[0]
    assert start["world_size"] == 2
    assert_identical(final(run_dir), final(reference))


@pytest.mark.slow(seconds=45)
def test_a_preemption_signal_checkpoints_exits_for_a_restart_and_loses_no_update(
    corpus: Path, reference: Path, tmp_path: Path
) -> None:
    at = random.Random(SEED + 1).choice([k for k in range(5, STEPS - 1) if k % 4])
    run_dir = tmp_path / "run"
    late = tmp_path / "late_end.py"
    late.write_text(LATE_END)
    cmd = torchrun_command(2, 1, *overrides(corpus, tmp_path), f"hydra.run.dir={run_dir}")
    module = cmd.index("nmt.train")
    cmd[module - 1 : module + 1] = [str(late)]  # nmt-train, with rank 0 slow to write the end
    log = tmp_path / "console.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: worker_ranks(proc.pid).get(1), proc, "rank 1", 120)
            wait_for(
                lambda: any(e["step"] >= at for e in of_kind(_events(run_dir), "train")),
                proc, f"update {at}", 120,
            )  # fmt: skip
            os.kill(worker_ranks(proc.pid)[1], signal.SIGUSR1)  # one rank: all of them stop
            assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
    console = log.read_text()
    status = 128 + signal.SIGUSR1
    # the first rank to exit with it makes torchrun stop the other, which may not log it first
    assert f"exiting with status {status} (SIGUSR1)" in console, console[-4000:]
    assert f"(exitcode: {status})" in console, console[-4000:]
    events = read_events(run_dir)
    saved = [e["step"] for e in of_kind(events, "checkpoint")]
    starts, ends = of_kind(events, "start"), of_kind(events, "end")
    assert len(starts) == 2 and ends[0]["stop_reason"] == "stopped by SIGUSR1"
    stopped = ends[0]["step"]
    assert stopped >= at and stopped in saved and starts[1]["step"] == stopped  # none lost
    text = (run_dir / "train.log").read_text()
    resumed = re.findall(r"resuming from (.+) at step (\d+)", text)
    name = numbered_name(stopped, validated=stopped % 4 == 0)  # trainer.val_every=4, or the stop's
    assert len(resumed) == 1 and name in resumed[0][0], resumed
    assert of_kind(events, "end")[-1]["step"] == STEPS
    assert_identical(final(run_dir), final(reference))


# nmt-train whose rank 0 takes 3 s more to write the end of a stopped run: the other rank,
# which exits for the restart at once, must wait for it, or torchrun stops rank 0 before the
# end is written
LATE_END = """
import os
import time

from nmt.train import command, runlog

write = runlog.RunLog.write


def late(self, event, step, **fields):
    stopped = str(fields.get("stop_reason", "")).startswith("stopped by")
    if event == "end" and stopped and os.environ.get("RANK") == "0":
        time.sleep(3)
    return write(self, event, step, **fields)


runlog.RunLog.write = late
command.main()
"""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return read_events(run_dir) if (run_dir / "metrics.jsonl").is_file() else []


@pytest.mark.slow(seconds=15)
def test_a_world_size_that_cannot_continue_the_data_order_is_refused(
    corpus: Path, tmp_path: Path
) -> None:
    one = run_in_process(corpus, tmp_path, "one", *RUN[1:], "trainer.max_steps=3")
    assert one["state"]["batch_in_epoch"] == 3
    log = tmp_path / "console.log"
    cmd = torchrun_command(
        2, 0, *overrides(corpus, tmp_path), f"trainer.resume={one['run_dir']}",
        f"hydra.run.dir={tmp_path / 'h'}",
    )  # fmt: skip
    status = torchrun(cmd, log)
    text = log.read_text()
    assert status != 0
    assert "written by 1 processes after 3 batches of its epoch" in text, text[-3000:]
    assert "--nproc-per-node" in text


def test_a_changed_world_size_continues_the_epoch_where_it_divides() -> None:
    from nmt.cli import UserError
    from nmt.train.elastic import rescaled_position

    assert rescaled_position(3, 2, 1) == 6  # 6 global batches done: one process goes on at 6
    assert rescaled_position(3, 2, 3) == 2
    assert rescaled_position(3, 2, 2) == 3
    assert rescaled_position(0, 4, 3) == 0  # the start of an epoch suits any world size
    assert rescaled_position(5, None, 2) == 5  # a checkpoint from before the world size
    with pytest.raises(UserError, match="divides 3"):
        rescaled_position(3, 1, 2)


@pytest.mark.slow(seconds=30)
def test_bench_recovery_measures_a_restart(corpus: Path, tmp_path: Path) -> None:
    s = RecoverySettings(
        tmp_path / "run", kill_at=6, overrides=tiny_run_overrides(corpus, tmp_path, *RUN[1:]),
        max_steps=10, cwd=REPO, timeout=300, to_end=True,
    )  # fmt: skip
    result = run(s)
    assert result["starts"] == 2 and result["final_step"] == 10
    assert result["resumed_step"] == 4  # the validation checkpoint before the kill
    assert result["updates_lost"] == result["step_logged"] - 4 >= 2
    assert 0 < result["death_to_start_s"] < result["death_to_first_log_s"]
    assert result["seconds_per_update_before"] > 0


def submitit_task(driver: int) -> int | None:
    """The process of submitit's local executor that runs the training job."""
    for pid in descendants(driver):
        try:
            if b"submitit.core._submit" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


@pytest.mark.slow(seconds=35)
def test_submitit_requeues_a_signalled_job_which_continues_from_its_checkpoint(
    corpus: Path, one_process_reference: Path, tmp_path: Path
) -> None:
    # early enough that the signal lands several updates before the end (an update of this
    # run takes under 0.1 s), on a step that is not a validation's
    at = random.Random(SEED + 2).choice([k for k in range(3, STEPS // 2 + 1) if k % 4])
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "-m", "nmt.train", "-m", "hydra/launcher=submitit_local",
        f"hydra.sweep.dir={sweep}", "hydra.launcher.timeout_min=10",
        *tiny_run_overrides(corpus, tmp_path, "trainer.threads=1", *RUN),
    ]  # fmt: skip
    run_dir = sweep / "0"
    log = tmp_path / "console.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT)
        try:
            task = wait_for(lambda: submitit_task(proc.pid), proc, "the task", 120)
            wait_for(
                lambda: any(e["step"] >= at for e in of_kind(_events(run_dir), "train")),
                proc, f"update {at}", 180,
            )  # fmt: skip
            # submitit's signal (SIGUSR2), as SLURM sends it before the time limit
            os.kill(task, signal.SIGUSR2)
            assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
    task_logs = "".join(p.read_text() for p in sweep.rglob("*_log.*"))
    assert "Requeued job" in task_logs, task_logs[-4000:]
    events = read_events(run_dir)
    starts = of_kind(events, "start")
    assert len(starts) == 2, task_logs[-4000:]
    stopped = starts[1]["step"]
    assert stopped >= at and stopped in [e["step"] for e in of_kind(events, "checkpoint")]
    assert "requeued submitit job: continuing" in (run_dir / "train.log").read_text()
    assert of_kind(events, "end")[-1]["step"] == STEPS
    assert_identical(final(run_dir), final(one_process_reference))


def test_a_restart_skips_a_damaged_newest_checkpoint_and_says_which(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, threads_restored: None
) -> None:
    from nmt.train.command import train
    from nmt.train.elastic import RECORDS, _record_key

    from .helpers import compose_config

    first = run_in_process(corpus, tmp_path, "first", *RUN)
    run_dir = Path(first["run_dir"])
    ckpts = run_dir / "checkpoints"
    newest = ckpts / f"step_{STEPS:08d}.pt"
    expected = training_outcome(load_checkpoint(newest))
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # last.pt is the same file: torn too
    (ckpts / f".step_{STEPS + 1:08d}.pt.x1.tmp").write_bytes(data[:1000])  # a write cut short
    # what torchrun's first start recorded, and the variables of its first restart
    launcher = {"TORCHELASTIC_RUN_ID": "job-1"}
    record = tmp_path / "outputs" / RECORDS / f"{_record_key(launcher)}.json"
    record.parent.mkdir(parents=True)
    record.write_text(f'{{"run_dir": "{run_dir}"}}\n')
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    cfg = compose_config("train", tiny_run_overrides(corpus, tmp_path, "trainer.threads=1", *RUN))
    with caplog.at_level("INFO"):
        result = train(cfg, tmp_path / "outputs" / "runs" / "a-new-one")
    assert result["run_dir"] == str(run_dir) and result["state"]["step"] == STEPS
    text = caplog.text
    assert f"torchrun restart 1: continuing {run_dir}" in text
    assert re.search(r"cannot resume from \S*last\.pt.*falling back to \S*step_00000008\.pt", text)
    assert re.search(r"resuming from \S*step_00000008\.pt at step 8", text)
    assert not (tmp_path / "outputs" / "runs" / "a-new-one").exists()
    assert not record.exists()  # the run ended by itself
    assert_identical(final(run_dir), expected)


def test_checkpoints_by_the_clock_follow_rank_0_and_change_nothing_else(
    corpus: Path,
    one_process_reference: Path,
    tmp_path: Path,
    threads_restored: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import itertools

    from nmt.train.command import train

    from .helpers import compose_config

    ticks = itertools.count(step=20.0)  # every look at the clock: 20 s later
    monkeypatch.setattr("nmt.train.loop.monotonic", lambda: next(ticks))
    extra = ("trainer.threads=1", *RUN, "trainer.save_every_minutes=1", "trainer.keep_last=2",
             "trainer.average_last=2")  # fmt: skip
    cfg = compose_config("train", tiny_run_overrides(corpus, tmp_path, *extra))
    run_dir = tmp_path / "clock"
    train(cfg, run_dir)
    events = read_events(run_dir)
    saved = [(e["step"], e["path"]) for e in of_kind(events, "checkpoint")]
    # a minute is three looks at the clock after a checkpoint: 3 updates after the last one,
    # besides the validations' at 4, 8 and 12; the clock's are only to resume from
    assert saved == [
        (n, f"checkpoints/{'step' if n % 4 == 0 else 'resume'}_{n:08d}.pt")
        for n in (3, 4, 7, 8, 11, 12)
    ]
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("*_*.pt")) == [  # trainer.keep_last validations
        "step_00000008.pt", "step_00000012.pt",
    ]  # fmt: skip
    # the average is of the validations' checkpoints, whatever the clock added between them
    assert of_kind(events, "averaged")[-1]["checkpoints"] == ["step_00000008", "step_00000012"]
    assert_identical(final(run_dir), final(one_process_reference))


@pytest.mark.slow(seconds=25)
def test_a_two_process_checkpoint_continues_its_epoch_exactly_in_one_process(
    corpus: Path, accumulated_reference: Path, tmp_path: Path, threads_restored: None
) -> None:
    import torch

    plain = (*RUN[1:6], *DETERMINISTIC)  # no dropout: 2 ranks equal 1 process accumulating 2
    two = tmp_path / "two"
    cmd = torchrun_command(2, 0, *tiny_run_overrides(corpus, tmp_path, *plain,
                           "trainer.max_steps=6"), f"hydra.run.dir={two}")  # fmt: skip
    log = tmp_path / "console.log"
    assert torchrun(cmd, log) == 0, log.read_text()[-3000:]
    saved = load_checkpoint(two / "checkpoints" / "last.pt")
    assert (saved["world_size"], saved["state"]["batch_in_epoch"]) == (2, 2)  # mid-epoch
    resumed = run_in_process(corpus, tmp_path, "unused", *plain, "trainer.accumulate=2",
                             f"trainer.max_steps={STEPS}", f"trainer.resume={two}")  # fmt: skip
    assert resumed["state"]["step"] == STEPS
    got = load_checkpoint(two / "checkpoints" / "last.pt")["model"]
    want = load_checkpoint(accumulated_reference / "checkpoints" / "last.pt")["model"]
    for key, value in want.items():  # the same batches: equal up to the order of sums
        torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5, msg=key)


# two ranks whose clocks disagree: rank 0's minute passes every 3 looks, rank 1's never
CLOCKS = """
import itertools, sys
from pathlib import Path
import nmt.train.loop
from nmt.train.command import train
from tests.helpers import compose_config
ticks = itertools.count(step=20.0 if sys.argv[1] == "0" else 0.001)
nmt.train.loop.monotonic = lambda: next(ticks)
train(compose_config("train", sys.argv[3:]), Path(sys.argv[2]))
"""


@pytest.mark.slow(seconds=25)
def test_ranks_whose_clocks_disagree_checkpoint_together_by_rank_0s(
    corpus: Path, accumulated_reference: Path, tmp_path: Path
) -> None:
    import torch

    plain = (*RUN[:6], *DETERMINISTIC, "trainer.save_every_minutes=1")
    run_dir = tmp_path / "two"
    args = tiny_run_overrides(corpus, tmp_path, "trainer.threads=1", *plain)
    port = str(free_port())
    procs = []
    for rank in ("0", "1"):
        env = {**ENV, "RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip
        cmd = [sys.executable, "-c", CLOCKS, rank, str(run_dir), *args]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]  # without agreement: a hang
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    saved = [e["step"] for e in of_kind(read_events(run_dir), "checkpoint")]
    assert saved == [3, 4, 7, 8, 11, 12]  # as rank 0's clock says (see the test above)
    got = load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"]
    # the reference checkpoints by no clock: the clocks change where checkpoints are, not
    # the updates
    want = load_checkpoint(accumulated_reference / "checkpoints" / "last.pt")["model"]
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5, msg=key)
