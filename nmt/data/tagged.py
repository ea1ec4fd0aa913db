"""Token data of a multilingual model: the training pairs of every direction over the shared
sentence arrays of a preparation (:class:`IndexedSide`), and any sentences of one direction
with its target tag where ``data.tag_placement`` puts it (:func:`tagged_dataset`,
:func:`source_with_tag`). See :mod:`nmt.data.multilingual`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from nmt.data.batching import TokenDataset, _Side
from nmt.data.multilingual import first_source_token
from nmt.data.tokenizer import PAD_ID, TokenizerPair

NO_TAG = -1  # no tag on this side of a sentence; TokenDataset.forced of a sentence without one


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
    src_tags: Sequence[int] = (),
) -> TokenDataset:
    """The training pairs of every direction over the shared sentence arrays: ``pairs`` holds
    each direction's (source, target) sentence numbers, ``tags`` its target tag's id and, at
    ``both`` placement, ``src_tags`` its source language's tag's id."""
    src_idx = np.concatenate([p[0] for p in pairs]).astype(np.int64)  # (N,)
    tgt_idx = np.concatenate([p[1] for p in pairs]).astype(np.int64)  # (N,)
    tag = np.concatenate(
        [np.full(len(p[0]), t, np.int32) for p, t in zip(pairs, tags, strict=True)]
    )  # (N,)
    none = np.full(len(src_idx), NO_TAG, dtype=np.int32)
    lens = np.diff(offsets)  # (sentences,)
    on_src, on_tgt = (tag, none) if placement == "source" else (none, tag)
    if placement == "both":
        on_src = np.concatenate(
            [np.full(len(p[0]), t, np.int32) for p, t in zip(pairs, src_tags, strict=True)]
        )  # (N,)
    src = IndexedSide(flat, offsets[src_idx], lens[src_idx], on_src)
    tgt = IndexedSide(flat, offsets[tgt_idx], lens[tgt_idx], on_tgt)
    return TokenDataset._from_sides(src, tgt)


def tagged_dataset(
    tokenizers: TokenizerPair,
    src_text: Sequence[str],
    ref_text: Sequence[str],
    tag: int,
    placement: str,
    src_tag: int | None = None,
) -> TokenDataset:
    """Token ids of sentences for one direction, with its target tag ``tag`` where
    ``placement`` puts it: first in each source, or first in each reference and forced as the
    first output token (``forced``); at ``both`` each source starts with ``src_tag``."""
    src = tokenizers.src.encode_batch(src_text)
    ref = tokenizers.tgt.encode_batch(ref_text)
    first = first_source_token(placement, tag, src_tag)
    if first is not None:
        src = [[first, *s] for s in src]
    if placement == "source":
        return TokenDataset(src, ref)
    ds = TokenDataset(src, [[tag, *r] for r in ref])
    ds.forced = np.full(len(src), tag, dtype=np.int64)
    return ds


def source_with_tag(
    tokenizers: TokenizerPair, text: str, tag: int, placement: str, src_tag: int | None = None
) -> list[int]:
    """One source sentence's ids as the model reads it (with its tag at source placement, the
    source language's ``src_tag`` at ``both``)."""
    ids = tokenizers.src.encode(text)
    first = first_source_token(placement, tag, src_tag)
    return [first, *ids] if first is not None else ids
