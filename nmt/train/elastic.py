"""Restarts, requeues and preemption.

A worker group that torchrun restarts (``--max-restarts``) continues the run directory of the
job's first start: rank 0 of the first start records it in ``<outputs>/.restarts/<key>.json``,
keyed by torchrun's rendezvous id (``TORCHELASTIC_RUN_ID``, the same across restarts), and a
restarted group (``TORCHELASTIC_RESTART_COUNT`` above 0 on any rank) reads it back and resumes
from the newest checkpoint there that verifies. A job that submitit requeues runs again in the
same Hydra output directory; finding a checkpoint there, it resumes from it.

Preemption: SIGTERM and SIGUSR1 (and submitit's signal, SIGUSR2 unless
``SUBMITIT_PREEMPT_SIGNAL`` names another, in a submitit job) make every rank finish its update;
rank 0 writes a checkpoint and the process exits with 128 + the signal's number (143 for
SIGTERM, 138 for SIGUSR1), the status of a process the signal ended. torchrun restarts a group
whose worker exits non-zero while restarts remain, and schedulers that retry a job ended by a
signal (Kubernetes' exit-code policy: 128 and above) do so. Under submitit, rank 0 then hands
the signal to submitit's own handler, which resubmits the job (``scontrol requeue`` on SLURM).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from nmt.atomic import atomic_write_bytes
from nmt.cli import UserError
from nmt.environment import (
    AGENT_STORE,
    MAX_RESTARTS,
    RESTART_COUNT,
    RUN_ID,
    SEPARATE_STORE,
    SUBMITIT_EXECUTOR,
)
from nmt.runtime.distributed import DistInfo
from nmt.store import checkpoint as ckpt

log = logging.getLogger(__name__)
T = TypeVar("T")

RECORDS = ".restarts"  # under <outputs>: one JSON file per torchrun job that may restart
PREEMPTION = ("SIGTERM", "SIGUSR1")  # checkpoint, then exit for a requeue


def requeue_status(signal_name: str) -> int:
    """The exit status after a preemption signal: 128 + its number (143 for SIGTERM)."""
    return 128 + int(signal.Signals[signal_name])


def submitit_signal(launcher: Mapping[str, str]) -> signal.Signals | None:
    """submitit's preemption / timeout signal in a submitit job (None elsewhere)."""
    if SUBMITIT_EXECUTOR not in launcher:
        return None
    try:
        from submitit import JobEnvironment
    except ImportError:
        return None
    return signal.Signals[f"SIG{JobEnvironment.USR_SIG}"]


def decided_by_rank0(dist_info: DistInfo, decide: Callable[[], T]) -> T:
    """Rank 0's ``decide()``, the same on every rank; an error of rank 0 is raised on all."""
    if not dist_info.enabled:
        return decide()
    box: list[Any] = [None, None]
    error: BaseException | None = None
    if dist_info.is_main:
        try:
            box[0] = decide()
        except Exception as e:  # every rank must leave the broadcast below
            error = e
            box[1] = (isinstance(e, UserError), str(e))
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    if box[1] is not None:
        user, message = box[1]
        raise (UserError if user else RuntimeError)(f"(rank 0) {message}")
    return box[0]


def _record_key(launcher: Mapping[str, str]) -> str:
    """The job's key: torchrun's rendezvous id; for the static rendezvous (whose id is "none")
    the master's address and port and rank 0's agent process."""
    run_id = launcher.get(RUN_ID, "")
    if run_id in ("", "none"):
        parts = (launcher.get("MASTER_ADDR"), launcher.get("MASTER_PORT"), socket.gethostname())
        run_id = "-".join(map(str, (*parts, os.getppid())))
    return hashlib.sha256(run_id.encode()).hexdigest()[:20]


@dataclass
class Restart:
    """How this start of the job relates to the earlier ones."""

    count: int = 0  # torchrun's restarts of the worker group so far (0: the first start)
    run_dir: Path | None = None  # a restart's run directory: the one the first start recorded
    record: Path | None = None  # rank 0: where the run directory is recorded (torchrun only)
    stop_signal: signal.Signals | None = None  # submitit's signal, caught like SIGTERM


