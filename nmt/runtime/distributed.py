"""Distributed training: the process group torchrun (or a SLURM job under submitit) starts."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from nmt.environment import DIST_TIMEOUT, DIST_TIMEOUT_SECONDS, export_launcher_variables

log = logging.getLogger(__name__)


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    gpu: int = 0  # the index of this rank's GPU where it trains on one (rank_gpu)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def slurm_dist_env(launcher: Mapping[str, str], port: int = 29500) -> dict[str, str]:
    """torchrun's rank variables derived from a SLURM task started by submitit ({} elsewhere);
    ``launcher``: the launcher's variables (:func:`nmt.environment.launcher_variables`)."""
    if launcher.get("SUBMITIT_EXECUTOR") != "slurm" or "RANK" in launcher:
        return {}
    try:
        import submitit

        job = submitit.JobEnvironment()
    except (ImportError, RuntimeError):
        return {}
    if job.num_tasks <= 1:
        return {}
    return {
        "RANK": str(job.global_rank),
        "WORLD_SIZE": str(job.num_tasks),
        "LOCAL_RANK": str(job.local_rank),
        "LOCAL_WORLD_SIZE": str(job.num_tasks // max(job.num_nodes, 1)),
        "MASTER_ADDR": job.hostnames[0],
        "MASTER_PORT": launcher.get("MASTER_PORT", str(port)),
    }


def rank_gpu(local_rank: int, local_world: int, gpus: int) -> tuple[int, str]:
    """The GPU of the rank ``local_rank`` of ``local_world`` ranks on a machine with ``gpus``
    visible, and the process group's backend: rank r takes GPU r modulo ``gpus``, over NCCL where
    every rank has a GPU of its own. Where ranks outnumber GPUs (two ranks on one GPU, to check
    DDP on a single card), they share them round-robin over gloo, as NCCL refuses two ranks on
    one GPU; gloo's collectives copy through host memory, slower, but the same training."""
    if gpus < 1:
        raise RuntimeError("no CUDA device is visible to this rank")
    return local_rank % gpus, "nccl" if local_world <= gpus else "gloo"


def init_distributed(
    device_name: str, launcher: Mapping[str, str], timeout: float = DIST_TIMEOUT_SECONDS
) -> DistInfo:
    """Join the process group when started by torchrun or a SLURM job, else run single.

    ``launcher``: the launcher's variables (:func:`nmt.environment.launcher_variables`); those
    derived from SLURM are exported for ``torch.distributed``'s rendezvous. ``timeout``: the
    seconds a collective operation waits for the other ranks before it fails
    (:func:`nmt.environment.dist_timeout`): gloo raises an error in the waiting rank; NCCL's
    watchdog ends the process (``TORCH_NCCL_ASYNC_ERROR_HANDLING``'s default), and torchrun
    then stops the other ranks.
    """
    derived = slurm_dist_env(launcher)
    export_launcher_variables(derived)
    launcher = {**launcher, **derived}
    world = int(launcher.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    local_rank = int(launcher.get("LOCAL_RANK", "0"))
    info, backend = DistInfo(int(launcher["RANK"]), world, local_rank), "gloo"
    if torch.cuda.is_available() and device_name != "cpu":
        local_world = int(launcher.get("LOCAL_WORLD_SIZE", str(world)))
        info.gpu, backend = rank_gpu(local_rank, local_world, torch.cuda.device_count())
        torch.cuda.set_device(info.gpu)
        if backend == "gloo":
            log.warning("%d ranks on this machine share %d GPU(s): gloo, not NCCL, carries "
                        "their gradients", local_world, torch.cuda.device_count())  # fmt: skip
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        log.info("rank %d of %d (%s): a collective operation fails after waiting %.0f s for the "
                 "other ranks (%s)", info.rank, world, backend, timeout, DIST_TIMEOUT)  # fmt: skip
    return info


def exit_status(code: object) -> int:
    """The status a process ends with for ``SystemExit(code)``, as Python sets it: None is 0,
    an integer is itself, anything else (a message, printed by the caller) is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def exit_joined(code: object = None) -> None:
    """End a process that joined a process group now, with ``SystemExit(code)``'s status, its
    logs and standard streams flushed, and without tearing the group down; return at once in a
    process that joined none (its caller exits as usual).

    Why not ``dist.destroy_process_group()`` or the teardown at interpreter exit: a gloo
    worker thread frees each finished collective's work after the caller's ``wait()`` returned,
    and freeing a tensor that has a Python object takes the GIL. The group's destructor joins
    those threads while the GIL is held (it runs when the last reference goes, from Python:
    DDP's reducer or the group registry), so a worker still freeing the last collective's work
    waits for the GIL forever and the join never ends (a hung rank); at interpreter exit the
    same worker, refused the GIL of a finalizing interpreter, is ended inside a destructor and
    aborts the process ("terminate called without an active exception", SIGABRT). Nothing in
    torch lets the caller wait for the workers to finish freeing, so a rank whose outputs are
    all written (checkpoints, metrics, the TensorBoard writer closed) ends with ``os._exit``,
    which stops those threads with the process.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    status = exit_status(code)
    logging.shutdown()  # flushes and closes the log files (train.log)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to keep
            stream.flush()
    os._exit(status)
