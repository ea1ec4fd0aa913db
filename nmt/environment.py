"""Every environment variable nmt reads or sets, and the functions that do it.

No other module touches ``os.environ``: the commands (and the tests) read the variables through
these functions and pass the values on, and the code below the commands takes them as
arguments. :data:`VARIABLES` is the table the README's "Environment variables" lists.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

CONFIG_DIR = "NMT_CONFIG_DIR"
MULTI30K_MIRROR = "NMT_MULTI30K_MIRROR"
MULTI30K_URL = "NMT_MULTI30K_URL"
MULTI30K_OFFICIAL_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
# torchrun's rank variables, and submitit's marker of a SLURM task
TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SUBMITIT_EXECUTOR = "SUBMITIT_EXECUTOR"
# the seconds a rank waits in a collective for the others (torch's own default for NCCL)
DIST_TIMEOUT = "NMT_DIST_TIMEOUT"
DIST_TIMEOUT_SECONDS = 600.0
# what torchrun's elastic agent sets besides the ranks: how often it restarted the workers and
# the id of its rendezvous (the same across restarts)
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
RUN_ID = "TORCHELASTIC_RUN_ID"
MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
# torchrun's switch that gives each worker group a store of its own (pytorch#135712)
SEPARATE_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
LAUNCHER = (*TORCHRUN, SUBMITIT_EXECUTOR, RESTART_COUNT, RUN_ID, MAX_RESTARTS, AGENT_STORE)
ONEDNN_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
ONEDNN_CACHE_ENTRIES = "16"
SACREBLEU_SEED = "SACREBLEU_SEED"
MKL_FAST_MM = "MKL_DISABLE_FAST_MM"
MKL_THREADS = "MKL_NUM_THREADS"

VARIABLES: dict[str, str] = {
    CONFIG_DIR: "read: the Hydra config directory of every command (default: `./configs` when "
    "it has a `train.yaml`, else the configs inside the package)",
    MULTI30K_MIRROR: "read: a directory holding Multi30k's `.gz` files, copied instead of "
    "downloaded (offline machines, CI)",
    MULTI30K_URL: "read: the base URL of an HTTP mirror serving Multi30k as "
    "`<base>/<split>.<lang>.gz` (default: the official repository)",
    ", ".join(TORCHRUN): "read (set by torchrun): "
    "`nmt-train` joins a process group when `WORLD_SIZE` > 1",
    f"{RESTART_COUNT}, {RUN_ID}": "read (set by torchrun): a restarted worker group "
    "(`--max-restarts`) continues the run directory of its first start, from its newest "
    "checkpoint that verifies",
    f"{MAX_RESTARTS}, {AGENT_STORE}": "read (set by torchrun): a worker warns when torchrun "
    f"may restart it but shares its rendezvous store with the workers (see {SEPARATE_STORE})",
    SEPARATE_STORE: "set to 1 by `make train` for torchrun: each restarted worker group gets a "
    "store of its own; with the store torchrun shares by default, a restarted group can read "
    "the previous group's addresses and fail to connect (pytorch#135712)",
    DIST_TIMEOUT: "read: the seconds a rank of `nmt-train` under torchrun waits in a collective "
    "operation for the other ranks (rank 0's validation and checkpoint writing included) before "
    f"it fails with an error (default: {DIST_TIMEOUT_SECONDS:.0f})",
    SUBMITIT_EXECUTOR: "read (set by submitit): a SLURM task of several gets its rank "
    "variables from SLURM (`hydra/launcher=slurm`)",
    ", ".join(ONEDNN_CACHES): f"set to {ONEDNN_CACHE_ENTRIES} when nmt is imported, "
    "unless already set: oneDNN's kernel caches, which otherwise grow by gigabytes over a bf16 "
    "CPU run",
    MKL_FAST_MM: "set to 1 by `nmt-serve engine=ctranslate2`, unless already set: Intel MKL "
    "gives the memory of the largest batches back",
    SACREBLEU_SEED: "set for the length of one paired bootstrap test (sacreBLEU reads its seed "
    "from it only), then restored",
}


def config_dir_override() -> Path | None:
    """``$NMT_CONFIG_DIR`` as an absolute path, or None when unset."""
    value = os.environ.get(CONFIG_DIR)
    return Path(value).resolve() if value else None


@dataclass(frozen=True)
class Multi30kSource:
    """Where Multi30k files missing from the data root come from: a mirror directory, else the
    base URL of the ``<split>.<lang>.gz`` files."""

    mirror: Path | None = None
    url: str = MULTI30K_OFFICIAL_URL

    def file_url(self, split: str, lang: str) -> str:
        return f"{self.url.rstrip('/')}/{split}.{lang}.gz"


def multi30k_source() -> Multi30kSource:
    """The source ``$NMT_MULTI30K_MIRROR`` and ``$NMT_MULTI30K_URL`` name."""
    mirror = os.environ.get(MULTI30K_MIRROR, "").strip()
    url = os.environ.get(MULTI30K_URL, "").strip() or MULTI30K_OFFICIAL_URL
    return Multi30kSource(Path(mirror) if mirror else None, url)


def launcher_variables() -> dict[str, str]:
    """The launcher's variables that are set (torchrun's ranks, submitit's executor)."""
    return {k: os.environ[k] for k in LAUNCHER if k in os.environ}