def torchrun_restart(outputs: Path, launcher: Mapping[str, str], dist_info: DistInfo) -> Restart:
    """Whether torchrun restarted this worker group and, if so, the run directory to continue.

    Every rank takes part: the restart count is the highest of any rank (an agent on another
    node may not count a restart its peer made), and rank 0 reads the record.
    """
    if RUN_ID not in launcher:
        return Restart()
    restarts = int(launcher.get(MAX_RESTARTS, "0") or 0)
    if dist_info.is_main and restarts > 0 and launcher.get(AGENT_STORE) == "True":
        log.warning("torchrun may restart the workers (--max-restarts=%d) but shares its "
                    "rendezvous store with them: a restarted group can read the previous "
                    "group's addresses and fail to connect (pytorch#135712); start torchrun "
                    "with %s=1 (make train does)", restarts, SEPARATE_STORE)  # fmt: skip
    count = int(launcher.get(RESTART_COUNT, "0") or 0)
    if dist_info.enabled:
        t = torch.tensor([count], dtype=torch.int64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        count = int(t.item())
    record = Path(outputs) / RECORDS / f"{_record_key(launcher)}.json"

    def recorded() -> str | None:
        if count == 0:
            return None
        try:
            return str(json.loads(record.read_text())["run_dir"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("torchrun restart %d: no run directory recorded in %s (%s); this start "
                        "begins a new run", count, record, e)  # fmt: skip
            return None

    run_dir = decided_by_rank0(dist_info, recorded)
    return Restart(count, Path(run_dir) if run_dir else None, record)


def has_checkpoint(run_dir: Path) -> bool:
    ckpt_dir = Path(run_dir) / "checkpoints"
    return (ckpt_dir / "last.pt").is_file() or bool(ckpt.all_checkpoints(ckpt_dir))


def continue_restarted(t: Any, restart: Restart, hydra_dir: Path, launcher: Mapping) -> str:
    """Point ``trainer.resume`` (``t``) at the run a restarted or requeued job continues; the
    log line saying so ("" for a first start)."""
    if restart.run_dir is not None:
        what = f"torchrun restart {restart.count}: continuing {restart.run_dir}"
        run_dir = restart.run_dir
    elif SUBMITIT_EXECUTOR in launcher and has_checkpoint(hydra_dir):
        what = f"requeued submitit job: continuing {hydra_dir}"
        run_dir = hydra_dir
    else:
        return ""
    if has_checkpoint(run_dir):
        t.resume, t.init_from = str(run_dir), None
        return f"{what} from its newest checkpoint that verifies"
    return f"{what}, which has no checkpoint yet: starting it again"


def write_record(restart: Restart, run_dir: Path) -> None:
    """Rank 0: record the run directory a restart of this torchrun job continues."""
    if restart.record is not None:
        body = json.dumps({"run_dir": str(Path(run_dir).resolve())}) + "\n"
        atomic_write_bytes(restart.record, body.encode())


def drop_record(restart: Restart) -> None:
    """Rank 0, after a run that ended by itself: nothing is left to restart."""
    if restart.record is not None:
        restart.record.unlink(missing_ok=True)


# --------------------------------------------------------------------------- the world size


def rescaled_position(batch_in_epoch: int, saved_world: int | None, world: int) -> int:
    """This rank's position in the epoch when a checkpoint of ``saved_world`` processes resumes
    with ``world``: the same global batches consumed, dealt anew.

    Rank r of W takes global batches r, r + W, ...; after k updates every rank has taken k, so
    the first k * W global batches of the epoch are done. W' processes continue exactly where
    k * W is a multiple of W'. Raises UserError otherwise, naming the setting.
    """
    if saved_world is None or saved_world == world or batch_in_epoch == 0:
        return batch_in_epoch
    done = batch_in_epoch * saved_world
    if done % world:
        raise UserError(
            f"the checkpoint was written by {saved_world} processes after {done} batches of its "
            f"epoch, which {world} processes cannot continue in the same data order: resume "
            f"with torchrun's --nproc-per-node x --nnodes (make train NPROC=...) equal to "
            f"{saved_world}, or to a number that divides {done}"
        )
    log.info("the checkpoint's %d processes became %d: each continues at batch %d of the "
             "epoch (global batch %d)", saved_world, world, done // world, done)  # fmt: skip
    return done // world
