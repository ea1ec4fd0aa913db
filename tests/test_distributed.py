"""Data-parallel training (torchrun + DDP, gloo on CPU) equals one process with the same batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from nmt.store.checkpoint import load_checkpoint
from nmt.train.command import train
from nmt.train.runlog import of_kind, read_events

from .helpers import DETERMINISTIC, REPO, compose_config, tiny_run_overrides

STEPS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(script: str, args: list[str], timeout: float, **env_extra: str) -> list[str]:
    """The outputs of ranks 0 and 1 of a gloo group on this machine, each running ``script``
    (``python -c``) with its rank, then ``args``; both must exit 0."""
    port, procs = str(free_port()), []
    for rank in ("0", "1"):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": rank, "LOCAL_RANK": rank,
               "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               **env_extra}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", script, rank, *args], cwd=REPO,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))  # fmt: skip
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    return outs


@pytest.mark.slow(seconds=13)
@pytest.mark.parametrize("rdrop_alpha", [0.0, 0.5], ids=["plain", "rdrop"])
def test_two_process_ddp_equals_single_process_with_the_same_global_batch(
    corpus, tmp_path, rdrop_alpha
):
    common = (
        f"trainer.max_steps={STEPS}",
        "trainer.val_every=1000",
        f"trainer.rdrop_alpha={rdrop_alpha}",  # R-Drop's two passes: a batch twice the size
        *DETERMINISTIC,
    )
    # Rank r takes batches r, r+2, ... of the epoch, so an update of 2 ranks covers the same
    # two batches as an update of one process accumulating 2.
    single = train(
        compose_config(
            "train", tiny_run_overrides(corpus, tmp_path, "trainer.accumulate=2", *common)
        ),
        tmp_path / "single",
    )
    assert single["state"]["step"] == STEPS
    ddp_dir = tmp_path / "ddp"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        f"--master-port={free_port()}", "-m", "nmt.train",
        *tiny_run_overrides(corpus, tmp_path, *common), f"hydra.run.dir={ddp_dir}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ddp = load_checkpoint(ddp_dir / "checkpoints" / "last.pt")
    one = load_checkpoint(tmp_path / "single" / "checkpoints" / "last.pt")
    assert ddp["state"]["step"] == STEPS
    for key, value in one["model"].items():
        torch.testing.assert_close(ddp["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    # rank 0 alone writes the run's events and summary
    events = read_events(ddp_dir)
    assert [e["event"] for e in events].count("start") == 1
    assert [e["step"] for e in of_kind(events, "checkpoint")] == [STEPS]
    assert json.loads((ddp_dir / "summary.json").read_text())["hardware"]["world_size"] == 2
    # the checkpoint of the distributed run resumes in one process
    resumed = train(
        compose_config(
            "train",
            tiny_run_overrides(
                corpus, tmp_path, *common[1:], "trainer.max_steps=8", f"trainer.resume={ddp_dir}"
            ),
        ),
        tmp_path / "unused",
    )
    assert resumed["state"]["step"] == 8


def test_slurm_launcher_config_composes():
    from hydra import compose, initialize_config_dir

    from nmt.cli import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.tasks_per_node == 4  # one process per GPU


def test_slurm_tasks_map_to_torchrun_variables(monkeypatch):
    from nmt.environment import launcher_variables
    from nmt.runtime.distributed import slurm_dist_env

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    slurm = {
        "SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "42", "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
    }  # fmt: skip
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    env = slurm_dist_env(launcher_variables())
    assert env["RANK"] == "5" and env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "1"
    assert env["MASTER_ADDR"] == "gpu07"


# A rank in a gloo process group must end without the group's teardown: the teardown joins the
# group's worker threads while holding the GIL, and one that still frees a finished collective's
# tensors waits for the GIL forever (a hung rank); at interpreter exit the same thread is ended
# inside a destructor and aborts the process (SIGABRT).
RANK_SCRIPT = """
import atexit, sys
from pathlib import Path
import torch.distributed as dist
from nmt.train.command import main
work = Path(sys.argv[1])
dist.init_process_group("gloo", init_method=f"file://{work / 'store'}", rank=0, world_size=1)
atexit.register((work / "finalized").touch)  # run only by an interpreter that finalizes
print("printed before training")  # stdout is a file here: block-buffered, unflushed
sys.argv = ["nmt-train", *sys.argv[2:]]
main()
"""


def run_rank(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``nmt-train ARGS`` in a process that joined a one-process gloo group first."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-c", RANK_SCRIPT, str(tmp_path), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow(seconds=12)
def test_a_rank_ends_with_its_status_and_outputs_without_the_group_teardown(corpus, tmp_path):
    run_dir = tmp_path / "run"
    done = run_rank(tmp_path, *tiny_run_overrides(corpus, tmp_path, "trainer.max_steps=2",
                                                  f"hydra.run.dir={run_dir}"))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (tmp_path / "finalized").exists()  # ended before the interpreter's teardown
    assert "printed before training" in done.stdout  # flushed
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 2
    assert (run_dir / "train.log").read_text().rstrip().endswith(f"run directory: {run_dir}")
    assert f"run directory: {run_dir}" in done.stdout + done.stderr
    # an error's status (a user error: 2) and message are kept too
    missing = tmp_path / "missing"
    failed = run_rank(tmp_path, *tiny_run_overrides(corpus, tmp_path, f"trainer.resume={missing}",
                                                    f"hydra.run.dir={tmp_path / 'h'}"))  # fmt: skip
    assert failed.returncode == 2, failed.stdout[-3000:] + failed.stderr[-3000:]
    assert str(missing) in failed.stderr


def test_the_exit_status_of_a_system_exit() -> None:
    from nmt.runtime.distributed import exit_status

    assert [exit_status(c) for c in (None, 0, 2, 138, 256 + 3, -1)] == [0, 0, 2, 138, 3, 255]
    assert exit_status("a message") == 1


# A rank of a two-process run (RANK, WORLD_SIZE and MASTER_* set by the test) whose validation
# scores are its own: rank 0's BLEU falls from the first validation on, rank 1's rises. The
# timeout each rank's process group gets is printed.
DISAGREEING_RANK = """
import itertools, json, sys
from pathlib import Path
import torch.distributed as dist
import nmt.train.loop
from nmt.runtime.distributed import exit_joined
from nmt.train.command import train
from tests.helpers import compose_config
rank = int(sys.argv[1])
count = itertools.count()
def scores(*args, **kwargs):
    n = next(count)
    bleu = 30.0 - n if rank == 0 else 10.0 + n
    return {"loss": 1.0, "ppl": 2.0, "bleu": bleu, "chrf": bleu, "seconds": 0.0}
