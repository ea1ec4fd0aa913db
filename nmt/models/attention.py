"""Attention: masked softmax, the recurrent model's scoring functions, multi-head attention.

One mask convention: a boolean mask is True where attention may go, False where it may not.

* ``key_valid`` (the scoring modules, :class:`MultiHeadAttention`): bool (B, Tk), True = a real
  key, False = padding, as made by :func:`nmt.models.base.lengths_to_mask`;
* ``allowed`` (:func:`masked_softmax`): bool, broadcastable to the scores, True = the query
  may attend to the key; :func:`attention_mask` makes it from ``key_valid`` and causality.

Scores are scaled by 1/sqrt(d_k) before the softmax wherever scaling is used.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.models.dropout import dropout


def masked_softmax(scores: Tensor, allowed: Tensor | None, dim: int = -1) -> Tensor:
    """Softmax of ``scores`` over ``dim``, keeping only the entries where ``allowed`` is True.

    scores: any shape, e.g. (B, S) or (B, H, Tq, Tk); allowed: bool, broadcastable to
    ``scores``, True = may be attended to (None: everything may). Entries not allowed get
    exactly 0; a slice with no entry allowed gives all zeros, never NaN. Returns a tensor of the
    shape of ``scores``.
    """
    if allowed is None:
        return scores.softmax(dim)
    lowest = torch.finfo(scores.dtype).min
    filled = scores.masked_fill(~allowed, lowest)  # like scores
    return filled.softmax(dim) * allowed  # like scores; a slice with none allowed becomes 0


def dot_scores(q: Tensor, k: Tensor) -> Tensor:
    """score(q, k) = q . k for every query against every key.

    q: (..., Tq, D), k: (..., Tk, D); returns (..., Tq, Tk): the scores of :class:`DotScore`
    and :class:`GeneralScore` (whose keys are projected first).
    """
    return q @ k.transpose(-2, -1)


def scaled_dot_scores(q: Tensor, k: Tensor) -> Tensor:
    """score(q, k) = q . k / sqrt(D) for every query against every key.

    q: (..., Tq, D), k: (..., Tk, D); returns (..., Tq, Tk): the scores of multi-head attention
    (D = d_k, per head) and of :class:`ScaledDotScore`.
    """
    return dot_scores(q, k) / math.sqrt(q.size(-1))


# ---------------------------------------------------------------------------------------------
# Scoring functions of the recurrent model: one query vector against a sequence of keys.
# ---------------------------------------------------------------------------------------------


class ScoredAttention(nn.Module):
    """Attention with one query per row: weights = masked_softmax(score(q, k_j)).

    Subclasses define :meth:`project_keys`, run once per source sentence, and :meth:`score`,
    run once per decoder step against the projected keys. Several consecutive query rows may
    share one sentence's keys (the beams of a sentence): with B sentences, ``group`` = G and
    G * B queries, every group of G queries attends to its sentence, and the keys are never
    copied.
    """

    def project_keys(self, keys: Tensor) -> Tensor:
        """Keys (B, S, Dk) -> the form :meth:`score` consumes, (B, S, *)."""
        raise NotImplementedError

    def score(self, query: Tensor, projected_keys: Tensor) -> Tensor:
        """Query (B, Dq) or (B, G, Dq) and projected keys (B, S, *) -> unnormalised scores
        (B, S) or (B, G, S)."""
        raise NotImplementedError

    def forward(
        self,
        query: Tensor,
        projected_keys: Tensor,
        values: Tensor,
        key_valid: Tensor | None,
        group: int = 1,
    ) -> tuple[Tensor, Tensor]:
        """Query (G * B, Dq), projected keys (B, S, *), values (B, S, Dv), key_valid (B, S)
        True = a real key, or None; ``group`` = G consecutive queries per sentence (1 but in
        beam search).

        Returns the context (G * B, Dv) and the attention weights (G * B, S).
        """
        b = projected_keys.size(0)
        if query.size(0) != group * b:
            raise ValueError(f"{query.size(0)} queries are not {group} per sentence of {b}")
        grouped = query.view(b, group, query.size(-1))  # (B, G, Dq)
        allowed = key_valid[:, None] if key_valid is not None else None  # (B, 1, S)
        weights = masked_softmax(self.score(grouped, projected_keys), allowed)  # (B, G, S)
        context = torch.bmm(weights, values)  # (B, G, Dv)
        return context.view(-1, values.size(-1)), weights.view(-1, weights.size(-1))


class AdditiveScore(ScoredAttention):
    """Bahdanau (concat) scoring: score(q, k) = v^T tanh(W_q q + W_k k).

    ``W_k k`` is computed once per source by :meth:`project_keys`; no biases, as in the formula.
    """

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int) -> None:
        super().__init__()
        self.query_proj = nn.Linear(query_dim, attn_dim, bias=False)
        self.key_proj = nn.Linear(key_dim, attn_dim, bias=False)
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, S, A)

    def score(self, query: Tensor, projected_keys: Tensor) -> Tensor:
        grouped = query.dim() == 3
        q = self.query_proj(query if grouped else query.unsqueeze(1))  # (B, G, A)
        hidden = torch.tanh(q.unsqueeze(2) + projected_keys.unsqueeze(1))  # (B, G, S, A)
        scores = self.v(hidden).squeeze(-1)  # (B, G, S)
        return scores if grouped else scores.squeeze(1)


def _grouped_scores(
    scores: Callable[[Tensor, Tensor], Tensor], query: Tensor, keys: Tensor
) -> Tensor:
    """``scores`` of query (B, Dq) or (B, G, Dq) against keys (B, S, Dq): (B, S) or (B, G, S)."""
    grouped = query.dim() == 3
    q = query if grouped else query.unsqueeze(1)  # (B, G, Dq)
    out = scores(q, keys)  # (B, G, S)
    return out if grouped else out.squeeze(1)


class DotScore(ScoredAttention):
    """Luong dot scoring: score(q, k) = q . k, without parameters.

    The dot product needs queries and keys of one size: other sizes are refused (the
    ``general`` score learns a map from the keys to the query size).
    """

    name = "dot"  # the score's name in make_score (model.attention)

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__()
        if query_dim != key_dim:
            raise ValueError(
                f"model.attention={self.name} has no parameters, so queries and keys must be of "
                f"one size, but the queries are of size {query_dim} and the keys of size "
                f"{key_dim} (the GRU's keys are 2 x model.hidden_dim with a bidirectional "
                "encoder): use model.attention=general, which learns the map from keys to queries"
            )

    def project_keys(self, keys: Tensor) -> Tensor:
        return keys  # (B, S, Dq): nothing to precompute

    def score(self, query: Tensor, projected_keys: Tensor) -> Tensor:
        return _grouped_scores(dot_scores, query, projected_keys)


class ScaledDotScore(DotScore):
    """Scaled dot-product scoring: score(q, k) = q . k / sqrt(d), d = query_dim; without
    parameters, for queries and keys of one size as :class:`DotScore`."""

    name = "scaled_dot"

    def score(self, query: Tensor, projected_keys: Tensor) -> Tensor:
        return _grouped_scores(scaled_dot_scores, query, projected_keys)


class GeneralScore(ScoredAttention):
    """Luong general scoring: score(q, k) = q^T W k, W of shape (Dq, Dk), for any two sizes.

    ``W k`` is computed once per source by :meth:`project_keys`.
    """

    name = "general"

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(key_dim, query_dim, bias=False)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, S, Dq)

    def score(self, query: Tensor, projected_keys: Tensor) -> Tensor:
        return _grouped_scores(dot_scores, query, projected_keys)


def make_score(name: str, query_dim: int, key_dim: int, attn_dim: int) -> ScoredAttention:
    """The scoring module called ``name``: additive | dot | general | scaled_dot.

    ``attn_dim`` is the hidden size of the additive score; the others do not use it. ``dot``
    and ``scaled_dot`` refuse a ``key_dim`` other than ``query_dim`` (ValueError).
    """
    if name == "additive":
        return AdditiveScore(query_dim, key_dim, attn_dim)
    kinds = {kind.name: kind for kind in (DotScore, GeneralScore, ScaledDotScore)}
    if name not in kinds:
        raise ValueError(f"unknown attention {name!r}: additive, {', '.join(kinds)}")
    return kinds[name](query_dim, key_dim)


# ---------------------------------------------------------------------------------------------
# Multi-head attention (Vaswani et al. 2017)
# ---------------------------------------------------------------------------------------------


def attention_mask(
    key_valid: Tensor | None, causal: bool, tq: int, tk: int, device: torch.device
) -> Tensor | None:
    """``allowed``: bool, True = may attend, broadcastable to (B, H, Tq, Tk); None if every key
    is allowed.

    key_valid: (B, Tk), True = a real key. With ``causal``, the Tq queries are the last Tq of
    the Tk positions (Tk > Tq when earlier keys come from a cache), and query i sees the keys up
    to its own position Tk - Tq + i.
    """
    allowed = None
    if key_valid is not None:
        allowed = key_valid[:, None, None, :]  # (B, 1, 1, Tk)
    if causal and tq > 1:
        ones = torch.ones(tq, tk, dtype=torch.bool, device=device)  # (Tq, Tk)
        past = ones.tril(diagonal=tk - tq)  # (Tq, Tk)
        allowed = past if allowed is None else allowed & past  # (B, 1, Tq, Tk)
    return allowed


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention with separate q/k/v/out projections.

    The projections map to the same parameters as ``torch.nn.MultiheadAttention``
    (``in_proj_weight`` = [q_proj; k_proj; v_proj], ``out_proj``); see
    :meth:`load_torch_weights`. ``dropout`` applies to the attention weights.
    """

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if d_model % heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.heads = heads
        self.d_head = d_model // heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _split(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, dk)."""
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.d_head).transpose(1, 2)  # (B, H, T, dk)

    def _merge(self, x: Tensor) -> Tensor:
        """(B, H, T, dk) -> (B, T, D)."""
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.heads * self.d_head)  # (B, T, D)

    def project_kv(self, key: Tensor, value: Tensor) -> dict[str, Tensor]:
        """Keys and values (B, Tk, D) projected and split: {"k", "v"}, each (B, H, Tk, dk).

        For cross-attention this is computed once per source and passed back as ``cache``.
        """
        return {"k": self._split(self.k_proj(key)), "v": self._split(self.v_proj(value))}

    def _keys_values(
        self, key: Tensor | None, value: Tensor | None, cache: dict[str, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """Projected keys and values (B, H, Tk, dk), taken from or appended to the cache."""
        if key is None:  # precomputed (cross-attention memory)
            if cache is None:
                raise ValueError("key=None needs a cache holding the projected keys/values")
            return cache["k"], cache["v"]
        new = self.project_kv(key, key if value is None else value)
        if cache is None:
            return new["k"], new["v"]
        cache["k"] = torch.cat([cache["k"], new["k"]], dim=2)  # (B, H, t + Tnew, dk)
        cache["v"] = torch.cat([cache["v"], new["v"]], dim=2)  # (B, H, t + Tnew, dk)
        return cache["k"], cache["v"]

    def _with_weights(
        self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Attention with materialised weights: (B, H, Tq, dk) output, (B, H, Tq, Tk) weights."""
        scores = scaled_dot_scores(q, k)  # (B, H, Tq, Tk)
        weights = masked_softmax(scores, allowed)  # (B, H, Tq, Tk)
        dropped = dropout(weights, self.dropout, self.training)  # (B, H, Tq, Tk)
        return dropped @ v, weights  # (B, H, Tq, dk), (B, H, Tq, Tk)

    def _grouped(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_valid: Tensor | None,
        need_weights: bool,
        group: int,
    ) -> tuple[Tensor, Tensor | None]:
        """One query per row (G * B, H, 1, dk) against B sentences' keys/values (B, H, S, dk):
        the G = ``group`` queries of a sentence attend as G positions of one row, with no copy
        of k/v."""
        b, heads, dk = k.size(0), self.heads, self.d_head
        if q.size(2) != 1 or q.size(0) != group * b:
            raise ValueError(
                f"grouped attention needs {group} single-position queries per sentence of {b}, "
                f"got {tuple(q.shape)}"
            )
        grouped = q.view(b, group, heads, dk).transpose(1, 2)  # (B, H, G, dk)
        allowed = attention_mask(key_valid, False, grouped.size(2), k.size(2), q.device)
        weights = None
        if need_weights:
            out, weights = self._with_weights(grouped, k, v, allowed)  # (B,H,G,dk), (B,H,G,S)
            weights = weights.transpose(1, 2).reshape(-1, heads, 1, k.size(2))  # (G*B, H, 1, S)
        else:
            out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=allowed)  # (B,H,G,dk)
        out = out.transpose(1, 2).reshape(-1, 1, heads * dk)  # (G * B, 1, D)
        return self.out_proj(out), weights

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        key_valid: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        cache: dict[str, Tensor] | None = None,
        group: int = 1,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, Tq, D) to ``key``/``value`` (B, Tk, D); value defaults to key.

        key_valid: (B, Tk) bool, True = a real key, False = padding (over all keys, cached ones
            included); None: every key is real.
        causal: query i (the last Tq positions) sees only keys up to its own position.
        need_weights: also return the per-head weights (B, H, Tq, Tk), before dropout; computed
            with an explicit softmax, otherwise ``F.scaled_dot_product_attention`` is used.
        cache: incremental decoding, updated in place. Self-attention: {"k", "v"} of shape
            (B, H, t, dk) (t may be 0); the new positions' keys/values are appended.
            Cross-attention: pass ``key=None`` and the dict from :meth:`project_kv`.
        group: G > 1 when the query rows are G hypotheses per sentence of keys/values that hold
            one row per sentence (beam search): ``query`` (G * B, 1, D) then attends with the
            grouped-query path, and the mask and weights follow the keys' and queries' rows.
        Returns the output (B, Tq, D) and the weights or None.
        """
        q = self._split(self.q_proj(query))  # (B, H, Tq, dk)
        k, v = self._keys_values(key, value, cache)  # (B, H, Tk, dk) each
        if group > 1:  # G beams per sentence share its cached keys/values
            return self._grouped(q, k, v, key_valid, need_weights, group)
        if k.size(0) != q.size(0):
            raise ValueError(f"{q.size(0)} query rows but {k.size(0)} key rows (group={group})")
        tq, tk = q.size(2), k.size(2)
        if not need_weights and causal and key_valid is None and tq == tk:
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )  # (B, H, Tq, dk)
            return self.out_proj(self._merge(out)), None
        allowed = attention_mask(key_valid, causal, tq, tk, q.device)  # (B|1, 1, Tq|1, Tk)
        weights = None
        if need_weights:
            out, weights = self._with_weights(q, k, v, allowed)  # (B,H,Tq,dk), (B,H,Tq,Tk)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0
            )  # (B, H, Tq, dk)
        return self.out_proj(self._merge(out)), weights  # (B, Tq, D)

    @torch.no_grad()
    def load_torch_weights(self, mha: nn.MultiheadAttention) -> None:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` with the same sizes."""
        for proj, weight in zip(self._in_projs(), mha.in_proj_weight.chunk(3), strict=True):
            proj.weight.copy_(weight)
        if mha.in_proj_bias is not None:
            for proj, bias in zip(self._in_projs(), mha.in_proj_bias.chunk(3), strict=True):
                proj.bias.copy_(bias)
        self.out_proj.load_state_dict(mha.out_proj.state_dict())

    def _in_projs(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        return self.q_proj, self.k_proj, self.v_proj
