"""Shared test fixtures.

The tests that read Multi30k get it as `make train` does, through ``fetch_multi30k`` into the
repository's ``data/multi30k``: already there (and verified), copied from
``NMT_MULTI30K_MIRROR``, or downloaded once (from ``NMT_MULTI30K_URL`` or the official URL).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from nmt.data.corpus import MULTI30K_SPLITS, DataError, fetch_multi30k

from .helpers import write_subset

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = REPO / "data"  # the default data.root of `make train`, which runs in the repository
TEST_LANGS = ("de", "en")


@pytest.fixture(scope="session")
def multi30k() -> Path:
    """The directory of verified Multi30k de/en files of every split (``data/multi30k``).

    Without a copy, a mirror or the network, the session stops here with the message that
    `make train` gives, instead of one error per test that needs the corpus.
    """
    try:
        return fetch_multi30k(DATA_ROOT, TEST_LANGS, MULTI30K_SPLITS)
    except DataError as err:
        pytest.exit(f"Multi30k is needed by the tests and could not be fetched: {err}", 1)


@pytest.fixture(scope="session")
def corpus(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 real Multi30k training pairs as plain files; returns their prefix."""
    return write_subset(multi30k, tmp_path_factory.mktemp("corpus"), "train", 120)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors: one thread is fastest, and does not fight other processes for cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
