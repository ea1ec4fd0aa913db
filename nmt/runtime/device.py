"""The machine a command runs on: the device, its name, the CPU model, seeds, and autocast for a
precision.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import random
from pathlib import Path

import numpy as np
import torch

from nmt.config import ConfigError

log = logging.getLogger(__name__)


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
