"""Converting the Transformer to CTranslate2 (``nmt-export --format ctranslate2``).

The converter fills CTranslate2's ``TransformerSpec`` from our modules, weight by weight:
embeddings (scaled by sqrt(d_model), as ours), the position table written out whole (sinusoidal
or learned, so CTranslate2 never computes its own), each layer's fused query/key/value (self-
attention) or query and fused key/value (cross-attention) projections, the layer norms (epsilon
1e-5, PyTorch's) and the output projection with its bias where it has one. Every Transformer
variant of :class:`~nmt.config.TransformerConfig` converts: pre- and post-norm, tied or untied
embeddings, one joint or two vocabularies, sinusoidal or learned positions, each feed-forward
activation, ids that read another id's embedding row. The GRU model cannot: CTranslate2
has no recurrent sequence-to-sequence models.

Decoding the converted model is :mod:`nmt.decode.ct2`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import DictConfig

from nmt.config import ConfigError
from nmt.data.tokenizer import TokenizerPair
from nmt.decode.ct2 import require, vocabulary

if TYPE_CHECKING:  # the converter reads PyTorch modules; `import nmt.ship.ctranslate2` needs none
    import torch

    from nmt.models.attention import MultiHeadAttention
    from nmt.models.transformer import Transformer


def check_exportable(cfg: DictConfig) -> None:
    """ConfigError unless the model of ``cfg`` can be converted."""
    if cfg.model.arch != "transformer":
        raise ConfigError(
            f"--format ctranslate2: model.arch={cfg.model.arch!r} cannot be exported: "
            "CTranslate2 has no recurrent sequence-to-sequence models (only the Transformer "
            "converts; the GRU package decodes with engine=torch)"
        )


# ----------------------------------------------------------------------------------- convert


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()


def _linear(spec: Any, layer: torch.nn.Linear) -> None:
    spec.weight = _np(layer.weight)
    if layer.bias is not None:
        spec.bias = _np(layer.bias)


def _fused(spec: Any, layers: list[torch.nn.Linear]) -> None:
    """One linear spec holding several projections stacked along the output dimension."""
    spec.weight = np.concatenate([_np(layer.weight) for layer in layers])
    if all(layer.bias is not None for layer in layers):
        spec.bias = np.concatenate([_np(layer.bias) for layer in layers])  # type: ignore[arg-type]


def _norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _np(norm.weight)
    spec.beta = _np(norm.bias)


def _self_attention(spec: Any, attn: MultiHeadAttention, norm: torch.nn.LayerNorm) -> None:
    _fused(spec.linear[0], [attn.q_proj, attn.k_proj, attn.v_proj])
    _linear(spec.linear[1], attn.out_proj)
    _norm(spec.layer_norm, norm)


def _cross_attention(spec: Any, attn: MultiHeadAttention, norm: torch.nn.LayerNorm) -> None:
    _linear(spec.linear[0], attn.q_proj)
    _fused(spec.linear[1], [attn.k_proj, attn.v_proj])
    _linear(spec.linear[2], attn.out_proj)
    _norm(spec.layer_norm, norm)


def _ffn(spec: Any, layer: Any, norm: torch.nn.LayerNorm) -> None:
    _linear(spec.linear_0, layer.linear1)
    _linear(spec.linear_1, layer.linear2)
    _norm(spec.layer_norm, norm)


def _positions(model: Transformer, which: str) -> np.ndarray:
    """The model's own position table, learned or sinusoidal (of either style), whole."""
    pos = getattr(model, which)
    return _np(pos.learned.weight if pos.learned is not None else pos.table)  # (P, D)


def _embeddings(model: Transformer, embed: torch.nn.Embedding) -> np.ndarray:
    """The rows each id reads: its own, or another id's where the model says so
    (``model.embedding_aliases``; the output projection keeps every row)."""
    weight = embed.weight if model.embed_rows is None else embed.weight[model.embed_rows]
    return _np(weight)


def transformer_spec(model: Transformer, tokenizers: TokenizerPair) -> Any:
    """A filled ``ctranslate2.specs.TransformerSpec`` of ``model``."""
    require()
    from ctranslate2.specs import transformer_spec as ts
    from ctranslate2.specs.common_spec import Activation

    norm_first = model.encoder_layers[0].norm_first
    activation = {"relu": Activation.RELU, "gelu": Activation.GELU, "swish": Activation.SWISH}
    spec = ts.TransformerSpec.from_config(
        (len(model.encoder_layers), len(model.decoder_layers)),
        model.heads,
        pre_norm=norm_first,
        activation=activation[model.encoder_layers[0].activation],
        alignment_layer=-1,  # the last decoder layer's cross-attention ...
        alignment_heads=0,  # ... averaged over all heads, as decode_step returns it
    )
    spec.config.layer_norm_epsilon = model.encoder_layers[0].norm1.eps
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = _embeddings(model, model.src_embed)
    enc.scale_embeddings = True  # sqrt(d_model), as Transformer._embed
    enc.position_encodings.encodings = _positions(model, "src_pos")
    if norm_first:
        _norm(enc.layer_norm, model.enc_norm)
    for layer_spec, layer in zip(enc.layer, model.encoder_layers, strict=True):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _ffn(layer_spec.ffn, layer, layer.norm2)
    dec.embeddings.weight = _embeddings(model, model.tgt_embed)
    dec.scale_embeddings = True
    dec.position_encodings.encodings = _positions(model, "tgt_pos")
    if norm_first:
        _norm(dec.layer_norm, model.dec_norm)
    for layer_spec, layer in zip(dec.layer, model.decoder_layers, strict=True):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _cross_attention(layer_spec.attention, layer.cross_attn, layer.norm2)
        _ffn(layer_spec.ffn, layer, layer.norm3)
    dec.projection.weight = _np(model.out_proj.weight)
    if model.out_proj.bias is not None:
        dec.projection.bias = _np(model.out_proj.bias)
    spec.register_source_vocabulary(vocabulary(tokenizers, "src"))
    spec.register_target_vocabulary(vocabulary(tokenizers, "tgt"))
    return spec


def convert(model: Any, tokenizers: TokenizerPair, out: Path, quantization: str) -> None:
    """Write the CTranslate2 model of ``model`` into the folder ``out`` (created here)."""
    from nmt.models.transformer import Transformer

    if not isinstance(model, Transformer):
        raise ConfigError(f"{type(model).__name__} cannot be exported to CTranslate2")
    spec = transformer_spec(model, tokenizers)
    spec.validate()
    spec.optimize(quantization=None if quantization == "float32" else quantization)
    out.mkdir(parents=True)
    spec.save(str(out))
