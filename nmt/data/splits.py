"""The corpora a data config names: the files of each split (Multi30k's fetched where missing,
or a ``data=parallel`` prefix), the training corpora with their weights, and the length filter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nmt.config import train_corpora
from nmt.data.corpus import (
    DataError,
    fetch_multi30k,
    resolve_pair,
)
from nmt.environment import Multi30kSource

# --------------------------------------------------------------------------- corpora


@dataclass
class Split:
    """A parallel split: its display name and its two files."""

    name: str
    src_path: Path
    tgt_path: Path


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
    return [
        Split(Path(str(p)).name, *resolve_pair(p, cfg.src_lang, cfg.tgt_lang)) for p in prefixes
    ]


def resolve_train(cfg: Any, source: Multi30kSource | None = None) -> list[TrainSplit]:
    """The training corpora of ``data.train`` with their weights."""
    corpora = train_corpora(cfg.train)
    splits = resolve_splits(cfg, [c.prefix for c in corpora], source)
    names = [s.name for s in splits]
    unique = len(set(names)) == len(names)
    return [
        TrainSplit(s.name if unique else c.prefix, s.src_path, s.tgt_path, c.weight)
        for s, c in zip(splits, corpora, strict=True)
    ]


def no_data_error(split: Split, stats: dict, cfg: Any) -> DataError:
    """Nothing left of a training corpus after cleaning and filtering."""
    return DataError(
        f"no training pairs left from {split.src_path} / {split.tgt_path}: read "
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
