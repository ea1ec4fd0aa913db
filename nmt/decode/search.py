"""Decoding: greedy and beam search over a batch, random sampling (greedy search drawing its
tokens, :mod:`nmt.decode.sampling`), and translation of a whole dataset.

Both searches work with any :class:`~nmt.models.base.Seq2Seq` through its incremental interface
(``encode`` once, then ``decode_step``). Sentences that are finished leave the batch (their
rows are dropped with :meth:`~nmt.models.base.DecoderState.select`), so no compute is spent on
them, and every decision is taken per sentence, so a sentence's output does not depend on its
batch mates or on the batch size.

Beam search
-----------
Each sentence keeps ``beam`` alive hypotheses. At every step the candidates are all one-token
extensions of the alive hypotheses, ranked by their summed log-probability:

* a candidate ending in EOS that ranks among the ``beam`` best candidates is *finished*: it
  enters the sentence's pool of finished hypotheses with the score
  ``sum of log-probabilities / lp(length)``, where ``lp(n) = ((5 + n) / 6) ** alpha`` (GNMT,
  Wu et al. 2016) and ``n`` counts the output tokens including EOS; the pool keeps the
  ``beam`` best;
* the ``beam`` best candidates not ending in EOS stay alive;
* at a sentence's length cap (:meth:`DecodeOptions.caps`: ``max_output_len_a * source_length
  + max_output_len_b`` tokens, EOS excluded)
  every alive hypothesis is closed with EOS (its log-probability is added, as in greedy search).

Stopping rule: a sentence is finished when its pool holds ``beam`` hypotheses and no alive
hypothesis can still beat the best of them, or when it reaches its cap. Log-probabilities are
at most 0, so an alive hypothesis with summed log-probability ``s`` and ``t`` tokens can at best
score ``s / max(lp(t + 1), lp(cap + 1))``: it only loses probability, and with ``alpha > 0`` the
largest penalty divisor is the one of the longest allowed output. The returned best hypothesis
is therefore the best one the beam can reach, not merely the first ones to finish.

With ``beam = 1`` there is nothing to normalise against: the length penalty is not applied and
beam search returns exactly the output (tokens and score) of greedy search.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from nmt.cli import Advance, no_progress
from nmt.data.batching import TokenDataset, eval_batches, make_batch
from nmt.data.tokenizer import BOS_ID, EOS_ID, Tokenizer
from nmt.decode.options import DecodeOptions
from nmt.decode.sampling import Sampling
from nmt.models.base import Seq2Seq
from nmt.runtime.device import autocast
from nmt.runtime.precision import resolve_precision

log = logging.getLogger(__name__)

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float = 0.0  # sum of log-probabilities (length-normalised for beam search)
    attention: Tensor | None = None  # (len(tokens) + 1, S): one row per step incl. EOS
    nbest: list[tuple[list[int], float]] = field(default_factory=list)  # best first


def max_output_lengths(model: Seq2Seq, src_lens: Tensor, opts: DecodeOptions) -> Tensor:
    """Decoding caps of a batch (:meth:`DecodeOptions.caps`, within the model's positions).

    src_lens: (B,) source lengths, EOS included. Returns (B,) on the device of ``src_lens``.
    """
    caps = opts.caps(src_lens.cpu().numpy(), model.max_positions)  # (B,)
    return torch.from_numpy(caps).to(src_lens.device)


def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """GNMT length penalty ((5 + length) / 6) ** alpha of output lengths (any shape).

    ``length`` counts the output tokens including EOS; ``alpha = 0`` gives exactly 1.
    """
    if alpha == 0:
        return torch.ones_like(length, dtype=torch.float)
    return ((5.0 + length.float()) / 6.0) ** alpha  # like length


def force_first(logp: Tensor, forced: Tensor) -> Tensor:
    """Log-probabilities (B, V) of a first step with ``forced`` (B,) as the only choice of each
    row that has one (a negative id: none): its log-probability is 0, so that a score is that
    of the tokens chosen after it (as transformers' ``forced_bos_token_id`` and CTranslate2's
    ``target_prefix`` score it)."""
    rows = forced >= 0  # (B,)
    only = torch.full_like(logp, NEG_INF)  # (B, V)
    ids = forced.clamp(min=0)[:, None]  # (B, 1)
    only.scatter_(1, ids, torch.zeros_like(ids, dtype=logp.dtype))
    return torch.where(rows[:, None], only, logp)


# ---------------------------------------------------------------------------------- greedy


@torch.inference_mode()
def greedy_search(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    max_lens: Tensor,
    bos_id: int,
    eos_id: int,
    keep_attention: bool = False,
    min_len: int = 0,
    forced: Tensor | None = None,
    sampling: Sampling | None = None,
    sentences: Tensor | None = None,
) -> list[Hypothesis]:
    """Greedy decoding of a batch, or with ``sampling`` random sampling (:mod:`.sampling`).

    src: (B, S); src_lens, max_lens: (B,). Returns one hypothesis per row, in input order.
    Rows that emit EOS (or reach their cap) are dropped from the state at once. EOS is not
    chosen before ``min_len`` tokens, except at a cap that is shorter. ``forced`` (B,): each
    row's first output token (a multilingual model's target tag), or None. A model with
    ``suppress_start`` never outputs ``bos_id``. ``sentences`` (B,): each row's line in the
    input, which with the seed makes its draws (default: the rows' positions). A hypothesis's
    score is the summed log-probability of its tokens under the model, sampled or not.
    """
    batch, device = src.size(0), src.device
    suppress = model.suppress_start
    limit = max_lens.to(device)  # (B,)
    steps = int(limit.max()) + 1  # room for the closing EOS
    out = torch.full((batch, steps), eos_id, dtype=torch.long, device=device)  # (B, L)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
    scores = torch.zeros(batch, device=device)  # (B,)
    attn_buf = torch.zeros(batch, steps, src.size(1), device=device) if keep_attention else None
    state = model.encode(src, src_lens)
    alive = torch.arange(batch, device=device)  # (A,) original rows still decoding
    lines = torch.arange(batch) if sentences is None else sentences.cpu()  # (B,)
    prev = torch.full((batch,), bos_id, dtype=torch.long, device=device)  # (A,)
    for step in range(steps):
        logits, state, attn = model.decode_step(prev, state)  # (A, V), (A, S)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (A, V)
        if suppress:  # after the softmax, as transformers' bad_words_ids
            logp[:, bos_id] = NEG_INF
        if step == 0 and forced is not None:
            logp = force_first(logp, forced.to(device))
        if step < min_len:
            logp[:, eos_id] = NEG_INF
        # the argmax (or a draw), except that a sentence at its length cap is closed with EOS
        if sampling is None:
            best = logp.argmax(dim=-1)  # (A,)
        else:
            best = sampling.draw(logp, lines[alive.cpu()], step)  # (A,)
        best = best.masked_fill(limit[alive] <= step, eos_id)  # (A,)
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
            state = state.select(keep, sentences=keep)
            best = best.index_select(0, keep)
        prev = best
    out_list, len_list, score_list = out.tolist(), lengths.tolist(), scores.tolist()
    hyps = []
    for row in range(batch):
        n = len_list[row]  # steps taken, the closing EOS included
        attention = attn_buf[row, :n, : int(src_lens[row])].cpu() if attn_buf is not None else None
        tokens, score = out_list[row][: n - 1], score_list[row]
        hyps.append(Hypothesis(tokens, score, attention, [(tokens, score)]))
    return hyps


# ------------------------------------------------------------------------------------ beam


class _FinishedPool:
    """The ``beam`` best finished hypotheses of every sentence of a batch, best first.

    Indexed by the sentence's row in the original batch, so sentences can leave the search.
    Empty slots have score -inf.
    """

    def __init__(
        self,
        batch: int,
        beam: int,
        width: int,
        src_len: int,
        keep_attention: bool,
        device: torch.device,
    ) -> None:
        self.beam = beam
        self.scores = torch.full((batch, beam), NEG_INF, device=device)  # (B, K)
        self.lengths = torch.zeros(batch, beam, dtype=torch.long, device=device)  # (B, K)
        self.tokens = torch.zeros(batch, beam, width, dtype=torch.long, device=device)  # (B, K, W)
        self.attention = (
            torch.zeros(batch, beam, width + 1, src_len, device=device)  # (B, K, W + 1, S)
            if keep_attention
            else None
        )

    def add(
        self,
        rows: Tensor,
        scores: Tensor,
        seqs: Tensor,
        attention: Tensor | None,
    ) -> None:
        """Offer new finished hypotheses to sentences ``rows``.

        rows: (A,) original batch rows; scores: (A, k) normalised scores, -inf where a
        hypothesis did not finish; seqs: (A, k, t) their tokens (EOS excluded);
        attention: (A, k, t + 1, S) or None.
        """
        n_rows, k, t = seqs.shape
        merged = torch.cat([self.scores[rows], scores], dim=1)  # (A, K + k)
        best, pick = merged.topk(self.beam, dim=1)  # (A, K)
        self.scores[rows] = best
        new_lens = torch.full((n_rows, k), t, dtype=torch.long, device=seqs.device)  # (A, k)
        lens = torch.cat([self.lengths[rows], new_lens], dim=1)  # (A, K + k)
        self.lengths[rows] = lens.gather(1, pick)
        width = self.tokens.size(2)
        new_tokens = seqs.new_zeros(n_rows, k, width)  # (A, k, W)
        new_tokens[:, :, :t] = seqs
        tokens = torch.cat([self.tokens[rows], new_tokens], dim=1)  # (A, K + k, W)
        self.tokens[rows] = tokens.gather(1, pick[:, :, None].expand(-1, -1, width))
        if attention is None:
            self.attention = None  # the model gives no attention weights
        if self.attention is not None and attention is not None:
            _, _, steps, src_len = self.attention.shape
            new_attn = attention.new_zeros(n_rows, k, steps, src_len)  # (A, k, W + 1, S)
            new_attn[:, :, : t + 1, : attention.size(3)] = attention
            attn = torch.cat([self.attention[rows], new_attn], dim=1)  # (A, K + k, W + 1, S)
            index = pick[:, :, None, None].expand(-1, -1, steps, src_len)  # (A, K, W + 1, S)
            self.attention[rows] = attn.gather(1, index)

    def hypotheses(self, src_lens: Tensor) -> list[Hypothesis]:
        """The best finished hypothesis of every sentence with its n-best list, input order."""
        scores, lengths, tokens = self.scores.tolist(), self.lengths.tolist(), self.tokens.tolist()
        hyps = []
        for row, (row_scores, row_lens, row_tokens) in enumerate(
            zip(scores, lengths, tokens, strict=True)
        ):
            found = [j for j, s in enumerate(row_scores) if s != NEG_INF] or [0]
            nbest = [(row_tokens[j][: row_lens[j]], row_scores[j]) for j in found]
            attention = None
            if self.attention is not None:
                n = row_lens[0] + 1  # steps of the best hypothesis, the closing EOS included
                attention = self.attention[row, 0, :n, : int(src_lens[row])].cpu()  # (n, S_row)
            hyps.append(Hypothesis(nbest[0][0], nbest[0][1], attention, nbest))
        return hyps


def _topk_padded(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top ``k`` of (A, N) per row; when N < k the rest is -inf with index 0. (A, k) each."""
    n = min(k, scores.size(1))
    values, index = scores.topk(n, dim=1)  # (A, n)
    if n < k:
        values = torch.cat([values, values.new_full((values.size(0), k - n), NEG_INF)], dim=1)
        index = torch.cat([index, index.new_zeros(index.size(0), k - n)], dim=1)  # (A, k)
    return values, index


def _best_without_eos(
    top: Tensor, flat: Tensor, beam: int, vocab: int, eos_id: int
) -> tuple[Tensor, Tensor]:
    """The first ``beam`` candidates not ending in EOS among sorted candidates.

    top, flat: (A, N) scores (best first) and flat indices (beam * vocab + token). Returns
    scores and flat indices (A, beam); where fewer than ``beam`` remain, the rest is -inf.
    """
    is_eos = flat % vocab == eos_id  # (A, N)
    rank = torch.arange(top.size(1), device=top.device) + is_eos * top.size(1)  # (A, N)
    pick = rank.topk(beam, dim=1, largest=False).indices  # (A, K) in rank order
    scores = top.gather(1, pick).masked_fill(is_eos.gather(1, pick), NEG_INF)  # (A, K)
    return scores, flat.gather(1, pick)


def _cannot_improve(
    best_alive: Tensor, best_finished: Tensor, alive_len: int, caps: Tensor, alpha: float
) -> Tensor:
    """(A,) True where no alive hypothesis can still beat the best finished one.

    best_alive: (A,) summed log-probability (<= 0) of the best alive hypothesis, which has
    ``alive_len`` tokens; best_finished: (A,) normalised score; caps: (A,) length caps.
    """
    shortest = torch.full_like(caps, alive_len + 1)  # (A,) this hypothesis closed by EOS now
    longest = torch.maximum(caps + 1, shortest)  # (A,) the cap, EOS included
    divisor = torch.maximum(length_penalty(shortest, alpha), length_penalty(longest, alpha))
    return best_alive / divisor <= best_finished  # (A,)


@torch.inference_mode()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    max_lens: Tensor,
    bos_id: int,
    eos_id: int,
    beam: int,
    alpha: float = 0.0,
    keep_attention: bool = False,
    min_len: int = 0,
    forced: Tensor | None = None,
) -> list[Hypothesis]:
    """Beam search over a batch (see the module docstring for the exact rules).

    No hypothesis ends before ``min_len`` tokens, except at a cap that is shorter. ``forced``
    (B,): each row's first output token, or None.

    src: (B, S); src_lens, max_lens: (B,); ``alpha`` is the GNMT length-penalty exponent.
    Returns one hypothesis per row, in input order: the best finished one (score = summed
    log-probability / lp(length)), its attention (steps, S_row) if ``keep_attention``, and up
    to ``beam`` finished hypotheses with their scores in ``nbest``, best first.
    """
    if beam < 1:
        raise ValueError(f"beam={beam} must be >= 1")
    alpha = alpha if beam > 1 else 0.0
    batch, device = src.size(0), src.device
    suppress = model.suppress_start  # no BOS output (greedy_search)
    caps = max_lens.to(device)  # (B,)
    width = int(caps.max())  # longest output, EOS excluded
    pool = _FinishedPool(batch, beam, width, src.size(1), keep_attention, device)
    state = model.encode(src, src_lens)
    alive = torch.arange(batch, device=device)  # (A,) original rows still searching
    scores = torch.zeros(batch, 1, device=device)  # (A, k) summed log-probs of alive beams
    seqs = torch.zeros(batch, 1, 0, dtype=torch.long, device=device)  # (A, k, t)
    history = torch.zeros(batch, 1, 0, src.size(1), device=device) if keep_attention else None
    prev = torch.full((batch,), bos_id, dtype=torch.long, device=device)  # (A * k,)
    for step in range(width + 1):
        logits, state, attn = model.decode_step(prev, state)  # (A * k, V), (A * k, S)
        n_alive, k = scores.shape
        logp = torch.log_softmax(logits.float(), dim=-1).view(n_alive, k, -1)  # (A, k, V)
        if suppress:  # after the softmax, as transformers' bad_words_ids
            logp[:, :, bos_id] = NEG_INF
        if step == 0 and forced is not None:  # one hypothesis per sentence so far (k = 1)
            logp = force_first(logp[:, 0], forced.to(device))[:, None]
        vocab = logp.size(2)
        at_cap = caps[alive] <= step  # (A,)
        if step < min_len:  # EOS only where the cap forces it
            logp[:, :, eos_id] = logp[:, :, eos_id].masked_fill(~at_cap[:, None], NEG_INF)
        cand = scores[:, :, None] + logp  # (A, k, V)
        if history is not None:
            history = _extend_history(history, attn, n_alive, k)  # (A, k, t + 1, S) | None

        # the 2 * beam best candidates hold the `beam` best that do not end in EOS: at most
        # k <= beam of them end in EOS, one per alive hypothesis
        top, flat = _topk_padded(cand.view(n_alive, -1), 2 * beam)  # (A, 2K) each

        # hypotheses closed by EOS: those ranked in the top `beam`, and all of them at the cap
        eos = cand[:, :, eos_id]  # (A, k)
        ends = ((eos >= top[:, beam - 1 : beam]) | at_cap[:, None]) & (scores > NEG_INF)  # (A, k)
        lp = ((5.0 + step + 1) / 6.0) ** alpha  # lp(t tokens + EOS), 1.0 when alpha = 0
        pool.add(alive, torch.where(ends, eos / lp, NEG_INF), seqs, history)  # (A, k) scores

        # the `beam` best extensions by another token stay alive (at the cap none matters)
        scores, flat = _best_without_eos(top, flat, beam, vocab, eos_id)  # (A, K) each
        parent, token = flat // vocab, flat % vocab  # (A, K) each
        seqs = torch.cat([_gather_beams(seqs, parent), token[:, :, None]], dim=2)  # (A, K, t+1)
        if history is not None:
            history = _gather_beams(history, parent)  # (A, K, t + 1, S)

        best_alive = scores[:, 0]  # (A,)
        full = pool.scores[alive, -1] > NEG_INF  # (A,) the pool holds `beam` hypotheses
        beaten = _cannot_improve(best_alive, pool.scores[alive, 0], step + 1, caps[alive], alpha)
        done = at_cap | (best_alive == NEG_INF) | (full & beaten)  # (A,)
        rows = torch.arange(n_alive, device=device)[:, None] * k + parent  # (A, K) state rows
        sentences: Tensor | None = None  # per-sentence state is left as it is
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)  # (A',)
            if keep.numel() == 0:
                break
            alive, scores, seqs = alive[keep], scores[keep], seqs[keep]
            token, rows = token[keep], rows[keep]
            history = history[keep] if history is not None else None
            sentences = keep
        # K hypotheses per sentence from here on: the model attends with its grouped path
        state = state.select(rows.reshape(-1), sentences, group=beam)  # (A' * K) rows
        prev = token.reshape(-1)  # (A' * K,)
    return pool.hypotheses(src_lens)


