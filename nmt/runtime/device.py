"""The machine a command runs on: the device (and TF32 on it), its name, the CPU model, seeds,
and autocast for a precision.
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


def use_tf32(device: torch.device, enabled: bool) -> None:
    """On a CUDA device, let fp32 matrix products and cuDNN (the GRU encoder's kernels) run in
    TF32 where the GPU has it (compute capability 8.0 and later: an fp32 input rounded to a
    10-bit mantissa, products accumulated in fp32, several times the fp32 rate), or not
    (``enabled`` False: full fp32). Nothing changes on a CPU. It sets torch's process-wide
    ``allow_tf32`` flags of cuBLAS and cuDNN, which the fp32 operations under autocast follow
    too."""
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def setup_device(name: str, tf32: bool) -> torch.device:
    """The device ``name`` picks (:func:`pick_device`), with TF32 on it as ``tf32`` says
    (:func:`use_tf32`): how a command chooses where it runs."""
    device = pick_device(name)
    use_tf32(device, tf32)
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
    """Whether the device computes in bf16 natively: a GPU of compute capability 8.0 or later
    (Ampere on; ROCm's GPUs as torch counts them), or a CPU with AVX512-BF16 or AMX.

    Not ``torch.cuda.is_bf16_supported()``: by default it also says yes for a GPU that only
    emulates bf16 (a V100 or T4, compute capability 7.x), where bf16 runs far slower than fp16.
    """
    if device.type == "cuda":
        if torch.version.hip:
            return torch.cuda.is_bf16_supported()
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, name, lambda: False)() for name in probes)
    return False
