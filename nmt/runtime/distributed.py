"""Distributed training: the process group torchrun (or a SLURM job under submitit) starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nmt.environment import export_launcher_variables


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

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
        "MASTER_ADDR": job.hostnames[0],
        "MASTER_PORT": launcher.get("MASTER_PORT", str(port)),
    }


def init_distributed(device_name: str, launcher: Mapping[str, str]) -> DistInfo:
    """Join the process group when started by torchrun or a SLURM job, else run single.

    ``launcher``: the launcher's variables (:func:`nmt.environment.launcher_variables`); those
    derived from SLURM are exported for ``torch.distributed``'s rendezvous.
    """
    derived = slurm_dist_env(launcher)
    export_launcher_variables(derived)
    launcher = {**launcher, **derived}
    world = int(launcher.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(launcher["RANK"]), world, int(launcher.get("LOCAL_RANK", "0")))
    use_cuda = torch.cuda.is_available() and device_name != "cpu"
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return info
