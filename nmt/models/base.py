"""The interface every translation model implements, shared by training and decoding.

A model is used in two ways:

* teacher forcing (training, validation loss): ``forward(src, src_lens, tgt_in)`` returns
  logits for every target position at once;
* incremental decoding (greedy and beam search): ``encode(src, src_lens)`` runs the encoder
  once and returns the initial :data:`DecoderState`, one row per sentence; each
  ``decode_step(tokens, state)`` takes the previous token of every hypothesis row (BOS at the
  first step) and returns the next-token logits, the new state and this step's attention over
  the source. Between steps the search changes the rows with :func:`select_state`: beam search
  turns each sentence's row into ``beam`` rows after the first step and reorders them after
  every step; both searches drop the rows of finished sentences. The state holds what the model
  needs (the GRU's hidden states; the Transformer's self-attention key/value caches and step;
  the encoder memory or its projections and the source mask).

A :data:`DecoderState` is a nested structure (dicts, lists, tuples) of tensors whose first
dimension is the batch (hypothesis) dimension, plus non-tensor leaves (ints such as the current
step) that apply to every row. What is the same for every hypothesis of a sentence (the encoder
memory, its attention keys, the source mask) lives under the key ``"shared"`` with one row per
sentence; the hypotheses of a sentence are consecutive rows, so a model finds the group size as
hypothesis rows // sentence rows. :func:`select_state` reorders, repeats or filters the rows,
which is all beam search needs (reorder beams after a step, drop finished sentences); beams
reordered within their sentences leave the shared part untouched, so it is never copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

DecoderState = Any  # nested dict/list/tuple of batch-first tensors and plain scalars


def map_state(state: DecoderState, fn: Callable[[Tensor], Tensor]) -> DecoderState:
    """Apply ``fn`` to every tensor in a nested state; other leaves are kept as they are."""
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, dict):
        return {k: map_state(v, fn) for k, v in state.items()}
    if isinstance(state, list):
        return [map_state(v, fn) for v in state]
    if isinstance(state, tuple):
        return tuple(map_state(v, fn) for v in state)
    return state


SAME_SENTENCES = "same"  # select_state: the new rows are beams of the same sentences, in order


def _rows(state: DecoderState) -> int | None:
    """The number of hypothesis rows: the first dimension of the first per-row tensor."""
    found: list[int] = []

    def note(t: Tensor) -> Tensor:
        found.append(t.size(0))
        return t

    map_state({k: v for k, v in state.items() if k != "shared"}, note)
    return found[0] if found else None


def select_state(
    state: DecoderState, index: Tensor, sentences: Tensor | str | None = None
) -> DecoderState:
    """Rows ``index`` (LongTensor (N,)) of every per-row tensor: reorder, repeat or filter.

    The shared (per-sentence) part follows ``sentences``: a LongTensor of the sentences kept,
    in order, when the new rows are the beams of those sentences, grouped; ``SAME_SENTENCES``
    when they are beams of the same sentences as before; None for any other selection, which
    gives every new row its own copy of its sentence's shared tensors.
    """
    if not isinstance(state, dict) or "shared" not in state:
        return map_state(state, lambda t: t.index_select(0, index))
    shared = state["shared"]
    if sentences is None:
        n_sentences = _rows(shared)
        group = (_rows(state) or n_sentences or 1) // max(n_sentences or 1, 1)
        sentences = torch.div(index, group, rounding_mode="floor")  # (N,) sentence of each row
    out = {k: map_state(v, lambda t: t.index_select(0, index)) for k, v in state.items()
           if k != "shared"}  # fmt: skip
    if isinstance(sentences, str):
        if sentences != SAME_SENTENCES:
            raise ValueError(f"sentences={sentences!r}: expected a tensor, None or SAME_SENTENCES")
        out["shared"] = shared
    else:
        out["shared"] = map_state(shared, lambda t: t.index_select(0, sentences))
    return out


def lengths_to_mask(lens: Tensor, max_len: int | None = None) -> Tensor:
    """(B,) lengths -> (B, L) bool mask, True at real tokens, False at padding."""
    max_len = int(lens.max()) if max_len is None else max_len
    return torch.arange(max_len, device=lens.device)[None, :] < lens[:, None]


class Seq2Seq(nn.Module):
    """Base class of the encoder-decoder models.

    Token ids: ``src`` (B, S) and ``tgt_in`` (B, T) are right-padded with ``pad_id``;
    ``tgt_in`` starts with BOS; ``src_lens`` (B,) counts the real source tokens (EOS included).
    """

    pad_id: int

    def encode(self, src: Tensor, src_lens: Tensor) -> DecoderState:
        """Encode the source once; returns the initial decoder state (B rows)."""
        raise NotImplementedError

    def decode_step(
        self, tokens: Tensor, state: DecoderState
    ) -> tuple[Tensor, DecoderState, Tensor | None]:
        """One decoder step.

        tokens: (B,) the previous target token of each row (BOS at the first step).
        Returns logits (B, V) for the next token, the new state, and the cross-attention
        weights of this step over the source, (B, S) (for the Transformer: the last decoder
        layer's, averaged over heads), or None if the model has none.
        """
        raise NotImplementedError

    def forward(
        self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, positions: Tensor | None = None
    ) -> Tensor:
        """Teacher-forced logits (B, T, V); with ``positions`` (N,), flat indices into the
        B x T target positions, only those are projected: (N, V) (the loss skips padding)."""
        raise NotImplementedError

    def forward_with_attention(
        self, src: Tensor, src_lens: Tensor, tgt_in: Tensor
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """Teacher-forced logits (B, T, V) and attention weights for visualisation.

        The dict maps a kind ("cross", "enc_self", "dec_self") to one tensor per layer:
        (B, H, T_query, T_key) for multi-head attention, (B, 1, T, S) for the GRU's single
        alignment. Rows sum to 1 over the real keys; padded keys have weight 0.
        """
        raise NotImplementedError

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