def dist_timeout() -> float:
    """``$NMT_DIST_TIMEOUT`` in seconds, else :data:`DIST_TIMEOUT_SECONDS`; ValueError unless
    a finite number above 0."""
    value = os.environ.get(DIST_TIMEOUT, "").strip()
    if not value:
        return DIST_TIMEOUT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{DIST_TIMEOUT}={value!r}: expected a number of seconds above 0")
    return seconds


def export_launcher_variables(values: Mapping[str, str]) -> None:
    """Set rank variables for ``torch.distributed``'s ``env://`` rendezvous, which reads them."""
    os.environ.update(values)


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment with ``extra`` added, for a child process."""
    return {**os.environ, **extra}


def set_onednn_cache_capacity() -> None:
    """Bound oneDNN's two kernel caches (read when oneDNN first builds a kernel).

    PyTorch runs bf16 matrix products on a CPU with oneDNN, which keeps what it builds for each
    operation and tensor shape in two process-wide caches of 1,024 entries: oneDNN's primitive
    cache and ideep's (``LRU_CACHE_CAPACITY``). Token batches have many shapes, and a bf16
    training run on a CPU grew by gigabytes of resident memory over 30 minutes as the caches
    filled (fp32 does not use them and stays flat). Sixteen entries each keep bf16 training flat
    at the same speed. Values already in the environment win.
    """
    for name in ONEDNN_CACHES:
        os.environ.setdefault(name, ONEDNN_CACHE_ENTRIES)


def disable_mkl_fast_mm() -> None:
    """Turn Intel MKL's memory pool off (read when MKL first allocates) unless set already."""
    os.environ.setdefault(MKL_FAST_MM, "1")


@contextlib.contextmanager
def _variable(name: str, value: str | None) -> Iterator[None]:
    """``$name`` set to ``value`` (None: taken out) inside the block, as it was after."""
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def mkl_threads_unset(unset: bool = True) -> contextlib.AbstractContextManager[None]:
    """``$MKL_NUM_THREADS`` out of the environment inside the block (when ``unset``), as it was
    after: for a library whose MKL reads it at its first matrix product (CTranslate2's)."""
    return _variable(MKL_THREADS, None) if unset else contextlib.nullcontext()


def sacrebleu_seed(seed: int) -> contextlib.AbstractContextManager[None]:
    """``$SACREBLEU_SEED`` set to ``seed`` for the block, then restored."""
    return _variable(SACREBLEU_SEED, str(seed))
