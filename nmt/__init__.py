"""nmt: attention-based neural machine translation (GRU + Bahdanau attention, Transformer).

The package is built in layers; each sub-package's docstring says what lives there and what it
may import. From the ground up:

* the ground floor, imported by everything: :mod:`nmt.environment` (every environment
  variable), :mod:`nmt.cli` (errors, exit status, logging, the config directory),
  :mod:`nmt.atomic` (atomic files, checksums), :mod:`nmt.config` (the typed config schema);
* :mod:`nmt.data` (corpora, tokenizers, the prepared cache, batches) and :mod:`nmt.models`
  (attention, the GRU and Transformer, the loss), which do not import each other;
* :mod:`nmt.runtime` (devices, precision, distributed processes);
* :mod:`nmt.store` (checkpoints, run directories, model packages, and loading them through
  one gate);
* :mod:`nmt.decode` (search, decoding options, the engines, ``nmt-translate``);
* :mod:`nmt.evaluate` (metrics, ``nmt-eval``, ``nmt-tune-decode``) and :mod:`nmt.viz`
  (attention pictures, the explorer page, ``nmt-attention``);
* :mod:`nmt.train` (the training loop and ``nmt-train``) and :mod:`nmt.ship` (``nmt-export``,
  the CTranslate2 converter, ``nmt-serve``).

Outside the package, in the repository: the benchmarks (``benchmarks/``, run through
``scripts/``) and the documentation site's generator (``docs/hooks/``), both consumers that may
import any layer and are never imported by it.

Importing nmt checks that the installed PyTorch is :data:`TORCH_FLOOR` or later
(:func:`check_torch_version`), before any of it runs.
"""

import importlib.metadata
import re

from nmt.environment import set_onednn_cache_capacity

__version__ = "0.1.0"
# the oldest PyTorch nmt runs on (pyproject.toml's floor): torch.get_autocast_dtype and
# torch.is_autocast_enabled of a device type (the loss), fused Adam on a CPU, bf16 GRUCell on CUDA
TORCH_FLOOR = (2, 4)


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string, without pre-release, dev or local parts:
    ``2.13.0+cpu`` -> (2, 13, 0), ``2.6.0a0+git1a2b3c`` -> (2, 6, 0); ValueError without any."""
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if found is None:
        raise ValueError(f"{version!r} is not a version")
    return tuple(int(part) for part in found.group(1).split("."))


def check_torch_version(installed: str) -> None:
    """ImportError naming the installed PyTorch, the floor and how to install one, when
    ``installed`` is older than :data:`TORCH_FLOOR` (a development build of the floor's release,
    ``2.4.0a0+git...``, counts as that release); an unreadable version passes."""
    try:
        too_old = release(installed) < TORCH_FLOOR
    except ValueError:
        return
    if too_old:
        floor = ".".join(map(str, TORCH_FLOOR))
        raise ImportError(
            f"nmt needs PyTorch {floor} or later, and torch {installed} is installed: "
            f"pip install 'torch>={floor}'"
        )


def _check_installed_torch() -> None:
    """:func:`check_torch_version` of the installed torch, read from its package metadata
    (importing torch takes a second, which the CTranslate2 server, running without it, spares)."""
    try:
        installed = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # no metadata to read: torch's import says
        return
    check_torch_version(installed)


_check_installed_torch()

# oneDNN reads its cache sizes when it first builds a kernel: before any model runs
set_onednn_cache_capacity()
