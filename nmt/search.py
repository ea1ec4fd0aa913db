"""Decoding: greedy search over a batch, and translation of a whole dataset in token batches.

Both work with any :class:`~nmt.models.base.Seq2Seq` through its incremental interface
(``encode`` once, then ``decode_step``). Sentences that have produced EOS leave the batch, so
no compute is spent on them and a sentence's output does not depend on its batch mates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from nmt.data.batching import TokenDataset, eval_batches, make_batch
from nmt.data.tokenizer import BOS_ID, EOS_ID, Tokenizer
from nmt.models.base import Seq2Seq, select_state
from nmt.runtime import autocast


@dataclass
class DecodeOptions:
    beam: int = 1
    length_penalty: float = 1.0  # GNMT alpha (beam search only)
    max_len_a: float = 1.2  # output cap: a * source_length + b
    max_len_b: int = 10
    max_tokens: int = 8192  # token budget of a decoding batch
    precision: str = "32"


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float = 0.0  # sum of log-probabilities (length-normalised for beam search)
    attention: Tensor | None = None  # (len(tokens) + 1, S): one row per step incl. EOS
    nbest: list[tuple[list[int], float]] = field(default_factory=list)


def max_output_lengths(src_lens: Tensor, a: float, b: int) -> Tensor:
    """Decoding cap per sentence: a * source_length + b tokens (EOS excluded)."""
    return (src_lens.float() * a + b).long().clamp(min=1)  # (B,)


@torch.inference_mode()
def greedy_search(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    max_lens: Tensor,
    bos_id: int,
    eos_id: int,
    keep_attention: bool = False,
) -> list[Hypothesis]:
    """Greedy decoding of a batch.

    src: (B, S); src_lens, max_lens: (B,). Returns one hypothesis per row, in input order.
    Rows that emit EOS (or reach their cap) are dropped from the state at once.
    """
    batch, device = src.size(0), src.device
    limit = max_lens.to(device)  # (B,)
    steps = int(limit.max()) + 1  # room for the closing EOS
    out = torch.full((batch, steps), eos_id, dtype=torch.long, device=device)  # (B, L)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
    scores = torch.zeros(batch, device=device)  # (B,)
    attn_buf = torch.zeros(batch, steps, src.size(1), device=device) if keep_attention else None
    state = model.encode(src, src_lens)
    alive = torch.arange(batch, device=device)  # (A,) original rows still decoding
    prev = torch.full((batch,), bos_id, dtype=torch.long, device=device)  # (A,)
    for step in range(steps):
        logits, state, attn = model.decode_step(prev, state)  # (A, V), (A, S)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (A, V)
        # the argmax, except that a sentence at its length cap is closed with EOS
        best = logp.argmax(dim=-1).masked_fill(limit[alive] <= step, eos_id)  # (A,)
        out[alive, step] = best
        scores[alive] += logp.gather(1, best[:, None]).squeeze(1)
        if attn_buf is not None and attn is not None:
            attn_buf[alive, step, : attn.size(1)] = attn.float()
        done = best == eos_id  # (A,)
        lengths[alive] = step + 1
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)  # (A',)
            if keep.numel() == 0:
                break
            alive = alive.index_select(0, keep)
            state = select_state(state, keep)
            best = best.index_select(0, keep)
        prev = best
    out_list, len_list, score_list = out.tolist(), lengths.tolist(), scores.tolist()
    hyps = []
    for row in range(batch):
        n = len_list[row]  # steps taken, the closing EOS included
        attention = attn_buf[row, :n, : int(src_lens[row])].cpu() if attn_buf is not None else None
        hyps.append(Hypothesis(out_list[row][: n - 1], score_list[row], attention))
    return hyps


def decode_batches(src_lens: np.ndarray, opts: DecodeOptions) -> list[list[int]]:
    """Token-budget batches for decoding, costed by source length and output cap."""
    caps = (np.asarray(src_lens) * opts.max_len_a + opts.max_len_b).astype(np.int64)  # (N,)
    return eval_batches(src_lens, opts.max_tokens, caps)


@torch.inference_mode()
def translate_dataset(
    model: Seq2Seq,
    data: TokenDataset,
    tokenizer: Tokenizer,
    opts: DecodeOptions,
    device: torch.device,
    limit: int = 0,
) -> list[str]:
    """Translations of (the first ``limit`` sentences of) a dataset, in the original order.

    Decodes in token-budget batches sorted by source length, then restores the order.
    """
    if opts.beam != 1:
        raise NotImplementedError("beam search is not available yet: use beam=1")
    model.eval()
    n = len(data) if limit <= 0 else min(limit, len(data))
    out: list[str] = [""] * n
    for idx in decode_batches(data.src_lens[:n], opts):
        batch = make_batch(data, idx).to(device)
        caps = max_output_lengths(batch.src_lens, opts.max_len_a, opts.max_len_b)
        with autocast(opts.precision, device):
            hyps = greedy_search(model, batch.src, batch.src_lens, caps, BOS_ID, EOS_ID)
        for i, h in zip(idx, hyps, strict=True):
            out[i] = tokenizer.decode(h.tokens)
    return out
