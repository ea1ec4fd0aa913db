"""Our Transformer's weights under transformers' names (Marian's, Pegasus's and M2M100's
layout), and the reordering of features between their sinusoid layout and ours: what the
export to and the import from transformers folders share. Needs no transformers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from nmt.models.transformer import Transformer


def permutation(d_model: int) -> torch.Tensor:
    """Feature j of theirs is feature ``perm[j]`` of ours: the even features (our sines) first,
    then the odd ones (our cosines), so ``ours_table[:, perm]`` is their position table."""
    import torch

    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


# How a weight meets the residual stream, which :func:`permutation` reorders: "in" reads it
# (its columns are features), "out" writes it (its rows, or a vector's entries, are features),
# "none" does neither.
Slot = tuple["torch.Tensor", str]


def _norm(out: dict[str, Slot], name: str, norm: Any) -> None:
    out[f"{name}.weight"] = (norm.weight, "out")
    out[f"{name}.bias"] = (norm.bias, "out")


def _attention(out: dict[str, Slot], name: str, attn: Any) -> None:
    for proj in ("q_proj", "k_proj", "v_proj"):  # reads the residual stream
        out[f"{name}.{proj}.weight"] = (getattr(attn, proj).weight, "in")
        out[f"{name}.{proj}.bias"] = (getattr(attn, proj).bias, "none")
    out[f"{name}.out_proj.weight"] = (attn.out_proj.weight, "out")  # writes it
    out[f"{name}.out_proj.bias"] = (attn.out_proj.bias, "out")


def _ffn(out: dict[str, Slot], name: str, layer: Any) -> None:
    out[f"{name}.fc1.weight"] = (layer.linear1.weight, "in")
    out[f"{name}.fc1.bias"] = (layer.linear1.bias, "none")
    out[f"{name}.fc2.weight"] = (layer.linear2.weight, "out")
    out[f"{name}.fc2.bias"] = (layer.linear2.bias, "out")


def weight_slots(model: Transformer, pre_norm: bool) -> dict[str, Slot]:
    """Each transformers name (Marian's, Pegasus's and M2M100's layout) and the weight of ours
    it holds, with how it meets the residual stream. Position tables and the output bias
    (``final_logits_bias``) are not among them."""
    out: dict[str, Slot] = {
        "model.shared.weight": (model.src_embed.weight, "in"),
        "model.encoder.embed_tokens.weight": (model.src_embed.weight, "in"),
        "model.decoder.embed_tokens.weight": (model.tgt_embed.weight, "in"),
        "lm_head.weight": (model.out_proj.weight, "in"),
    }
    for i, layer in enumerate(model.encoder_layers):
        name = f"model.encoder.layers.{i}"
        _attention(out, f"{name}.self_attn", layer.self_attn)
        _norm(out, f"{name}.self_attn_layer_norm", layer.norm1)
        _ffn(out, name, layer)
        _norm(out, f"{name}.final_layer_norm", layer.norm2)
    for i, layer in enumerate(model.decoder_layers):
        name = f"model.decoder.layers.{i}"
        _attention(out, f"{name}.self_attn", layer.self_attn)
        _norm(out, f"{name}.self_attn_layer_norm", layer.norm1)
        _attention(out, f"{name}.encoder_attn", layer.cross_attn)
        _norm(out, f"{name}.encoder_attn_layer_norm", layer.norm2)
        _ffn(out, name, layer)
        _norm(out, f"{name}.final_layer_norm", layer.norm3)
    if pre_norm:
        _norm(out, "model.encoder.layer_norm", model.enc_norm)
        _norm(out, "model.decoder.layer_norm", model.dec_norm)
    return out


def permuted(tensor: torch.Tensor, kind: str, perm: torch.Tensor) -> torch.Tensor:
    """``tensor`` with its features (by ``kind``, see :data:`Slot`) reordered by ``perm``."""
    if kind == "in":
        return tensor[:, perm]
    return tensor[perm] if kind == "out" else tensor