def _extend_history(history: Tensor, attn: Tensor | None, n_alive: int, k: int) -> Tensor | None:
    """Append this step's attention (A * k, S) to the history (A, k, t, S); None if no attention."""
    if attn is None:
        return None
    step_attn = attn.float().view(n_alive, k, 1, -1)  # (A, k, 1, S)
    return torch.cat([history, step_attn], dim=2)  # (A, k, t + 1, S)


def _gather_beams(x: Tensor, parent: Tensor) -> Tensor:
    """Rows ``parent`` (A, K) of the beam dimension of x (A, k, ...) -> (A, K, ...)."""
    index = parent.view(*parent.shape, *([1] * (x.dim() - 2)))  # (A, K, 1, ...)
    return x.gather(1, index.expand(-1, -1, *x.shape[2:]))  # (A, K, ...)


# --------------------------------------------------------------------------------- datasets


def clip_sources(src: Tensor, src_lens: Tensor, limit: int) -> tuple[Tensor, Tensor]:
    """Sources of (B, S) longer than ``limit`` tokens (EOS included) cut to ``limit``.

    Returns src (B, min(S, limit)) with every row still ending in EOS, and src_lens (B,).
    """
    if src.size(1) <= limit:
        return src, src_lens
    src_lens = src_lens.clamp(max=limit)  # (B,)
    src = src[:, :limit].clone()  # (B, limit)
    src[torch.arange(src.size(0), device=src.device), src_lens - 1] = EOS_ID
    return src, src_lens


