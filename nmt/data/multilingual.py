"""One model for several directions (Johnson et al. 2017): directions, language tags, the
sampling of directions by temperature, and tagged token data.

A multilingual run names its directions in ``data.directions`` (``[de-en, en-fr]``). One joint
sentencepiece model covers every language, with one tag per language (``<2fr>``) as a
user-defined piece (ids 4, 5, ... in sorted order of the languages). The tag of the target
language goes where ``data.tag_placement`` says:

* ``source``: the source's first token (``<2fr> Ein Mann ...``);
* ``target``: the target's first token; decoding forces it as the first output token.

The directions and the placement live in the run's config (``data.directions``,
``data.tag_placement``), which every checkpoint holds; :func:`tagged_dataset` builds a
decoder's input for any direction from them, and :func:`target_tag` refuses a target
language the model has no tag for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from nmt.config import Direction, parse_directions
from nmt.data.batching import TokenDataset, _Side
from nmt.data.corpus import DataError
from nmt.data.tokenizer import PAD_ID, Tokenizer, TokenizerPair, language_tag

NO_TAG = -1  # TokenDataset.forced of a sentence without a forced first token


def directions_of(cfg: Any) -> list[Direction]:
    """The directions of a data config (none for a bilingual one, or one from before them)."""
    return parse_directions(cfg.get("directions") if hasattr(cfg, "get") else None)


def placement_of(cfg: Any) -> str:
    """``data.tag_placement`` (source for configs from before it)."""
    return str(cfg.get("tag_placement", "source") or "source")


def languages(directions: Sequence[Direction]) -> list[str]:
    """Every language of the directions, sorted (the order of their tags' ids)."""
    return sorted({lang for d in directions for lang in (d.src, d.tgt)})


def tags_for(directions: Sequence[Direction]) -> list[str]:
    """The tag pieces of a multilingual sentencepiece model, in id order."""
    return [language_tag(lang) for lang in languages(directions)]


def target_languages(cfg: Any) -> list[str]:
    """The languages a run was trained to translate into, sorted."""
    return sorted({d.tgt for d in directions_of(cfg)})


def target_tag(tokenizer: Tokenizer, lang: str, trained_targets: Sequence[str]) -> int:
    """The id of ``lang``'s tag; DataError naming the languages the model has otherwise."""
    if lang not in trained_targets or lang not in tokenizer.tags:
        raise DataError(
            f"target language {lang!r} was not trained: this model translates into "
            f"{', '.join(trained_targets) or 'no tagged language'}"
        )
    return tokenizer.tags[lang]


# --------------------------------------------------------------------------- sampling


def temperature_shares(sizes: Sequence[float], temperature: float) -> list[float]:
    """Each direction's share of an epoch: ``size ** (1 / T)``, normalised (T = inf: equal)."""
    if not sizes:
        return []
    power = 0.0 if math.isinf(temperature) else 1.0 / temperature
    # relative to the largest size, so no power overflows
    top = max(sizes)
    raw = [(s / top) ** power if s > 0 else 0.0 for s in sizes]
    total = sum(raw)
    return [r / total for r in raw]


def temperature_factors(sizes: Sequence[float], temperature: float) -> list[float]:
    """The factor on each direction's corpus weights so that an epoch (as many pairs as
    before) gives each direction its :func:`temperature_shares` share (1 at T = 1)."""
    total = sum(sizes)
    shares = temperature_shares(sizes, temperature)
    return [share * total / s for share, s in zip(shares, sizes, strict=True)]


# --------------------------------------------------------------------------- tagged data


class IndexedSide(_Side):
    """One side of the training pairs of every direction: sentence ``i`` is ``flat[starts[i]:
    starts[i] + text_lens[i]]`` of the shared per-language arrays, after its ``tags[i]`` (the
    target tag, when this side carries it; :data:`NO_TAG` for none). ``lens`` count the tag."""

    def __init__(
        self, flat: np.ndarray, starts: np.ndarray, text_lens: np.ndarray, tags: np.ndarray
    ) -> None:
        has = (tags != NO_TAG).astype(np.int32)  # (N,)
        lens = np.asarray(text_lens, dtype=np.int32) + has  # (N,)
        offsets = np.append(np.asarray(starts, dtype=np.int64), 0)  # gather reads offsets[idx]
        super().__init__(flat, offsets, lens)
        self.tags = np.asarray(tags, dtype=np.int32)  # (N,)

    def item(self, i: int) -> Tensor:
        ids, _ = self.gather(np.array([i]))
        return ids[0].to(torch.int32)

    def subset(self, idx: np.ndarray) -> _Side:
        ids, lens = self.gather(np.asarray(idx, dtype=np.int64))
        return _Side.from_lists([row[:n].tolist() for row, n in zip(ids, lens, strict=True)])

    def gather(self, idx: np.ndarray) -> tuple[Tensor, Tensor]:
        """Sentences ``idx`` as (B, L) int64 right-padded with PAD, tag first, and (B,) lengths."""
        lens = np.asarray(self.lens[idx], dtype=np.int64)  # (B,)
        width = int(lens.max()) if len(idx) else 0
        if width == 0:
            return torch.full((len(idx), 0), PAD_ID, dtype=torch.long), torch.from_numpy(lens)
        tags = self.tags[idx].astype(np.int64)  # (B,)
        shift = (tags != NO_TAG).astype(np.int64)  # (B,)
        starts = np.asarray(self.offsets[idx], dtype=np.int64) - shift  # (B,)
        pos = np.arange(width)  # (L,)
        real = pos[None, :] < lens[:, None]  # (B, L)
        text = real & (pos[None, :] >= shift[:, None])  # (B, L)
        flat_idx = np.where(text, starts[:, None] + pos[None, :], 0)  # (B, L)
        ids = np.where(text, self.flat[flat_idx], PAD_ID).astype(np.int64)  # (B, L)
        ids[:, 0] = np.where(shift == 1, tags, ids[:, 0])
        self.release()
        return torch.from_numpy(ids), torch.from_numpy(lens)


def indexed_dataset(
    flat: np.ndarray,
    offsets: np.ndarray,
    pairs: Sequence[tuple[np.ndarray, np.ndarray]],
    tags: Sequence[int],
    placement: str,
) -> TokenDataset:
    """The training pairs of every direction over the shared sentence arrays: ``pairs`` holds
    each direction's (source, target) sentence numbers, ``tags`` its target tag's id."""
    src_idx = np.concatenate([p[0] for p in pairs]).astype(np.int64)  # (N,)
    tgt_idx = np.concatenate([p[1] for p in pairs]).astype(np.int64)  # (N,)
    tag = np.concatenate(
        [np.full(len(p[0]), t, np.int32) for p, t in zip(pairs, tags, strict=True)]
    )  # (N,)
    none = np.full(len(src_idx), NO_TAG, dtype=np.int32)
    lens = np.diff(offsets)  # (sentences,)
    src_tags, tgt_tags = (tag, none) if placement == "source" else (none, tag)
    src = IndexedSide(flat, offsets[src_idx], lens[src_idx], src_tags)
    tgt = IndexedSide(flat, offsets[tgt_idx], lens[tgt_idx], tgt_tags)
    return TokenDataset._from_sides(src, tgt)


def tagged_dataset(
    tokenizers: TokenizerPair,
    src_text: Sequence[str],
    ref_text: Sequence[str],
    tag: int,
    placement: str,
) -> TokenDataset:
    """Token ids of sentences for one direction, with its target tag ``tag`` where
    ``placement`` puts it: first in each source, or first in each reference and forced as the
    first output token (``forced``)."""
    src = tokenizers.src.encode_batch(src_text)
    ref = tokenizers.tgt.encode_batch(ref_text)
    if placement == "source":
        ds = TokenDataset([[tag, *s] for s in src], ref)
    else:
        ds = TokenDataset(src, [[tag, *r] for r in ref])
        ds.forced = np.full(len(src), tag, dtype=np.int64)
    return ds


def source_with_tag(tokenizers: TokenizerPair, text: str, tag: int, placement: str) -> list[int]:
    """One source sentence's ids as the model reads it (with its tag at source placement)."""
    ids = tokenizers.src.encode(text)
    return [tag, *ids] if placement == "source" else ids


def check_no_tags(ids: np.ndarray, lens: np.ndarray, tokenizer: Tokenizer, where: str,
                  first_line: int) -> None:  # fmt: skip
    """Refuse text in which a language tag occurs as a piece (it would read as a request for
    that language): ``ids`` are the flat ids of lines ``first_line``, ... with lengths
    ``lens``; DataError names the file, line and tag."""
    if not tokenizer.tags:
        return
    lo, hi = min(tokenizer.tags.values()), max(tokenizer.tags.values())
    hits = np.flatnonzero((ids >= lo) & (ids <= hi))
    if len(hits):
        pos = int(hits[0])
        line = first_line + int(np.searchsorted(np.cumsum(lens), pos, side="right"))
        piece = tokenizer.pieces([int(ids[pos])])[0]
        raise DataError(
            f"{where}:{line}: the text contains {piece!r}, a language tag of this multilingual "
            "model; remove it from the corpus (a tag must never be ordinary text)"
        )
