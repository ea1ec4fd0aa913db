"""The Transformer encoder-decoder (Vaswani et al. 2017), pre-norm or post-norm.

Layers mirror ``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer`` (sub-modules
``self_attn``, ``cross_attn`` (torch: ``multihead_attn``), ``linear1``, ``linear2``,
``norm1``..``norm3``), so their weights can be copied across.

Incremental decoding state (a :class:`~nmt.models.base.DecoderState`), for B sentences with
G = ``state.group`` consecutive hypothesis rows each (N = G * B)::

    rows = {"self": [{"k", "v"}]}        # per decoder layer, (N, H, t, dk) each: self-attention
                                         # keys/values of the t target tokens so far (t = 0 at
                                         # first), new dicts at every step
    sentences = {"memory_valid": (B, S) bool,  # True = real source token, False = padding
                 "cross": [{"k", "v"}]}        # per decoder layer, (B, H, S, dk) each: the
                                               # encoder memory projected for cross-attention,
                                               # made once
    step                                 # position of the next target token

With G > 1 the cross-attention takes the grouped-query path: the G query rows of a sentence
attend to its one row of the cross keys/values. ``decode_step`` always returns the last decoder
layer's cross-attention averaged over heads, (N, S): with a single query position it costs no
more than the attention itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.models.attention import MultiHeadAttention
from nmt.models.base import DecoderState, Seq2Seq, lengths_to_mask
from nmt.models.dropout import Dropout

AttnOut = tuple[Tensor, Tensor | None]  # (output, weights or None)
SubLayer = Callable[[Tensor], AttnOut]  # what a residual block wraps: (B, T, D) -> AttnOut


def sinusoidal_positions(length: int, d_model: int, style: str = "vaswani") -> Tensor:
    """P[t, 2k] = sin(t / 10000^(2k/d)), P[t, 2k+1] = cos(t / 10000^(2k/d)); (length, d_model).

    ``style="fairseq"`` is the table of fairseq, M2M100 and NLLB: the frequency of pair k is
    10000^(-k / (d/2 - 1)), and position t reads the row of t + 2 (fairseq counts positions
    from the padding id + 1). Both are laid out interleaved here; those models keep the sines
    in the first half (:func:`nmt.store.hf_names.permutation` maps one layout onto the other)."""
    offset = 2 if style == "fairseq" else 0
    pos = torch.arange(offset, offset + length, dtype=torch.float32)[:, None]  # (L, 1)
    if style == "fairseq":  # computed in fairseq's order, so that the values are its own
        k = torch.arange((d_model + 1) // 2, dtype=torch.float32)  # (ceil(D/2),)
        angles = pos * torch.exp(k * -(math.log(10000.0) / max(d_model // 2 - 1, 1)))
    else:
        two_k = torch.arange(0, d_model, 2, dtype=torch.float32)  # (ceil(D/2),)
        angles = pos * torch.exp(-math.log(10000.0) * two_k / d_model)  # (L, ceil(D/2))
    table = torch.zeros(length, d_model)  # (L, D)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table


class PositionalEmbedding(nn.Module):
    """Position vectors for positions ``start .. start + length - 1``: sinusoidal or learned."""

    def __init__(
        self, max_positions: int, d_model: int, learned: bool, style: str = "vaswani"
    ) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.learned = nn.Embedding(max_positions, d_model) if learned else None
        if not learned:
            table = sinusoidal_positions(max_positions, d_model, str(style))  # (P, D)
            self.register_buffer("table", table, persistent=False)

    def forward(self, start: int, length: int) -> Tensor:
        """Returns (length, D)."""
        if start + length > self.max_positions:
            raise ValueError(f"position {start + length - 1} >= max_positions={self.max_positions}")
        if self.learned is not None:
            return self.learned.weight[start : start + length]  # (T, D)
        return self.table[start : start + length]  # (T, D)


# the feed-forward activations, by model.activation (transformers' names: "swish" is SiLU)
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "swish": F.silu,
}


class _Layer(nn.Module):
    """What encoder and decoder layers share: the feed-forward net and the residual wrapper."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float,
        act_dropout: float,
        norm_first: bool,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.activation = str(activation)
        self.act = ACTIVATIONS[self.activation]
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.act_dropout = Dropout(act_dropout)
        self.dropout = Dropout(dropout)  # on every sub-layer output, before the residual sum

    def feed_forward(self, x: Tensor) -> Tensor:
        """W_2 act(W_1 x + b_1) + b_2: (B, T, D) -> (B, T, D); act is ReLU by default."""
        hidden = self.act_dropout(self.act(self.linear1(x)))  # (B, T, F)
        return self.linear2(hidden)  # (B, T, D)

    def residual(self, x: Tensor, norm: nn.LayerNorm, sublayer: SubLayer) -> AttnOut:
        """x + sublayer(norm(x)) (pre-norm) or norm(x + sublayer(x)) (post-norm), (B, T, D),
        and the sublayer's attention weights (or None)."""
        if self.norm_first:
            out, weights = sublayer(norm(x))  # (B, T, D)
            return x + self.dropout(out), weights
        out, weights = sublayer(x)  # (B, T, D)
        return norm(x + self.dropout(out)), weights

    def residual_feed_forward(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        """The feed-forward sub-layer in its residual block: (B, T, D) -> (B, T, D)."""
        out, _ = self.residual(x, norm, lambda h: (self.feed_forward(h), None))
        return out


class EncoderLayer(_Layer):
    """Self-attention then feed-forward, each in a residual block."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        act_dropout: float = 0.0,
        norm_first: bool = True,
        activation: str = "relu",
    ) -> None:
        super().__init__(d_model, d_ff, dropout, act_dropout, norm_first, activation)
        self.self_attn = MultiHeadAttention(d_model, heads, attn_dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, src_valid: Tensor | None, need_weights: bool = False) -> AttnOut:
        """x (B, S, D), src_valid (B, S) True = a real token, False = padding -> (B, S, D),
        weights (B, H, S, S) | None."""

        def attend(h: Tensor) -> AttnOut:
            return self.self_attn(h, h, h, key_valid=src_valid, need_weights=need_weights)

        x, weights = self.residual(x, self.norm1, attend)  # (B, S, D)
        x = self.residual_feed_forward(x, self.norm2)  # (B, S, D)
        return x, weights


class DecoderLayer(_Layer):
    """Causal self-attention, cross-attention over the encoder memory, feed-forward."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        act_dropout: float = 0.0,
        norm_first: bool = True,
        activation: str = "relu",
    ) -> None:
        super().__init__(d_model, d_ff, dropout, act_dropout, norm_first, activation)
        self.self_attn = MultiHeadAttention(d_model, heads, attn_dropout)
        self.cross_attn = MultiHeadAttention(d_model, heads, attn_dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        memory_valid: Tensor | None,
        self_cache: dict[str, Tensor] | None = None,
        cross_cache: dict[str, Tensor] | None = None,
        need_weights: bool = False,
        group: int = 1,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One decoder layer.

        x: (B, T, D) the target positions (T = 1 when decoding step by step);
        memory: (B, S, D) encoder output; ignored (may be None) when ``cross_cache`` holds
            its projections (from ``cross_attn.project_kv``);
        memory_valid: (B, S) True = a real source token, False = padding; self_cache: updated
            in place (appended);
        group: hypotheses per sentence of ``x`` when the memory (or ``cross_cache``) and
            ``memory_valid`` hold one row per sentence (see :class:`MultiHeadAttention`).
        Returns x (B, T, D), self weights (B, H, T, t + T) and cross weights (B, H, T, S),
        the weights only when ``need_weights``.
        """

        def self_attend(h: Tensor) -> AttnOut:
            return self.self_attn(h, h, h, causal=True, need_weights=need_weights, cache=self_cache)

        source = None if cross_cache is not None else memory  # the cache wins over memory

        def cross_attend(h: Tensor) -> AttnOut:
            return self.cross_attn(
                h,
                source,
                source,
                key_valid=memory_valid,
                need_weights=need_weights,
                cache=cross_cache,
                group=group,
            )

        x, self_weights = self.residual(x, self.norm1, self_attend)  # (B, T, D)
        x, cross_weights = self.residual(x, self.norm2, cross_attend)  # (B, T, D)
        x = self.residual_feed_forward(x, self.norm3)  # (B, T, D)
        return x, self_weights, cross_weights


class Transformer(Seq2Seq):
    """Encoder-decoder Transformer; the constructor takes :class:`TransformerConfig`'s fields.

    ``tie_embeddings``: the decoder's input embedding is the output projection's weight; with
    ``shared_vocab`` (one joint vocabulary) or ``shared_embeddings`` (one id space, two
    segmenters: an OPUS-MT model's ``vocab.json``) the source embedding is that same matrix too.
    Initialisation: xavier_uniform for linear weights, zero biases, N(0, d_model^-0.5) for
    embeddings (the pad row zero); the output projection has no bias (as in the paper) unless
    ``output_bias`` (Marian's ``final_logits_bias``). ``activation``: of the feed-forward
    sub-layers, relu (the paper's), gelu or swish (:data:`ACTIVATIONS`).
    """

    def __init__(
        self,
        *,
        d_model: int,
        heads: int,
        d_ff: int,
        enc_layers: int,
        dec_layers: int,
        dropout: float,
        attn_dropout: float,
        act_dropout: float,
        norm_first: bool,
        tie_embeddings: bool,
        learned_positions: bool,
        max_positions: int,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int = 0,
        shared_vocab: bool = False,
        activation: str = "relu",
        output_bias: bool = False,
        position_style: str = "vaswani",
        shared_embeddings: bool = False,
        frozen_output_bias: bool = False,
        embedding_aliases: bool = False,
        suppress_start: bool = False,
    ) -> None:
        super().__init__()
        shared_vocab = shared_vocab or shared_embeddings
        if frozen_output_bias and not output_bias:
            raise ValueError("frozen_output_bias needs output_bias")
        if embedding_aliases and not (shared_vocab and tie_embeddings):
            raise ValueError("embedding_aliases needs one embedding matrix (shared and tied)")
        if shared_vocab and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"shared_vocab with sizes {src_vocab_size} != {tgt_vocab_size}")
        self.pad_id = pad_id
        self.suppress_start = suppress_start
        self.d_model, self.heads = d_model, heads
        self.embed_scale = math.sqrt(d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model, padding_idx=pad_id)
        if tie_embeddings and shared_vocab:
            self.src_embed = self.tgt_embed
        else:
            self.src_embed = nn.Embedding(src_vocab_size, d_model, padding_idx=pad_id)
        positions = (max_positions, d_model, learned_positions, position_style)
        self.src_pos = PositionalEmbedding(*positions)
        self.tgt_pos = PositionalEmbedding(*positions)
        self.dropout = Dropout(dropout)
        sizes = (d_model, heads, d_ff, dropout, attn_dropout, act_dropout, norm_first, activation)
        self.encoder_layers = nn.ModuleList(EncoderLayer(*sizes) for _ in range(enc_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(*sizes) for _ in range(dec_layers))
        self.enc_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.out_proj = nn.Linear(d_model, tgt_vocab_size, bias=output_bias)
        self._init_weights()
        if tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight
        if frozen_output_bias:  # as a buffer would be, but where every loss path reads it
            self.out_proj.bias.requires_grad_(False)
        # the embedding row each id reads (embedding_aliases): an imported model whose one row
        # is two of our ids' keeps them one, whatever training does to the row never read
        rows = torch.arange(tgt_vocab_size) if embedding_aliases else None
        self.embed_rows: Tensor | None
        self.register_buffer("embed_rows", rows)

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, self.d_model**-0.5)
                if module.padding_idx is not None:
                    nn.init.zeros_(module.weight[module.padding_idx])

    def _embed(
        self, tokens: Tensor, embed: nn.Embedding, pos: PositionalEmbedding, start: int
    ) -> Tensor:
        """Tokens (B, T) at positions start.. -> dropout(scaled embedding + position) (B, T, D)."""
        if self.embed_rows is not None:
            tokens = self.embed_rows[tokens]
        x = embed(tokens) * self.embed_scale + pos(start, tokens.size(1))  # (B, T, D)
        return self.dropout(x)

    def _encode(
        self, src: Tensor, src_lens: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """Memory (B, S, D), the real source tokens (B, S) (False = padding), per-layer
        self-attention weights (B, H, S, S)."""
        valid = lengths_to_mask(src_lens, src.size(1))  # (B, S)
        x = self._embed(src, self.src_embed, self.src_pos, 0)  # (B, S, D)
        weights = []
        for layer in self.encoder_layers:
            x, w = layer(x, valid, need_weights)  # (B, S, D)
            weights.append(w)
        return self.enc_norm(x), valid, weights

    @property
    def max_positions(self) -> int:
        """The size of the position tables (source and target alike)."""
        return self.tgt_pos.max_positions

    def encode(self, src: Tensor, src_lens: Tensor) -> DecoderState:
        """Encode once and project the memory for every decoder layer's cross-attention."""
        memory, valid, _ = self._encode(src, src_lens)  # (B, S, D), (B, S)
        caches, crosses = [], []
        for layer in self.decoder_layers:
            cross = layer.cross_attn.project_kv(memory, memory)  # (B, H, S, dk) each
            crosses.append(cross)
            caches.append({name: t[:, :, :0] for name, t in cross.items()})  # t = 0
        # the projected memory and its mask: one row per sentence, whatever the hypotheses
        return DecoderState({"self": caches}, {"memory_valid": valid, "cross": crosses})

    def decode_step(
        self, tokens: Tensor, state: DecoderState
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """tokens (N,) -> logits (N, V), new state, last layer's head-averaged cross-attn (N, S)."""
        x = self._embed(tokens[:, None], self.tgt_embed, self.tgt_pos, state.step)  # (N, 1, D)
        last = len(self.decoder_layers) - 1
        sentences = state.sentences
        new_caches, cross = [], None
        for i, (layer, cache, cross_cache) in enumerate(
            zip(self.decoder_layers, state.rows["self"], sentences["cross"], strict=True)
        ):
            self_cache = dict(cache)  # a new dict: the old state stays valid
            x, _, cross = layer(  # x (N, 1, D)
                x, None, sentences["memory_valid"], self_cache, cross_cache,
                need_weights=i == last, group=state.group,
            )  # fmt: skip
            new_caches.append(self_cache)
        logits = self.out_proj(self.dec_norm(x)).squeeze(1)  # (N, V)
        return logits, state.next({"self": new_caches}), cross[:, :, 0].mean(dim=1)  # (N, S)

    def _teacher_forced(
        self,
        src: Tensor,
        src_lens: Tensor,
        tgt_in: Tensor,
        need_weights: bool,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """Features (B, T, D), or (N, D) at ``positions``, and the attention weights."""
        memory, valid, enc_self = self._encode(src, src_lens, need_weights)  # (B, S, D)
        x = self._embed(tgt_in, self.tgt_embed, self.tgt_pos, 0)  # (B, T, D)
        dec_self, cross = [], []
        for layer in self.decoder_layers:
            x, sw, cw = layer(x, memory, valid, need_weights=need_weights)  # (B, T, D)
            dec_self.append(sw)
            cross.append(cw)
        if positions is not None:
            x = x.flatten(0, 1).index_select(0, positions)  # (N, D)
        return self.dec_norm(x), {"enc_self": enc_self, "dec_self": dec_self, "cross": cross}

    def features(
        self,
        src: Tensor,
        src_lens: Tensor,
        tgt_in: Tensor,
        positions: Tensor | None = None,
        src_lens_host: np.ndarray | None = None,
    ) -> Tensor:
        """Teacher-forced features (B, T, D), or (N, D) at flat ``positions`` (N,); the masks
        come from ``src_lens`` on the device (``src_lens_host`` is not needed)."""
        features, _ = self._teacher_forced(
            src, src_lens, tgt_in, need_weights=False, positions=positions
        )
        return features

    def forward_with_attention(
        self, src: Tensor, src_lens: Tensor, tgt_in: Tensor
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """Logits (B, T, V); "enc_self" (B, H, S, S), "dec_self" (B, H, T, T), "cross"
        (B, H, T, S), one tensor per layer."""
        features, weights = self._teacher_forced(src, src_lens, tgt_in, need_weights=True)
        return self.out_proj(features), weights
