"""GRU encoder-decoder with attention (Bahdanau et al. 2015).

Encoder: a (bi)directional multi-layer GRU over the packed source; its outputs h_1..h_S, both
directions concatenated (C = hidden_dim * directions), are the attention keys and values.
A bridge, tanh(W [h_fwd_last; h_bwd_first] + b), gives every decoder layer its initial state.

Decoder step t (one code path for teacher forcing and incremental decoding):

* c_t = attention(query = s_{t-1} of the top layer, keys = h, values = h, the real source
  tokens);
* s_t = GRU cells over [E y_{t-1}; c_t];
* logits_t = W_out dropout(W_pre [s_t; c_t; E y_{t-1}] + b_pre) + b_out, a linear pre-output
  layer of size emb_dim (no tanh/maxout), so W_out can be tied to the target embedding.

Decoding state (a :class:`~nmt.models.base.DecoderState`), for B sentences with
G = ``state.group`` consecutive hypothesis rows each (N = G * B)::

    rows = {"hidden": [(N, H) per decoder layer]}  # s_{t-1} of every hypothesis
    sentences = {"memory": (B, S, C),              # encoder outputs h, the attention values
                 "keys": (B, S, *),                # h projected once by the scoring module
                 "src_valid": (B, S) bool}         # True = real source token, False = pad

The G query rows of a sentence attend to its one row of the per-sentence tensors.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.models.attention import make_score
from nmt.models.base import DecoderState, Seq2Seq, host_to_device, lengths_to_mask
from nmt.models.compile_exclusion import compile_excluded
from nmt.models.dropout import Dropout


class GRUBahdanau(Seq2Seq):
    """Bahdanau-style RNN translation model; the constructor takes GRUBahdanauConfig's fields.

    ``tie_embeddings``: the output projection shares the target embedding matrix (the
    pre-output layer has size emb_dim, so the shapes always agree); with ``shared_vocab``
    the source embedding is that same matrix too. Dropout applies to the embeddings, the
    encoder outputs, between stacked GRU layers and to the pre-output layer.
    """

    def __init__(
        self,
        *,
        emb_dim: int,
        hidden_dim: int,
        enc_layers: int,
        dec_layers: int,
        bidirectional: bool,
        dropout: float,
        attention: str,
        attn_dim: int,
        tie_embeddings: bool,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int = 0,
        shared_vocab: bool = False,
    ) -> None:
        super().__init__()
        if shared_vocab and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"shared_vocab with sizes {src_vocab_size} != {tgt_vocab_size}")
        self.pad_id = pad_id
        self.enc_layers, self.dec_layers, self.hidden_dim = enc_layers, dec_layers, hidden_dim
        self.directions = 2 if bidirectional else 1
        enc_dim = hidden_dim * self.directions
        self.tgt_embed = nn.Embedding(tgt_vocab_size, emb_dim, padding_idx=pad_id)
        if tie_embeddings and shared_vocab:
            self.src_embed = self.tgt_embed
        else:
            self.src_embed = nn.Embedding(src_vocab_size, emb_dim, padding_idx=pad_id)
        self.encoder = nn.GRU(
            emb_dim,
            hidden_dim,
            enc_layers,
            batch_first=True,
            dropout=dropout if enc_layers > 1 else 0.0,
            bidirectional=bidirectional,
        )
        self.bridge = nn.Linear(enc_dim, dec_layers * hidden_dim)
        self.attention = make_score(attention, hidden_dim, enc_dim, attn_dim)
        self.cells = nn.ModuleList(
            nn.GRUCell(emb_dim + enc_dim if i == 0 else hidden_dim, hidden_dim)
            for i in range(dec_layers)
        )
        self.pre_output = nn.Linear(hidden_dim + enc_dim + emb_dim, emb_dim)
        self.out_proj = nn.Linear(emb_dim, tgt_vocab_size)
        self.dropout = Dropout(dropout)
        self._init_embeddings()
        if tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight

    def _init_embeddings(self) -> None:
        """Embeddings uniform(-0.1, 0.1), pad row zero; other weights keep torch's defaults."""
        for embed in (self.src_embed, self.tgt_embed):
            nn.init.uniform_(embed.weight, -0.1, 0.1)
            with torch.no_grad():
                embed.weight[self.pad_id].zero_()

    # -- encoder -----------------------------------------------------------------------------

    def _encode(
        self, src: Tensor, src_lens: Tensor, src_lens_host: np.ndarray | None = None
    ) -> tuple[Tensor, Tensor]:
        """src (B, S), src_lens (B,) -> outputs (B, S, C) (zero at padding), final state (B, C).

        The final state joins the top layer's last forward state and first backward state.
        Packing needs the lengths on the host: ``src_lens_host`` where given, else a copy of
        ``src_lens`` (the host waits for the device then). The rows are sorted longest first
        here, as ``pack_padded_sequence(enforce_sorted=False)`` sorts them, and put back in
        order after the encoder; done by that function, the sorting and ``pad_packed_sequence``
        would each make the host wait for the device.
        """
        b, s = src.shape
        emb = self.dropout(self.src_embed(src))  # (B, S, E)
        host = torch.as_tensor(src_lens.cpu() if src_lens_host is None else src_lens_host)
        lengths, order = torch.sort(host, descending=True)  # (B,), (B,) on the host
        restore = torch.empty_like(order).scatter_(0, order, torch.arange(b))  # (B,)
        order, restore = host_to_device(torch.stack([order, restore]), src.device)  # (B,) each
        packed = pack_padded_sequence(emb.index_select(0, order), lengths, batch_first=True)
        out, h_n = self.encoder(packed)  # h_n (L * dirs, B, H), longest first
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=s)  # (B, S, C)
        out, h_n = out.index_select(0, restore), h_n.index_select(1, restore)  # input order
        top = h_n.view(self.enc_layers, self.directions, b, self.hidden_dim)[-1]  # (dirs, B, H)
        final = top.transpose(0, 1).reshape(b, -1)  # (B, C)
        return self.dropout(out), final

    def _bridge(self, final: Tensor) -> list[Tensor]:
        """Encoder final state (B, C) -> initial state of each decoder layer, [(B, H)]."""
        hidden = torch.tanh(self.bridge(final))  # (B, L * H)
        return list(hidden.view(final.size(0), self.dec_layers, self.hidden_dim).unbind(1))

    def encode(
        self, src: Tensor, src_lens: Tensor, src_lens_host: np.ndarray | None = None
    ) -> DecoderState:
        """Encode once; the attention keys are projected here, once per source.
        ``src_lens_host``: as for :meth:`~nmt.models.base.Seq2Seq.features`."""
        memory, final = self._encode(src, src_lens, src_lens_host)  # (B, S, C), (B, C)
        sentences = {  # one row per sentence, whatever the number of hypotheses
            "memory": memory,
            "keys": self.attention.project_keys(memory),  # (B, S, *)
            "src_valid": lengths_to_mask(src_lens, src.size(1)),  # (B, S)
        }
        return DecoderState({"hidden": self._bridge(final)}, sentences)

    # -- decoder -----------------------------------------------------------------------------

    def _step(self, emb: Tensor, state: DecoderState) -> tuple[list[Tensor], Tensor, Tensor]:
        """Embedded previous tokens (N, E) -> hidden [(N, H)], context (N, C), weights (N, S)."""
        hidden, sentences = state.rows["hidden"], state.sentences
        context, weights = self.attention(
            hidden[-1], sentences["keys"], sentences["memory"], sentences["src_valid"], state.group
        )  # (N, C), (N, S): N hypotheses, G per sentence
        x = torch.cat([emb, context], dim=-1)  # (N, E + C)
        new_hidden: list[Tensor] = []
        for cell, h in zip(self.cells, hidden, strict=True):
            if new_hidden:
                x = self.dropout(new_hidden[-1])  # (N, H), the layer below's output
            new_hidden.append(cell(x, h))  # (N, H)
        return new_hidden, context, weights

    def _features(self, top: Tensor, context: Tensor, emb: Tensor) -> Tensor:
        """s_t (..., H), c_t (..., C), E y_{t-1} (..., E) -> the features ``out_proj`` turns
        into logits (..., E)."""
        pre = self.pre_output(torch.cat([top, context, emb], dim=-1))  # (..., E)
        return self.dropout(pre)

    def decode_step(
        self, tokens: Tensor, state: DecoderState
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """tokens (B,) -> logits (B, V), new state, attention weights (B, S)."""
        emb = self.dropout(self.tgt_embed(tokens))  # (B, E)
        hidden, context, weights = self._step(emb, state)
        logits = self.out_proj(self._features(hidden[-1], context, emb))  # (B, V)
        return logits, state.next({"hidden": hidden}), weights

    @compile_excluded
    def _recur(self, emb: Tensor, state: DecoderState) -> tuple[Tensor, Tensor, Tensor]:
        """The decoder's steps over the embedded target (B, T, E): the top layer's states
        (B, T, H), the contexts (B, T, C) and the attention weights (B, T, S).

        ``torch.compile`` leaves the loop out of its graphs and runs it as it is: traced, it
        would be unrolled into a new graph for every target length T."""
        tops, contexts, weights = [], [], []
        for t in range(emb.size(1)):
            hidden, context, w = self._step(emb[:, t], state)  # (B, H) x L, (B, C), (B, S)
            state = state.next({"hidden": hidden})
            tops.append(hidden[-1])
            contexts.append(context)
            weights.append(w)
        return torch.stack(tops, dim=1), torch.stack(contexts, dim=1), torch.stack(weights, dim=1)

    def _teacher_forced(
        self, state: DecoderState, tgt_in: Tensor, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Features (B, T, E) and attention weights (B, T, S) of the encoded source ``state``;
        the features are computed once over all steps after the recurrent loop (at flat
        ``positions`` only, if given: (N, E)), so that the vocabulary projection runs once too."""
        emb = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E)
        top, context, weights = self._recur(emb, state)  # (B, T, H), (B, T, C), (B, T, S)
        if positions is not None:  # (B, T, *) -> (N, *)
            top, context, emb = (
                x.flatten(0, 1).index_select(0, positions) for x in (top, context, emb)
            )
        return self._features(top, context, emb), weights

    def features(
        self,
        src: Tensor,
        src_lens: Tensor,
        tgt_in: Tensor,
        positions: Tensor | None = None,
        src_lens_host: np.ndarray | None = None,
    ) -> Tensor:
        """Teacher-forced features (B, T, E), or (N, E) at flat ``positions`` (N,)."""
        return self._teacher_forced(self.encode(src, src_lens, src_lens_host), tgt_in, positions)[0]

    def forward_with_attention(
        self, src: Tensor, src_lens: Tensor, tgt_in: Tensor
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """Logits (B, T, V) and {"cross": [alignment (B, 1, T, S)]}."""
        state = self.encode(src, src_lens)
        features, weights = self._teacher_forced(state, tgt_in)  # (B, T, E), (B, T, S)
        return self.out_proj(features), {"cross": [weights.unsqueeze(1)]}  # (B, 1, T, S)
