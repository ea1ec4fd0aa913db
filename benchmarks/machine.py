"""The machine a benchmark runs on: device facts, the measured matrix-product peak, and how
busy the CPUs were with other work (figures from a shared machine mean little without it)."""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.memory import load_average
from nmt.runtime.device import cpu_model, device_name, native_bf16

# the dtype of each training precision, for the matmul peak measured in it
PRECISION_DTYPES = {"32": torch.float32, "bf16": torch.bfloat16, "16": torch.float16}


@dataclass
class MatmulSettings:
    """Size of the square products and how long each peak sample runs."""

    n: int
    samples: int
    seconds: float


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so that host timers measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of ``fn()``, device work included."""
    synchronize(device)
    tic = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - tic


def matmul_peak(
    device: torch.device, dtype: torch.dtype, n: int, samples: int, seconds: float
) -> dict[str, Any]:
    """Median TFLOP/s of ``n x n`` products; each sample repeats the product for ``seconds``."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)

    def product() -> None:
        torch.matmul(a, b, out=c)

    timed(product, device)  # warm-up: kernel choice, caches
    repeats = max(1, math.ceil(seconds / max(timed(product, device), 1e-6)))

    def sample() -> None:
        for _ in range(repeats):
            product()

    flops = 2.0 * n**3 * repeats
    tflops = [flops / timed(sample, device) / 1e12 for _ in range(samples)]
    return {
        "n": n,
        "repeats_per_sample": repeats,
        "samples_tflops": [round(x, 4) for x in tflops],
        "tflops": statistics.median(tflops),
    }


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat, or None."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_busy_share(seconds: float = 0.5) -> float | None:
    """Share of all CPUs busy over ``seconds`` while this process sleeps: others' load."""
    before = _cpu_times()
    time.sleep(seconds)
    after = _cpu_times()
    if before is None or after is None or after[1] == before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def load_average_or_none() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return load_average()
    except (OSError, AttributeError):
        return None


def busy_warning(machine: dict[str, Any]) -> str | None:
    """A warning when other work was running on the CPUs as the benchmark started."""
    busy = machine.get("cpu_busy_share_start")
    if busy is None or busy < 0.25:
        return None
    return (
        f"WARNING: {100 * busy:.0f}% of the CPUs were busy with other processes at the start, "
        "so these timings are unreliable (rerun on a quiet machine)"
    )


def machine_info(
    device: torch.device, matmul: MatmulSettings, say: Callable[[str], None]
) -> dict[str, Any]:
    """Device, software, the CPUs' load, and the matrix-product peaks in fp32 and bf16."""
    info: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "python": platform.python_version(),
        "load_average_start": load_average_or_none(),
        "cpu_busy_share_start": cpu_busy_share(),
        "native_bf16": native_bf16(device),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if device.type == "cpu":
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    else:
        props = torch.cuda.get_device_properties(device)
        info["cuda"] = {
            "version": torch.version.cuda,
            "memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        }
    peak = {}
    for name in ("32", "bf16"):
        say(f"matmul peak {name} ({matmul.n} x {matmul.n})")
        dtype = PRECISION_DTYPES[name]
        peak[name] = matmul_peak(device, dtype, matmul.n, matmul.samples, matmul.seconds)
    info["matmul_peak"] = peak
    return info
