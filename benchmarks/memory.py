"""Memory of a process or a process tree from ``/proc`` (Linux): resident and proportional set
sizes, and the peak of a phase of this process (:class:`PeakMemory`).

RSS counts every page a process maps, shared ones included, so summing it over processes
that share memory (forked workers, DDP ranks mapping the same files) counts shared pages
several times; PSS (``/proc/<pid>/smaps_rollup``) divides each shared page among its users,
so the sum over a tree is the memory the tree really holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children, grandchildren...), as now running."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: the fields follow the last ')'
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def load_average() -> list[float]:
    """The machine's 1, 5 and 15-minute load averages, rounded: benchmarks record them, as
    figures from a shared machine mean little without them."""
    return [round(x, 2) for x in os.getloadavg()]


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it. The tree is stopped (SIGSTOP) top-down
    first, so that no process reparents its children or starts new ones in between: a
    launcher such as torchrun runs its workers in sessions of their own, where a signal to the
    launcher's process group does not reach them, and killing the launcher alone orphans them."""
    seen: set[int] = set()
    while True:
        tree = [p for p in descendants(pid) if p not in seen]
        if not tree:
            break
        for p in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
        seen.update(tree)
    for p in seen:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


def _kib_field(text: str, name: str) -> int:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    return 0


def rss(pid: int) -> tuple[int, int]:
    """(current, peak) resident set size of a process in bytes; (0, 0) once it is gone."""
    try:
        text = (PROC / str(pid) / "status").read_text()
    except OSError:
        return 0, 0
    return _kib_field(text, "VmRSS"), _kib_field(text, "VmHWM")


def pss(pid: int) -> int:
    """Proportional set size of a process in bytes (0 once it is gone)."""
    return pss_parts(pid)[0]


def pss_parts(pid: int) -> tuple[int, int, int]:
    """(PSS, its anonymous part, its file-backed part) of a process in bytes: mapped files (a
    memory-mapped cache, libraries) show in the third, the heap in the second."""
    try:
        text = (PROC / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return 0, 0, 0
    return _kib_field(text, "Pss"), _kib_field(text, "Pss_Anon"), _kib_field(text, "Pss_File")


def cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@dataclass
class TreeMemory:
    """Peaks seen by a :class:`TreeSampler` (bytes)."""

    rss_sum: int = 0  # the largest sum of RSS over the selected processes at one sample
    pss_sum: int = 0  # the largest sum of PSS at one sample
    hwm: dict[int, int] = field(default_factory=dict)  # each process's own peak RSS (VmHWM)
    samples: int = 0
    last_pss_sum: int = 0
    last_rss_sum: int = 0
    last_pss_anon: int = 0  # the anonymous and file-backed parts of the last PSS sum
    last_pss_file: int = 0
    series: list[tuple[float, int]] = field(default_factory=list)  # (monotonic s, PSS sum)


class TreeSampler:
    """Samples the memory of a process tree in a background thread.

    ``select`` picks the processes counted (default: all of the tree under ``pid``).
    """

    def __init__(
        self,
        pid: int,
        interval: float = 0.05,
        select: Callable[[int], bool] | None = None,
        with_pss: bool = True,
    ) -> None:
        self.pid, self.interval, self.select, self.with_pss = pid, interval, select, with_pss
        self.peak = TreeMemory()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def processes(self) -> Iterable[int]:
        tree = descendants(self.pid)
        return [p for p in tree if self.select is None or self.select(p)]

    def sample(self) -> TreeMemory:
        """Take one sample now (also called by the thread); the peaks and this sample."""
        with self._lock:
            pids = list(self.processes())
            total_rss = total_pss = anon = file = 0
            for p in pids:
                now, high = rss(p)
                total_rss += now
                if high:
                    self.peak.hwm[p] = max(self.peak.hwm.get(p, 0), high)
                if self.with_pss:
                    parts = pss_parts(p)
                    total_pss += parts[0]
                    anon += parts[1]
                    file += parts[2]
            peak = self.peak
            peak.rss_sum = max(peak.rss_sum, total_rss)
            peak.pss_sum = max(peak.pss_sum, total_pss)
            peak.last_rss_sum, peak.last_pss_sum = total_rss, total_pss
            peak.last_pss_anon, peak.last_pss_file = anon, file
            peak.samples += 1
            if self.with_pss:
                peak.series.append((time.monotonic(), total_pss))
            return peak

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def wait_with_rusage(proc_pid: int) -> tuple[int, int]:
    """Wait for a child; (exit code, its peak RSS in bytes as the kernel counted it)."""
    _, status, usage = os.wait4(proc_pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024


def release_free_heap() -> None:
    """Hand freed heap pages back to the OS (glibc), so the next phase's RSS starts lower."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakMemory:
    """Peak memory of a phase: CUDA allocated bytes, or on CPU the growth of resident memory.

    On Linux the resident high-water mark is reset at :meth:`start` (``/proc/self/clear_refs``),
    so each phase gets its own peak; where that fails, the process-wide ``ru_maxrss`` is used
    (it never goes down, so later phases may read 0 growth).
    """

    def __init__(self, device: Any) -> None:
        self.device = device  # a torch.device (torch is imported only where CUDA is measured)
        self.base = 0
        self.method = ""

    def start(self) -> None:
        gc.collect()
        release_free_heap()
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            self.method = "cuda_max_memory_allocated"
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.base = rss(os.getpid())[0]
            self.method = "rss_high_water_growth"
        except OSError:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.method = "ru_maxrss_growth"

    def read(self) -> dict[str, Any]:
        """{"peak_bytes": absolute peak, "growth_bytes": peak minus the level at start}."""
        if self.device.type == "cuda":
            import torch

            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.method == "rss_high_water_growth":
            peak = rss(os.getpid())[1]
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"method": self.method, "peak_bytes": peak, "growth_bytes": max(peak - self.base, 0)}
