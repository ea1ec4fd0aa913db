"""Shared test fixtures. Tests never touch the network: Multi30k comes from a local mirror."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from .helpers import write_subset

REPO = Path(__file__).resolve().parents[1]
_DEFAULT_MIRROR = REPO.parent / "shared" / "data" / "multi30k"

if not os.environ.get("NMT_MULTI30K_MIRROR") and _DEFAULT_MIRROR.is_dir():
    os.environ["NMT_MULTI30K_MIRROR"] = str(_DEFAULT_MIRROR)


@pytest.fixture(scope="session")
def mirror() -> Path:
    """The directory holding the Multi30k .gz files (NMT_MULTI30K_MIRROR)."""
    path = Path(os.environ.get("NMT_MULTI30K_MIRROR", ""))
    if not (path / "train.de.gz").is_file():
        pytest.fail(
            "Multi30k mirror not found: set NMT_MULTI30K_MIRROR to a directory holding "
            "train/val/test_2016_flickr .gz files"
        )
    return path


@pytest.fixture(scope="session")
def corpus(mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 real Multi30k training pairs as plain files; returns their prefix."""
    return write_subset(mirror, tmp_path_factory.mktemp("corpus"), "train", 120)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors: one thread is fastest, and does not fight other processes for cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
