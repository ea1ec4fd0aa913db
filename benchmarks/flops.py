"""Model FLOPs of a forward pass, counted from a model's config and a batch's true lengths.

Only matrix products are counted, at 2 FLOPs per multiply-add (a product of an (m, k) and a
(k, n) matrix costs ``2 * m * k * n``). Embedding lookups, biases, layer norms, softmaxes,
activations and the loss are left out: they are a few percent of the total for these models.

Lengths are those the model really sees, per sentence and without padding: ``src_lens``
counts source tokens with EOS (the ``src_lens`` of a :class:`~nmt.data.batching.Batch`) and
``tgt_lens`` the decoder's input positions, BOS + target (the non-pad tokens of ``tgt_in``).
Padding is not counted, so FLOPs divided by time measure useful work ("model FLOPs").

Training costs ``TRAIN_FACTOR`` (3) times the forward pass: the backward pass computes a
gradient for both operands of every product.

Transformer (per sentence, ``S`` source and ``T`` target positions, width ``D``, feed-forward
width ``F``, target vocabulary ``V``; heads only split ``D``, they do not change the count):

* encoder layer: q/k/v/out projections ``4 * 2SD^2``, scores ``QK^T`` ``2S^2D`` and weighted
  sum ``2S^2D``, feed-forward ``2 * 2SDF``;
* decoder layer: self-attention as above with ``T``; the causal mask is applied to a full
  ``T x T`` score matrix, which is what the model computes, so the full ``T^2`` is counted
  (not the ``T(T+1)/2`` a causal kernel could get away with); cross-attention: q and out
  projections ``2 * 2TD^2``, k/v projections of the memory ``2 * 2SD^2``, scores and weighted
  sum ``2 * 2TSD``; feed-forward ``2 * 2TDF``;
* output projection ``2TDV``.

GRU with attention (Bahdanau): per direction and encoder layer, ``S`` steps of
``2 * 3H * (I + H)`` (input and hidden products of the three gates); the bridge ``2 C L H``
once; the attention keys once per source; then per target step the attention (query
projection, scores, context), the decoder GRU cells with input ``[E y; c]``, the pre-output
layer over ``[s; c; E y]`` and the output projection (``C = H * directions``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

TRAIN_FACTOR = 3  # forward + backward (gradients for inputs and weights)

Lengths = np.ndarray | list[int]


def _as_lengths(lens: Any) -> np.ndarray:
    """Lengths (a list, array or tensor) as an int64 numpy array."""
    if hasattr(lens, "detach"):
        lens = lens.detach().cpu().numpy()
    return np.asarray(lens, dtype=np.int64).reshape(-1)


def _total(x: np.ndarray) -> int:
    return int(np.sum(x, dtype=np.int64))


def transformer_forward_flops(
    model: Mapping[str, Any], src_lens: Lengths, tgt_lens: Lengths, tgt_vocab: int
) -> dict[str, int]:
    """FLOPs of one Transformer forward pass over a batch, by component.

    model: the fields of TransformerConfig (d_model, d_ff, enc_layers, dec_layers);
    src_lens, tgt_lens: (B,) per-sentence source (EOS included) and decoder input lengths.
    """
    d, f = int(model["d_model"]), int(model["d_ff"])
    n_enc, n_dec = int(model["enc_layers"]), int(model["dec_layers"])
    s, t = _as_lengths(src_lens), _as_lengths(tgt_lens)
    return {
        "enc_attn_proj": n_enc * 8 * d * d * _total(s),
        "enc_attn_scores": n_enc * 4 * d * _total(s * s),
        "enc_ffn": n_enc * 4 * d * f * _total(s),
        "dec_self_attn_proj": n_dec * 8 * d * d * _total(t),
        "dec_self_attn_scores": n_dec * 4 * d * _total(t * t),
        "dec_cross_attn_proj": n_dec * 4 * d * d * (_total(t) + _total(s)),
        "dec_cross_attn_scores": n_dec * 4 * d * _total(t * s),
        "dec_ffn": n_dec * 4 * d * f * _total(t),
        "output_proj": 2 * d * int(tgt_vocab) * _total(t),
    }


def _gru_layer_flops(input_dim: int, hidden: int) -> int:
    """FLOPs of one GRU step: the three gates' input and hidden products."""
    return 2 * 3 * hidden * (input_dim + hidden)


