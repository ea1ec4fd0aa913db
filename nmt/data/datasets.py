"""From a data config to tokenized training data and evaluation sets.

The training corpora come from a prepared cache (:mod:`nmt.data.cache`, built by
:mod:`nmt.data.binarize`): built once under
``<data.root>/cache/prepared/``, verified when opened, and memory-mapped by every run and
every rank. Validation and test sets are small: read, stripped and encoded in memory, and never
filtered. The trainer reads only the validation set; the test sets are read by nmt-eval
(:func:`load_test_sets`). Besides Multi30k downloads, only the sentencepiece and prepared caches
are written to disk, each atomically, so a failed preparation leaves nothing behind that a later
run trusts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt.cli import QUIET, Progress
from nmt.config import train_corpora
from nmt.data.batching import TokenDataset
from nmt.data.binarize import ensure_prepared
from nmt.data.corpus import read_parallel, strip_lines
from nmt.data.splits import Split, log_shares, read_split, resolve_splits
from nmt.data.tokenizer import TokenizerPair
from nmt.environment import Multi30kSource

log = logging.getLogger(__name__)


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
class TrainCorpusInfo:
    """One training corpus of a run: its name, pairs kept, and sampling weight."""

    name: str
    pairs: int
    weight: float = 1.0


@dataclass
class PreparedData:
    tokenizers: TokenizerPair
    train: TokenDataset  # the training corpora, one after the other
    valid: EvalSet
    stats: dict = field(default_factory=dict)
    train_corpora: list[TrainCorpusInfo] = field(default_factory=list)  # in ``train`` order
    cache_dir: Path | None = None  # the prepared cache ``train`` maps


def load_test_sets(
    cfg: Any, tokenizers: TokenizerPair, source: Multi30kSource | None = None
) -> list[EvalSet]:
    """The test split(s) of a data config, without reading the training data."""
    return [_eval_set(s, tokenizers) for s in resolve_splits(cfg, list(cfg.test), source)]


def load_valid_set(
    cfg: Any, tokenizers: TokenizerPair, source: Multi30kSource | None = None
) -> EvalSet:
    """The validation split of a data config, without reading the training data."""
    return _eval_set(resolve_splits(cfg, [cfg.valid], source)[0], tokenizers)


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


def _eval_set(split: Split, tokenizers: TokenizerPair) -> EvalSet:
    src, ref = read_split(split)
    src, ref = strip_lines(src), strip_lines(ref)
    evalset = EvalSet(split.name, src, ref, encode_texts(tokenizers, src, ref))
    log.info("%s: %d sentences", split.name, len(evalset))
    return evalset


def prepare_data(
    cfg: Any,
    tokenizers: TokenizerPair | None = None,
    source: Multi30kSource | None = None,
    progress: Progress = QUIET,
) -> PreparedData:
    """The training corpora of ``cfg`` (DataConfig) from their prepared cache, built if needed
    (:func:`nmt.data.binarize.ensure_prepared`), and the validation set.

    Tokenizers are trained (or taken from the caches) on a sample of the cleaned training
    pairs unless given; given ones encode the training data as they are. Only the training
    corpora are filtered; validation sentences are kept as they are. The test splits' files
    are located (so a missing one fails now, not after training) but not read: training never
    uses them, and nmt-eval loads them itself (:func:`load_test_sets`). Multi30k files missing
    from ``data.root`` are fetched from ``source`` (the commands pass
    :func:`nmt.environment.multi30k_source`). A preparation draws its bars with ``progress``.
    """
    cache = ensure_prepared(cfg, tokenizers, source=source, progress=progress)
    tokenizers = cache.tokenizers if tokenizers is None else tokenizers
    train = TokenDataset.from_arrays(cache.side("src"), cache.side("tgt"))
    weights = [c.weight for c in train_corpora(cfg.train)]
    corpora = [
        TrainCorpusInfo(split.name, int(c["pairs"]), w)
        for split, c, w in zip(cache.splits, cache.corpora, weights, strict=True)
    ]
    if len(corpora) > 1 or any(w != 1 for w in weights):
        log_shares([c.name for c in corpora], [c.pairs for c in corpora], weights)
    valid_split, *test_splits = resolve_splits(cfg, [cfg.valid, *cfg.test], source)
    valid = _eval_set(valid_split, tokenizers)
    stats = {
        "train": cache.stats,
        "corpora": [
            {"name": c.name, "weight": c.weight, **s["stats"]}
            for c, s in zip(corpora, cache.corpora, strict=True)
        ],
        "valid": {valid.name: len(valid)},
        "vocab": {
            "src": tokenizers.src.vocab_size,
            "tgt": tokenizers.tgt.vocab_size,
            "joint": tokenizers.joint,
        },
        "files": {
            s.name: [str(p) for p in s.files] for s in (*cache.splits, valid_split, *test_splits)
        },
        "cache": str(cache.path),
    }
    return PreparedData(tokenizers, train, valid, stats, corpora, cache.path)
