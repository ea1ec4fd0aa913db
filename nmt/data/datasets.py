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

import numpy as np

from nmt.cli import QUIET, Progress
from nmt.config_checks import Direction, train_corpora
from nmt.data.batching import TokenDataset
from nmt.data.binarize import ensure_prepared
from nmt.data.corpus import DataError, read_parallel, strip_lines
from nmt.data.multilingual import directions_of, languages, placement_of, temperature_factors
from nmt.data.multiprep import DirectionSplit, ensure_multi_prepared, resolve_direction_splits
from nmt.data.splits import Split, log_shares, read_split, resolve_splits, weighted_counts
from nmt.data.tagged import indexed_dataset, tagged_dataset
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
    # a multilingual set: (direction, first, end) of each direction's consecutive sentences
    parts: list[tuple[str, int, int]] = field(default_factory=list)

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
    cfg: Any,
    tokenizers: TokenizerPair,
    source: Multi30kSource | None = None,
    names: Sequence[str] | None = None,
) -> list[EvalSet]:
    """The test split(s) of a data config, or its corpus's splits ``names`` (named as in
    ``data.test``: Multi30k's ``test_2017_flickr``, a file prefix for parallel text), without
    reading the training data."""
    splits = resolve_splits(cfg, list(cfg.test if names is None else names), source)
    return [_eval_set(s, tokenizers) for s in splits]


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
    if directions_of(cfg):
        return prepare_multilingual(cfg, tokenizers, source, progress)
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


def prepare_multilingual(
    cfg: Any,
    tokenizers: TokenizerPair | None = None,
    source: Multi30kSource | None = None,
    progress: Progress = QUIET,
) -> PreparedData:
    """:func:`prepare_data` of a multilingual config (:mod:`nmt.data.multiprep`): the
    directions' pairs over the shared sentence arrays, each direction's corpus weights scaled
    by the sampling temperature, and the validation split of every direction, one after the
    other (``valid.parts``)."""
    cache = ensure_multi_prepared(cfg, tokenizers, source=source, progress=progress)
    tokenizers = cache.tokenizers if tokenizers is None else tokenizers
    tok = tokenizers.src
    directions = directions_of(cfg)
    missing = [lang for lang in languages(directions) if lang not in tok.tags]
    if missing:  # a given tokenizer (fine-tuning) made for other languages, or none
        raise DataError(
            f"the tokenizer has no language tag for {', '.join(missing)} (it has "
            f"{', '.join(sorted(tok.tags)) or 'none'}); a multilingual run needs one per language"
        )
    tag_of = {d.name: tok.tags[d.tgt] for d in directions}
    placement = placement_of(cfg)
    text = cache.arrays
    src_tag_of = {d.name: tok.tags[d.src] for d in directions}
    train = indexed_dataset(
        text["text.tokens"], text["text.offsets"], cache.direction_pairs(),
        [tag_of[c["direction"]] for c in cache.corpora], placement,
        [src_tag_of[c["direction"]] for c in cache.corpora],
    )  # fmt: skip
    weights = [s.weight for s in cache.splits]
    sizes = {d.name: 0.0 for d in directions}  # weighted pairs per direction
    for c, w in zip(cache.corpora, weights, strict=True):
        sizes[c["direction"]] += w * int(c["pairs"])
    scale = temperature_factors(list(sizes.values()), float(cfg.sampling_temperature))
    factors = dict(zip(sizes, scale, strict=True))
    corpora = [
        TrainCorpusInfo(c["name"], int(c["pairs"]), w * factors[c["direction"]])
        for c, w in zip(cache.corpora, weights, strict=True)
    ]
    log_shares([c.name for c in corpora], [c.pairs for c in corpora], [c.weight for c in corpora])
    valid = load_multi_eval(cfg, [cfg.valid], tokenizers, directions, source)[0]
    stats = {
        "train": _summed([c["stats"] for c in cache.corpora]),
        "corpora": [
            {"name": c.name, "direction": s["direction"], "weight": c.weight, **s["stats"]}
            for c, s in zip(corpora, cache.corpora, strict=True)
        ],
        "directions": direction_shares(corpora, cache.corpora),
        "tag_placement": placement,
        "valid": {name: b - a for name, a, b in valid.parts},
        "vocab": {"src": tok.vocab_size, "tgt": tok.vocab_size, "joint": True},
        "files": {f["path"]: f["lines"] for f in cache.manifest["files"]},
        "cache": str(cache.path),
    }
    return PreparedData(tokenizers, train, valid, stats, corpora, cache.path)


def direction_shares(corpora: list[TrainCorpusInfo], records: list[dict]) -> dict[str, dict]:
    """Per direction: its kept pairs, the pairs an epoch draws, and its share of the epoch."""
    counts = weighted_counts([c.pairs for c in corpora], [c.weight for c in corpora])
    total = sum(counts)
    out: dict[str, dict] = {}
    for c, r, m in zip(corpora, records, counts, strict=True):
        entry = out.setdefault(r["direction"], {"pairs": 0, "per_epoch": 0, "share": 0.0})
        entry["pairs"] += c.pairs
        entry["per_epoch"] += m
        entry["share"] = entry["per_epoch"] / total
    return out


def _summed(stats: list[dict]) -> dict:
    keys = ("read", "dropped_empty", "dropped_too_long", "dropped_ratio", "kept")
    return {k: sum(int(s[k]) for s in stats) for k in keys}


def load_multi_eval(
    cfg: Any,
    names: Sequence[str],
    tokenizers: TokenizerPair,
    directions: Sequence[Direction],
    source: Multi30kSource | None = None,
) -> list[EvalSet]:
    """Each named split in every direction, tagged, one EvalSet per split with ``parts``."""
    placement = placement_of(cfg)
    out = []
    for name in names:
        sets = [
            direction_eval_set(s, tokenizers, placement)
            for s in resolve_direction_splits(cfg, [name], list(directions), source)
        ]
        out.append(join_eval_sets(Path(str(name)).name, sets))
    return out


def direction_eval_set(split: DirectionSplit, tokenizers: TokenizerPair, placement: str) -> EvalSet:
    """One direction's split, stripped and encoded with its target tag."""
    src, ref = read_parallel(split.src_path, split.tgt_path)
    src, ref = strip_lines(src), strip_lines(ref)
    tag = tokenizers.tgt.tags[split.direction.tgt]
    src_tag = tokenizers.src.tags[split.direction.src]
    data = tagged_dataset(tokenizers, src, ref, tag, placement, src_tag)
    return EvalSet(split.name, src, ref, data, [(str(split.direction), 0, len(src))])


def join_eval_sets(name: str, sets: Sequence[EvalSet]) -> EvalSet:
    """Several directions' sets as one (``parts`` says where each one lies)."""
    src_ids, ref_ids, forced, parts, src, ref = [], [], [], [], [], []
    for s in sets:
        a = len(src)
        src += s.src_text
        ref += s.ref_text
        src_ids += [s.data.src(i).tolist() for i in range(len(s))]
        ref_ids += [s.data.tgt(i).tolist() for i in range(len(s))]
        if s.data.forced is not None:
            forced.append(s.data.forced)
        parts.append((s.parts[0][0], a, len(src)))
    data = TokenDataset(src_ids, ref_ids)
    if forced:
        data.forced = np.concatenate(forced)
    log.info("%s: %s sentences", name, ", ".join(f"{d} {b - a}" for d, a, b in parts))
    return EvalSet(name, src, ref, data, parts)
