"""Several trained models decoding as one: at every step the next-token distribution is the
mean of the members' distributions (``nmt-eval ensemble=[RUN,...]``).

An :class:`Ensemble` is a :class:`~nmt.models.base.Seq2Seq` for decoding only: it implements
the incremental interface (``encode``, ``decode_step``), so greedy and beam search run on it
unchanged. Its :class:`~nmt.models.base.DecoderState` holds every member's own state side by
side (``rows`` and ``sentences`` keyed by the member's index), so the searches reorder, repeat
and drop the hypotheses of all members together, and each member keeps its own caches: a GRU
and a Transformer can decode as one ensemble as long as they share the target vocabulary.

The members' probabilities are averaged, not their logits or log-probabilities: the
ensemble's log-probability of token ``y`` is ``log(sum_k p_k(y) / K)``, computed as a
``logsumexp`` of the members' log-probabilities. With one member the ensemble is that member.
Its attention (what a search keeps with ``keep_attention``) is the mean of the members'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from nmt.models.base import DecoderState, Seq2Seq


class Ensemble(Seq2Seq):
    """Members that share one target vocabulary, decoding as one model."""

    def __init__(self, members: Sequence[Seq2Seq]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        self.members = nn.ModuleList(members)
        self.pad_id = members[0].pad_id
        self.suppress_start = any(m.suppress_start for m in members)

    @property
    def max_positions(self) -> int | None:
        limits = [m.max_positions for m in self.members if m.max_positions is not None]
        return min(limits) if limits else None

    def _member_state(self, state: DecoderState, k: int) -> DecoderState:
        return replace(state, rows=state.rows[str(k)], sentences=state.sentences[str(k)])

    def encode(self, src: Tensor, src_lens: Tensor) -> DecoderState:
        states = [m.encode(src, src_lens) for m in self.members]
        return DecoderState(
            rows={str(k): s.rows for k, s in enumerate(states)},
            sentences={str(k): s.sentences for k, s in enumerate(states)},
            step=states[0].step,
            group=states[0].group,
        )

    def decode_step(
        self, tokens: Tensor, state: DecoderState
    ) -> tuple[Tensor, DecoderState, Tensor | None]:
        """Log-probabilities (B, V) of the next token under the mean of the members'
        distributions (already normalized, so the searches' log-softmax leaves them as they
        are), the new state, and the members' mean attention (B, S) (None if any has none)."""
        logps, rows, attns = [], {}, []
        for k, member in enumerate(self.members):
            logits, new, attn = member.decode_step(tokens, self._member_state(state, k))
            logps.append(torch.log_softmax(logits.float(), dim=-1))  # (B, V)
            rows[str(k)] = new.rows
            attns.append(attn)
        stacked = torch.stack(logps)  # (K, B, V)
        mixed = torch.logsumexp(stacked, dim=0) - math.log(len(logps))  # (B, V)
        attention = None
        if all(a is not None for a in attns):
            attention = torch.stack([a.float() for a in attns]).mean(dim=0)  # (B, S)
        return mixed, state.next(rows), attention

    def features(self, *args: Any, **kwargs: Any) -> Tensor:
        raise NotImplementedError("an ensemble decodes; train and score its members one by one")

    def forward_with_attention(
        self, src: Tensor, src_lens: Tensor, tgt_in: Tensor
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        raise NotImplementedError("an ensemble has no single set of attention layers to draw")
