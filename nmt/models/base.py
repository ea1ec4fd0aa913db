"""The interface every translation model implements, shared by training and decoding.

A model is used in two ways:

* teacher forcing (training, validation loss): ``forward(src, src_lens, tgt_in)`` returns
  logits for every target position at once;
* incremental decoding (greedy and beam search): ``encode`` the source once, ``init_state``,
  then call ``decode_step`` with the previous token of every hypothesis; the model carries what
  it needs (GRU hidden state, Transformer key/value caches, encoder memory and source mask) in
  a :data:`DecoderState`.

A :data:`DecoderState` is a nested structure (dicts, lists, tuples) of tensors whose first
dimension is the batch (hypothesis) dimension, plus non-tensor leaves (ints such as the current
step) that apply to every row. :func:`select_state` reorders or filters the rows of every tensor
in it, which is all beam search needs (reorder after a step, drop finished sentences).
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


def select_state(state: DecoderState, index: Tensor) -> DecoderState:
    """Rows ``index`` (LongTensor (N,)) of every tensor in the state: reorder, repeat or filter."""
    return map_state(state, lambda t: t.index_select(0, index))


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
        weights of this step over the source, (B, S) (head- and layer-averaged for the
        Transformer: the last layer's heads averaged), or None if the model has none.
        """
        raise NotImplementedError

    def forward(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V)."""
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
