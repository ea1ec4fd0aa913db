"""From a data config to tokenized training data and evaluation sets (used by the trainer).

Only two things are written to disk: verified Multi30k downloads and the atomically written
SentencePiece cache; everything else lives in memory, so a failed preparation leaves nothing
behind that a later run would trust.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nmt.data.batching import TokenDataset
from nmt.data.corpus import (
    DataError,
    clean_pairs,
    fetch_multi30k,
    read_parallel,
    resolve_pair,
    strip_lines,
)
from nmt.data.tokenizer import TokenizerPair, train_tokenizers

log = logging.getLogger("nmt.data")


@dataclass
class EvalSet:
    """A validation or test split: stripped raw text (references for BLEU) and token ids."""

    name: str
    src_text: list[str]
    ref_text: list[str]
    data: TokenDataset

    def __len__(self) -> int:
        return len(self.src_text)


@dataclass
class PreparedData:
    tokenizers: TokenizerPair
    train: TokenDataset
    valid: EvalSet
    tests: list[EvalSet]
    stats: dict = field(default_factory=dict)


@dataclass
class _Split:
    name: str
    src_path: Path
    tgt_path: Path


def _resolve(cfg: Any, names: list[str]) -> list[_Split]:
    """The files of the named splits (fetching Multi30k if needed)."""
    if cfg.corpus == "multi30k":
        base = fetch_multi30k(Path(cfg.root), [cfg.src_lang, cfg.tgt_lang], dict.fromkeys(names))
        prefixes: list[str | Path] = [base / name for name in names]
    elif cfg.corpus == "parallel":
        prefixes = list(names)
    else:
        raise DataError(f"data.corpus={cfg.corpus!r} is not one of: multi30k, parallel")
    return [
        _Split(Path(str(p)).name, *resolve_pair(p, cfg.src_lang, cfg.tgt_lang)) for p in prefixes
    ]


def _splits(cfg: Any) -> tuple[_Split, _Split, list[_Split]]:
    """The train, valid and test files named by the config."""
    splits = _resolve(cfg, [cfg.train, cfg.valid, *cfg.test])
    return splits[0], splits[1], splits[2:]


def load_test_sets(cfg: Any, tokenizers: TokenizerPair) -> list[EvalSet]:
    """The test split(s) of a data config, without reading the training data."""
    return [_eval_set(s, tokenizers) for s in _resolve(cfg, list(cfg.test))]


def load_valid_set(cfg: Any, tokenizers: TokenizerPair) -> EvalSet:
    """The validation split of a data config, without reading the training data."""
    return _eval_set(_resolve(cfg, [cfg.valid])[0], tokenizers)


def encode_texts(
    tokenizers: TokenizerPair, src_text: Sequence[str], ref_text: Sequence[str]
) -> TokenDataset:
    """Token ids of both sides (no filtering, no truncation)."""
    return TokenDataset(
        tokenizers.src.encode_batch(src_text), tokenizers.tgt.encode_batch(ref_text)
    )


def load_eval_set(
    name: str, src_path: str | Path, ref_path: str | Path, tokenizers: TokenizerPair
) -> EvalSet:
    """Read, strip and encode a parallel evaluation set (nothing is dropped)."""
    src, ref = read_parallel(src_path, ref_path)
    src, ref = strip_lines(src), strip_lines(ref)
    return EvalSet(name, src, ref, encode_texts(tokenizers, src, ref))


def length_filter(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    max_len: int,
    max_len_ratio: float,
) -> tuple[np.ndarray, dict]:
    """Indices of pairs within ``max_len`` tokens per side and ``max_len_ratio``; drop counts.

    A pair over the length limit counts as ``dropped_too_long`` only, even if its ratio is bad.
    """
    s = np.fromiter(map(len, src_ids), dtype=np.int64, count=len(src_ids))  # (N,)
    t = np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(tgt_ids))  # (N,)
    too_long = (s > max_len) | (t > max_len)
    ratio = np.maximum(s, t) / np.maximum(np.minimum(s, t), 1)
    bad_ratio = ~too_long & (ratio > max_len_ratio)
    keep = np.flatnonzero(~(too_long | bad_ratio))
    return keep, {"dropped_too_long": int(too_long.sum()), "dropped_ratio": int(bad_ratio.sum())}


def _no_data_error(split: _Split, stats: dict, cfg: Any) -> DataError:
    return DataError(
        f"no training pairs left from {split.src_path} / {split.tgt_path}: read "
        f"{stats['read']}, dropped {stats['dropped_empty']} with an empty side, "
        f"{stats.get('dropped_too_long', 0)} longer than data.max_len={cfg.max_len} tokens, "
        f"{stats.get('dropped_ratio', 0)} with a length ratio above "
        f"data.max_len_ratio={cfg.max_len_ratio}"
    )


def _train_tokenizers(cfg: Any, src: list[str], tgt: list[str]) -> TokenizerPair:
    return train_tokenizers(
        src,
        tgt,
        Path(cfg.root) / "cache" / "spm",
        joint=bool(cfg.joint_vocab),
        vocab_size=int(cfg.vocab_size),
        model_type=str(cfg.spm_model_type),
        character_coverage=float(cfg.character_coverage),
    )


def _prepare_train(
    cfg: Any, split: _Split, tokenizers: TokenizerPair | None
) -> tuple[TokenizerPair, TokenDataset, dict]:
    src, tgt = read_parallel(split.src_path, split.tgt_path)
    src, tgt, stats = clean_pairs(src, tgt)
    if not src:
        raise _no_data_error(split, stats, cfg)
    if tokenizers is None:
        tokenizers = _train_tokenizers(cfg, src, tgt)
    src_ids, tgt_ids = tokenizers.src.encode_batch(src), tokenizers.tgt.encode_batch(tgt)
    keep, drops = length_filter(src_ids, tgt_ids, cfg.max_len, cfg.max_len_ratio)
    stats.update(drops, kept=len(keep))
    if not len(keep):
        raise _no_data_error(split, stats, cfg)
    log.info(
        "train %s: read %d, dropped empty %d, dropped too long %d, dropped ratio %d, kept %d",
        split.name,
        stats["read"],
        stats["dropped_empty"],
        stats["dropped_too_long"],
        stats["dropped_ratio"],
        stats["kept"],
    )
    data = TokenDataset([src_ids[i] for i in keep], [tgt_ids[i] for i in keep])
    return tokenizers, data, stats


def _eval_set(split: _Split, tokenizers: TokenizerPair) -> EvalSet:
    evalset = load_eval_set(split.name, split.src_path, split.tgt_path, tokenizers)
    log.info("%s: %d sentences", split.name, len(evalset))
    return evalset


def prepare_data(cfg: Any, tokenizers: TokenizerPair | None = None) -> PreparedData:
    """Resolve, read, clean, tokenize and filter the corpus described by ``cfg`` (DataConfig).

    Tokenizers are trained (or taken from the cache) on the cleaned training text unless
    given. Only the training split is filtered; valid/test sentences are kept as they are.
    """
    train_split, valid_split, test_splits = _splits(cfg)
    tokenizers, train, train_stats = _prepare_train(cfg, train_split, tokenizers)
    valid = _eval_set(valid_split, tokenizers)
    tests = [_eval_set(s, tokenizers) for s in test_splits]
    stats = {
        "train": train_stats,
        "valid": {valid.name: len(valid)},
        "tests": {t.name: len(t) for t in tests},
        "vocab": {
            "src": tokenizers.src.vocab_size,
            "tgt": tokenizers.tgt.vocab_size,
            "joint": tokenizers.joint,
        },
        "files": {
            s.name: [str(s.src_path), str(s.tgt_path)]
            for s in (train_split, valid_split, *test_splits)
        },
    }
    return PreparedData(tokenizers, train, valid, tests, stats)