def decode_batches(src_lens: np.ndarray, opts: DecodeOptions) -> list[list[int]]:
    """Token-budget batches for decoding, costed by source length and output cap."""
    return eval_batches(src_lens, opts.max_tokens, opts.caps(src_lens))


def search(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    opts: DecodeOptions,
    keep_attention: bool = False,
    forced: Tensor | None = None,
    sentences: Tensor | None = None,
) -> list[Hypothesis]:
    """Decode one padded batch with the search ``opts`` asks for (greedy when beam == 1), or
    by random sampling when it asks for that.

    src: (B, S); src_lens: (B,). Sources too long for the model's position table are cut, and
    output caps are kept within it. ``forced`` (B,): first output tokens (one more token in
    each cap), or None. ``sentences`` (B,): each row's line in the input (sampling's draws).
    """
    caps = max_output_lengths(model, src_lens, opts)  # (B,)
    if forced is not None:
        caps = caps + (forced >= 0).to(caps.device, caps.dtype)
    limit = model.max_positions
    if limit is not None and src.size(1) > limit:
        log.warning("sources longer than %d tokens are cut to the model's limit", limit)
        src, src_lens = clip_sources(src, src_lens, limit)
    if opts.beam == 1:
        return greedy_search(
            model, src, src_lens, caps, BOS_ID, EOS_ID, keep_attention,
            min_len=opts.min_output_len, forced=forced, sampling=Sampling.of(opts),
            sentences=sentences,
        )  # fmt: skip
    return beam_search(
        model, src, src_lens, caps, BOS_ID, EOS_ID, opts.beam, opts.length_penalty,
        keep_attention, min_len=opts.min_output_len, forced=forced,
    )  # fmt: skip


