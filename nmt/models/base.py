"""The interface every translation model implements, shared by training and decoding.

A model is used in two ways:

* teacher forcing (training, validation loss): ``forward(src, src_lens, tgt_in)`` returns
  logits for every target position at once; given ``targets``, it returns their summed
  cross-entropy instead, which :func:`nmt.models.loss.projected_cross_entropy` computes
  without building the logits of the whole batch;
* incremental decoding (greedy and beam search): ``encode(src, src_lens)`` runs the encoder
  once and returns the initial :class:`DecoderState`, one hypothesis row per sentence; each
  ``decode_step(tokens, state)`` takes the previous token of every hypothesis row (BOS at the
  first step) and returns the next-token logits, the new state and this step's attention over
  the source. Between steps the search changes the rows with :meth:`DecoderState.select`: beam
  search turns each sentence's row into ``beam`` rows after the first step and reorders them
  after every step; both searches drop the rows of finished sentences.

A :class:`DecoderState` keeps apart what belongs to each hypothesis (``rows``: the GRU's hidden
states, the Transformer's self-attention key/value caches) and what is the same for every
hypothesis of a sentence (``sentences``: the encoder memory, its attention keys, the source
mask), which is stored once per sentence and never copied for the beams. The hypotheses of a
sentence are consecutive rows and ``group`` says how many there are, so a model never has to
infer it from tensor sizes: with ``group > 1`` it attends with the grouped-query path, each
sentence's ``group`` queries against its one copy of the per-sentence tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from nmt.models.loss import projected_cross_entropy
from nmt.models.rdrop import projected_rdrop_loss

# a tensor, or a dict / list / tuple of them (nested), the batch dimension first
Tensors = Any


def map_state(state: Tensors, fn: Callable[[Tensor], Tensor]) -> Tensors:
    """Apply ``fn`` to every tensor in a nested structure; other leaves are kept as they are."""
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, dict):
        return {k: map_state(v, fn) for k, v in state.items()}
    if isinstance(state, list):
        return [map_state(v, fn) for v in state]
    if isinstance(state, tuple):
        return tuple(map_state(v, fn) for v in state)
    return state


def _first_dim(tensors: Tensors) -> int | None:
    """The first dimension of the first tensor in a nested structure (None if it has none)."""
    found: list[int] = []
    map_state(tensors, lambda t: found.append(t.size(0)) or t)
    return found[0] if found else None


@dataclass
class DecoderState:
    """What a model carries from one decoding step to the next.

    rows: per-hypothesis tensors, (N, ...) each, N = group * B rows, a sentence's hypotheses
        consecutive; a model gives back new ones at every step (the old state stays valid).
    sentences: per-sentence tensors, (B, ...) each, read by all hypotheses of a sentence.
    step: the position of the next target token, the same for every row.
    group: hypotheses per sentence (1 after ``encode`` and in greedy search; the beam size in
        beam search after its first step).
    """

    rows: dict[str, Tensors]
    sentences: dict[str, Tensors] = field(default_factory=dict)
    step: int = 0
    group: int = 1

    def next(self, rows: dict[str, Tensors]) -> DecoderState:
        """The state after one step: new per-row tensors, the same sentences, step + 1."""
        return replace(self, rows=rows, step=self.step + 1)

    def select(
        self, index: Tensor, sentences: Tensor | None = None, group: int | None = None
    ) -> DecoderState:
        """Rows ``index`` (LongTensor (N',)) of every per-row tensor: reorder, repeat or filter.

        sentences: the per-sentence rows kept, in order (LongTensor (B',)), when sentences are
            dropped or repeated; None keeps them as they are (not copied).
        group: hypotheses per sentence of the new rows (default: as before); the new rows must
            be ``group`` consecutive hypotheses of each kept sentence.
        """
        group = self.group if group is None else group
        kept = self.sentences
        if sentences is not None:
            kept = map_state(self.sentences, lambda t: t.index_select(0, sentences))
        n_sentences = _first_dim(kept)
        if n_sentences is not None and index.numel() != group * n_sentences:
            raise ValueError(
                f"{index.numel()} hypothesis rows are not {group} per sentence of {n_sentences}"
            )
        rows = map_state(self.rows, lambda t: t.index_select(0, index))
        return replace(self, rows=rows, sentences=kept, group=group)


def host_to_device(x: Tensor, device: torch.device) -> Tensor:
    """A tensor in host memory on ``device`` without making the host wait: to a GPU through
    page-locked memory (a ``non_blocking`` copy from pageable memory is not asynchronous)."""
    return (x.pin_memory() if device.type == "cuda" else x).to(device, non_blocking=True)


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
    out_proj: nn.Linear  # features (..., D) -> logits (..., V)
    # the search never outputs BOS (an imported OPUS-MT model, whose BOS is its pad)
    suppress_start: bool = False

    @property
    def max_positions(self) -> int | None:
        """The longest sequence (source, or target with BOS) the model can encode or decode,
        e.g. the size of a position table; None when there is no such limit."""
        return None

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

    def features(
        self,
        src: Tensor,
        src_lens: Tensor,
        tgt_in: Tensor,
        positions: Tensor | None = None,
        src_lens_host: np.ndarray | None = None,
    ) -> Tensor:
        """Teacher-forced features (B, T, D) that ``out_proj`` turns into logits; with
        ``positions`` (N,), flat indices into the B x T target positions, only those: (N, D).

        ``src_lens_host``: the source lengths in host memory too, where the caller has them (a
        :class:`~nmt.data.batching.Batch` does); a model that needs them on the host takes
        these instead of copying ``src_lens`` back, which would make the host wait for the
        device."""
        raise NotImplementedError

    def forward(
        self,
        src: Tensor,
        src_lens: Tensor,
        tgt_in: Tensor,
        positions: Tensor | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
        src_lens_host: np.ndarray | None = None,
        rdrop_alpha: float = 0.0,
    ) -> Tensor:
        """Teacher-forced logits (B, T, V); with ``positions`` (N,), only those are projected:
        (N, V) (the loss skips padding).

        With ``targets`` (N,), the target token at each of the ``positions``: the summed
        (label-smoothed) cross-entropy of those N predictions, a scalar, as
        ``F.cross_entropy(logits.float(), targets, label_smoothing=..., reduction="sum")``
        would give it from the (N, V) logits. ``src_lens_host``: as for :meth:`features`.
        With ``rdrop_alpha`` > 0 as well, the summed R-Drop loss of two passes of the batch
        under different dropout masks (:mod:`nmt.models.rdrop`): the batch runs twice over, as
        one batch of 2B sentences.
        """
        if targets is not None and (positions is None or targets.shape != positions.shape):
            raise ValueError("targets need positions of the same shape (N,)")
        if targets is not None and rdrop_alpha > 0:
            twice = (torch.cat([x, x]) for x in (src, src_lens, tgt_in))
            host = None if src_lens_host is None else np.concatenate([src_lens_host] * 2)
            second = positions + tgt_in.numel()  # type: ignore[operator]  # the second copy's
            features = self.features(*twice, torch.cat([positions, second]), host)  # (2N, D)
            first, again = features.chunk(2)  # (N, D) each
            proj = self.out_proj
            return projected_rdrop_loss(
                first, again, proj.weight, proj.bias, targets, label_smoothing, rdrop_alpha
            )
        features = self.features(src, src_lens, tgt_in, positions, src_lens_host)
        if targets is None:
            return self.out_proj(features)
        proj = self.out_proj
        return projected_cross_entropy(features, proj.weight, proj.bias, targets, label_smoothing)

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
