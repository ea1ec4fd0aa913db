"""Process-level setup shared by the commands: device, seeds, logging, distributed, run dirs."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from nmt.atomic import atomic_write_bytes
from nmt.cli import CONFIG_DIR, config_dir, setup_logging  # noqa: F401 (re-exported)
from nmt.config import ConfigError

log = logging.getLogger("nmt")


def pick_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; anything else is taken as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"trainer.device={name!r} is not a device: {e}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name!r} but no CUDA device is available")
    return device


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform's guess elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class _Held(logging.Handler):
    """Keeps the warnings logged while the run's log file is not open yet."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def held_warnings() -> Iterator[list[logging.LogRecord]]:
    """Collect the warnings logged inside the block (they still reach the console), so that
    :func:`write_to_log_file` can add them to a log file opened afterwards."""
    held = _Held()
    root = logging.getLogger()
    root.addHandler(held)
    try:
        yield held.records
    finally:
        root.removeHandler(held)


def write_to_log_file(records: list[logging.LogRecord]) -> None:
    """Write ``records`` to the log file of :func:`setup_logging` (not to the console)."""
    for handler in logging.getLogger().handlers:
        if getattr(handler, "_nmt_file", False):
            for record in records:
                handler.handle(record)


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


def slurm_dist_env(port: int = 29500) -> dict[str, str]:
    """torchrun's rank variables derived from a SLURM task started by submitit ({} elsewhere)."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or "RANK" in os.environ:
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
        "MASTER_PORT": os.environ.get("MASTER_PORT", str(port)),
    }


def init_distributed(device_name: str) -> DistInfo:
    """Join the process group when started by torchrun or a SLURM job, else run single."""
    os.environ.update(slurm_dist_env())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    use_cuda = torch.cuda.is_available() and device_name != "cpu"
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return info


def update_latest_link(outputs: Path, run_dir: Path) -> None:
    """Point ``<outputs>/latest`` at ``run_dir`` (relative link, replaced atomically)."""
    outputs.mkdir(parents=True, exist_ok=True)
    link = outputs / "latest"
    tmp = outputs / f".latest.{os.getpid()}"
    try:
        target = os.path.relpath(run_dir.resolve(), outputs.resolve())
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(target)
        os.replace(tmp, link)
    except OSError as e:  # e.g. a filesystem without symlinks: record the path instead
        log.warning("could not update %s (%s); writing its path to %s.txt", link, e, link)
        atomic_write_bytes(outputs / "latest.txt", (str(run_dir.resolve()) + "\n").encode())


def resolve_run_dir(path: str | Path) -> Path:
    """A run directory given directly, through ``latest``, or through ``latest.txt``."""
    p = Path(path)
    if not p.exists() and p.name == "latest" and (p.parent / "latest.txt").is_file():
        p = Path((p.parent / "latest.txt").read_text().strip())
    return p.resolve()


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed-precision context for ``trainer.precision`` (32 | bf16 | 16)."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "16":
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def native_bf16(device: torch.device) -> bool:
    """Whether the device computes in bf16 natively (CUDA bf16, or AVX512-BF16/AMX on CPU)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, name, lambda: False)() for name in probes)
    return False