nmt.train.loop.validation_scores = scores
init = dist.init_process_group
def init_recorded(*args, **kwargs):
    print("process group timeout", kwargs.get("timeout"), flush=True)
    init(*args, **kwargs)
dist.init_process_group = init_recorded
result = train(compose_config("train", sys.argv[3:]), Path(sys.argv[2]))
print("RESULT", json.dumps({"stop_reason": result["stop_reason"], **result["state"]}), flush=True)
exit_joined(0)
"""


@pytest.mark.slow(seconds=25)
def test_ranks_whose_validation_scores_disagree_stop_together_by_rank_0s(corpus, tmp_path):
    from datetime import timedelta

    run_dir = tmp_path / "two"
    plain = ("trainer.threads=1", "trainer.val_every=2", "trainer.patience=2", *DETERMINISTIC)
    args = tiny_run_overrides(corpus, tmp_path, "trainer.max_steps=12", *plain)
    outs = two_ranks(DISAGREEING_RANK, [str(run_dir), *args], 180, NMT_DIST_TIMEOUT="60")
    for out in outs:  # the timeout of NMT_DIST_TIMEOUT reached each rank's process group
        assert f"process group timeout {timedelta(seconds=60)}" in out
    results = [json.loads(out.split("RESULT ", 1)[1].splitlines()[0]) for out in outs]
    # rank 0's scores decide on every rank: a new best at step 2, then two validations
    # without a gain stop both ranks at step 6 (rank 1's own scores would never stop it)
    for r in results:
        assert r["stop_reason"] == "early stopping: no BLEU gain in 2 validations"
        assert (r["step"], r["best_step"], r["best_bleu"], r["bad_validations"]) == (6, 2, 30.0, 2)
        assert [(h["step"], h["bleu"]) for h in r["history"]] == [(2, 30.0), (4, 29.0), (6, 28.0)]
    events = read_events(run_dir)
    assert [(e["step"], e["best"]) for e in of_kind(events, "checkpoint")] == [
        (2, True), (4, False), (6, False),
    ]  # fmt: skip
    assert load_checkpoint(run_dir / "checkpoints" / "best.pt")["state"]["step"] == 2


def test_the_process_group_times_out_as_the_environment_says(monkeypatch) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from nmt.environment import DIST_TIMEOUT, DIST_TIMEOUT_SECONDS, dist_timeout
    from nmt.runtime.distributed import DistInfo, init_distributed

    joined = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: joined.append((a, kw)))
    launcher = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert init_distributed("cpu", launcher, 42.5) == DistInfo(1, 2, 1)
    assert init_distributed("cpu", launcher) == DistInfo(1, 2, 1)
    assert joined == [
        (("gloo",), {"timeout": timedelta(seconds=42.5)}),
        (("gloo",), {"timeout": timedelta(seconds=DIST_TIMEOUT_SECONDS)}),
    ]
    monkeypatch.delenv(DIST_TIMEOUT, raising=False)
    assert dist_timeout() == DIST_TIMEOUT_SECONDS == 600
    monkeypatch.setenv(DIST_TIMEOUT, "90")
    assert dist_timeout() == 90.0
    for bad in ("soon", "0", "-5", "inf", "nan"):
        monkeypatch.setenv(DIST_TIMEOUT, bad)
        with pytest.raises(ValueError, match=DIST_TIMEOUT):
            dist_timeout()


def test_ddp_wraps_the_model_without_broadcasting_its_buffers(monkeypatch) -> None:
    from nmt.runtime.distributed import DistInfo
    from nmt.train.build import build_train_model

    from .test_models import build

    wrapped = []
    monkeypatch.setattr(
        "nmt.train.build.DistributedDataParallel", lambda *a, **kw: wrapped.append(kw) or a[0]
    )
    model = build("transformer-prenorm")
    assert build_train_model(model, DistInfo(0, 2, 0), torch.device("cpu"), False) is model
    assert wrapped == [{"device_ids": None, "broadcast_buffers": False}]


def test_every_buffer_of_every_model_is_the_same_on_every_rank() -> None:
    """What broadcast_buffers=False relies on: no model has a buffer that its seed or an update
    could change (no BatchNorm statistics), only the sinusoidal position tables."""
    from nmt.models.transformer import PositionalEmbedding

    from .test_models import VARIANTS, build

    tables = 0
    for name in VARIANTS:
        torch.manual_seed(0)
        model = build(name)
        owners = [m for m in model.modules() if list(m.buffers(recurse=False))]
        assert all(type(m) is PositionalEmbedding for m in owners), name
        assert [key for key, _ in model.named_buffers()] == [
            f"{key}.table" for key, m in model.named_modules() if m in owners
        ]  # fmt: skip
        torch.manual_seed(1)
        again = dict(build(name).named_buffers())
        for key, value in model.named_buffers():
            assert torch.equal(value, again[key]), (name, key)
            tables += 1
    assert tables > 0
