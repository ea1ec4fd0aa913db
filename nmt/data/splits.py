"""The corpora a data config names: the files of each split (Multi30k's fetched where missing,
a ``data=parallel`` prefix, or a dataset: :mod:`nmt.data.hfdata`), the training corpora with
their weights, reading any of them, and the length filter.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nmt.cli import Advance, no_progress
from nmt.config_checks import train_corpora
from nmt.data.corpus import (
    DataError,
    fetch_multi30k,
    iter_parallel_blocks,
    resolve_pair,
)
from nmt.data.hfdata import (
    Dataset,
    dataset_name,
    has_dataset_suffix,
    is_dataset,
    iter_dataset_blocks,
    open_dataset,
)
from nmt.environment import Multi30kSource

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- corpora


@dataclass
class Split:
    """A parallel split: its display name and its two files, or the dataset it is (then both
    paths are the dataset's)."""

    name: str
    src_path: Path
    tgt_path: Path
    dataset: Dataset | None = None

    @property
    def files(self) -> list[Path]:
        """The files read: the two text files, or the dataset's data files."""
        return [self.src_path, self.tgt_path] if self.dataset is None else [*self.dataset.files]

    @property
    def where(self) -> str:
        """The corpus in messages: both text files, or the dataset's path."""
        if self.dataset is None:
            return f"{self.src_path} / {self.tgt_path}"
        return str(self.dataset.path)

    def blocks(self, advance: Advance = no_progress) -> Iterator[tuple[list[str], list[str]]]:
        """Aligned blocks of (source, target) lines, text files or dataset; ``advance`` is
        called with the bytes read, which add up to the size of :attr:`files`."""
        if self.dataset is not None:
            return iter_dataset_blocks(self.dataset, advance)
        return iter_parallel_blocks(self.src_path, self.tgt_path, advance=advance)


@dataclass
class TrainSplit(Split):
    """A training corpus and its sampling weight (``data.train``)."""

    weight: float = 1.0


def resolve_splits(
    cfg: Any, names: Sequence[str], source: Multi30kSource | None = None
) -> list[Split]:
    """The files of the named splits (Multi30k's fetched from ``source`` where missing)."""
    if cfg.corpus == "multi30k":
        base = fetch_multi30k(
            Path(cfg.root), [cfg.src_lang, cfg.tgt_lang], dict.fromkeys(names), source
        )
        prefixes: list[str | Path] = [base / name for name in names]
    elif cfg.corpus == "parallel":
        prefixes = list(names)
    else:
        raise DataError(f"data.corpus={cfg.corpus!r} is not one of: multi30k, parallel")
    return [_split(p, cfg) for p in prefixes]


def _split(prefix: str | Path, cfg: Any) -> Split:
    name = Path(str(prefix)).name
    if cfg.corpus == "parallel" and is_dataset(prefix):
        ds = open_dataset(prefix, cfg.src_lang, cfg.tgt_lang, cfg.column)
        return Split(dataset_name(ds), ds.path, ds.path, ds)
    try:
        return Split(name, *resolve_pair(prefix, cfg.src_lang, cfg.tgt_lang))
    except DataError as err:
        if cfg.corpus == "parallel" and has_dataset_suffix(prefix):
            raise DataError(f"{prefix}: no such dataset file") from err
        raise


def read_split(split: Split) -> tuple[list[str], list[str]]:
    """Both sides of a split, whole."""
    src: list[str] = []
    tgt: list[str] = []
    for s, t in split.blocks():
        src += s
        tgt += t
    return src, tgt


def resolve_train(cfg: Any, source: Multi30kSource | None = None) -> list[TrainSplit]:
    """The training corpora of ``data.train`` with their weights."""
    corpora = train_corpora(cfg.train)
    splits = resolve_splits(cfg, [c.prefix for c in corpora], source)
    names = [s.name for s in splits]
    unique = len(set(names)) == len(names)
    return [
        TrainSplit(
            s.name if unique else c.prefix, s.src_path, s.tgt_path, s.dataset, weight=c.weight
        )
        for s, c in zip(splits, corpora, strict=True)
    ]


def no_data_error(split: Split, stats: dict, cfg: Any) -> DataError:
    """Nothing left of a training corpus after cleaning and filtering."""
    return DataError(
        f"no training pairs left from {split.where}: read "
        f"{stats['read']}, dropped {stats['dropped_empty']} with an empty side, "
        f"{stats.get('dropped_too_long', 0)} longer than data.max_len={cfg.max_len} tokens, "
        f"{stats.get('dropped_ratio', 0)} with a length ratio above "
        f"data.max_len_ratio={cfg.max_len_ratio}"
    )


def filter_by_length(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_len: int, max_len_ratio: float
) -> tuple[np.ndarray, dict]:
    """Indices of pairs within ``max_len`` tokens per side and ``max_len_ratio``; drop counts.

    A pair over the length limit counts as ``dropped_too_long`` only, even if its ratio is bad.
    """
    s = np.asarray(src_lens, dtype=np.int64)  # (N,)
    t = np.asarray(tgt_lens, dtype=np.int64)  # (N,)
    too_long = (s > max_len) | (t > max_len)
    ratio = np.maximum(s, t) / np.maximum(np.minimum(s, t), 1)
    bad_ratio = ~too_long & (ratio > max_len_ratio)
    keep = np.flatnonzero(~(too_long | bad_ratio))
    return keep, {"dropped_too_long": int(too_long.sum()), "dropped_ratio": int(bad_ratio.sum())}


def weighted_counts(sizes: Sequence[int], weights: Sequence[float]) -> list[int]:
    """Pairs drawn from each corpus per epoch: ``round(weight * pairs)``, at least 1."""
    return [max(1, round(w * n)) for n, w in zip(sizes, weights, strict=True)]


def log_shares(names: Sequence[str], sizes: Sequence[int], weights: Sequence[float]) -> None:
    """One line per corpus: pairs, weight, pairs per epoch and share of the epoch."""
    counts = weighted_counts(sizes, weights)
    total = sum(counts)
    for name, n, w, m in zip(names, sizes, weights, counts, strict=True):
        log.info(
            "corpus %s: %d pairs x weight %g = %d per epoch (%.1f%% of the epoch)",
            name, n, w, m, 100 * m / total,
        )  # fmt: skip