@torch.inference_mode()
def decode_dataset(
    model: Seq2Seq,
    data: TokenDataset,
    opts: DecodeOptions,
    device: torch.device,
    limit: int = 0,
    keep_attention: bool = False,
    advance: Advance = no_progress,
) -> list[Hypothesis]:
    """Hypotheses for (the first ``limit`` sentences of) a dataset, in the original order.

    Decodes in token-budget batches sorted by source length, then restores the order. An
    empty source gives an empty hypothesis (score 0) without being decoded. ``advance`` is
    called with the sentences done, a batch at a time.
    """
    model.eval()
    n = len(data) if limit <= 0 else min(limit, len(data))
    out: list[Hypothesis | None] = [None] * n
    nonempty = np.flatnonzero(data.src_lens[:n] > 0)  # (M,) an empty source gives no output
    for i in np.flatnonzero(data.src_lens[:n] == 0).tolist():
        out[i] = Hypothesis([], 0.0, None, [([], 0.0)])
    advance(n - len(nonempty))
    precision = resolve_precision(str(opts.precision), device)
    for batch_pos in decode_batches(data.src_lens[nonempty], opts):
        idx = nonempty[batch_pos]  # (b,) dataset indices
        batch = make_batch(data, idx).to(device)
        forced = None if data.forced is None else torch.from_numpy(data.forced[idx]).to(device)
        with autocast(precision, device):
            lines = torch.from_numpy(idx)  # (b,) each sentence's line: its draws when sampling
            hyps = search(model, batch.src, batch.src_lens, opts, keep_attention, forced, lines)
        for i, h in zip(idx.tolist(), hyps, strict=True):
            out[i] = h
        advance(len(idx))
    return [h for h in out if h is not None]


def translate_dataset(
    model: Seq2Seq,
    data: TokenDataset,
    tokenizer: Tokenizer,
    opts: DecodeOptions,
    device: torch.device,
    limit: int = 0,
) -> list[str]:
    """Detokenized translations of (the first ``limit`` sentences of) a dataset, in order.

    Greedy search when ``opts.beam == 1``, beam search otherwise.
    """
    hyps = decode_dataset(model, data, opts, device, limit)
    return [tokenizer.decode(h.tokens) for h in hyps]
