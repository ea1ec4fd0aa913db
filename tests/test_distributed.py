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


@pytest.mark.slow(seconds=13)
def test_two_process_ddp_equals_single_process_with_the_same_global_batch(corpus, tmp_path):
    common = (
        f"trainer.max_steps={STEPS}",
        "trainer.val_every=1000",
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