def _attention_flops(
    kind: str, query_dim: int, key_dim: int, attn_dim: int
) -> tuple[int, int, int]:
    """(per source position once, per target step, per target step and source position).

    additive: keys W_k k once; per step W_q q; per step and position v^T tanh(.) and the
    context. dot family: keys mapped to the query size once by general (dot and scaled_dot
    need equal sizes and have no parameters); per step and position the dot product and the
    context.
    """
    context = 2 * key_dim
    if kind == "additive":
        return 2 * key_dim * attn_dim, 2 * query_dim * attn_dim, 2 * attn_dim + context
    keys = 2 * key_dim * query_dim if kind == "general" else 0
    return keys, 0, 2 * query_dim + context


def gru_forward_flops(
    model: Mapping[str, Any], src_lens: Lengths, tgt_lens: Lengths, tgt_vocab: int
) -> dict[str, int]:
    """FLOPs of one GRU-with-attention forward pass over a batch, by component.

    model: the fields of GRUBahdanauConfig; src_lens, tgt_lens as for the Transformer.
    """
    e, h = int(model["emb_dim"]), int(model["hidden_dim"])
    n_enc, n_dec = int(model["enc_layers"]), int(model["dec_layers"])
    dirs = 2 if model["bidirectional"] else 1
    c = h * dirs
    s, t = _as_lengths(src_lens), _as_lengths(tgt_lens)
    s_sum, t_sum, b = _total(s), _total(t), len(s)
    encoder = sum(dirs * _gru_layer_flops(e if i == 0 else c, h) for i in range(n_enc))
    decoder = _gru_layer_flops(e + c, h) + (n_dec - 1) * _gru_layer_flops(h, h)
    keys, per_step, per_pair = _attention_flops(
        str(model["attention"]), h, c, int(model["attn_dim"])
    )
    return {
        "encoder_gru": encoder * s_sum,
        "bridge": 2 * c * n_dec * h * b,
        "attn_keys": keys * s_sum,
        "attn_query": per_step * t_sum,
        "attn_scores_context": per_pair * _total(t * s),
        "decoder_gru": decoder * t_sum,
        "pre_output": 2 * (h + c + e) * e * t_sum,
        "output_proj": 2 * e * int(tgt_vocab) * t_sum,
    }


def model_kind(model: Mapping[str, Any]) -> str:
    """``transformer`` or ``gru`` from a model config's ``arch`` (or its fields)."""
    arch = str(model.get("arch", ""))
    if arch == "transformer" or (not arch and "d_model" in model):
        return "transformer"
    if arch == "gru_bahdanau" or (not arch and "hidden_dim" in model):
        return "gru"
    raise ValueError(f"no FLOP count for model {arch or dict(model)!r}")


def forward_flops_breakdown(
    model: Mapping[str, Any], src_lens: Lengths, tgt_lens: Lengths, tgt_vocab: int
) -> dict[str, int]:
    """Forward FLOPs by component for a model config of either kind."""
    if model_kind(model) == "transformer":
        return transformer_forward_flops(model, src_lens, tgt_lens, tgt_vocab)
    return gru_forward_flops(model, src_lens, tgt_lens, tgt_vocab)


def forward_flops(
    model: Mapping[str, Any], src_lens: Lengths, tgt_lens: Lengths, tgt_vocab: int
) -> int:
    """Total forward FLOPs of a batch (matrix products only, padding excluded)."""
    return sum(forward_flops_breakdown(model, src_lens, tgt_lens, tgt_vocab).values())
