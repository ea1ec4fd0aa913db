"""Model properties: shapes, padding invariance, incremental == full, state selection,
reference-layer equivalence, tied embeddings, attention weights, overfitting a tiny batch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor, nn

from nmt.config import GRUBahdanauConfig, TransformerConfig, to_container
from nmt.models.base import Seq2Seq, lengths_to_mask, map_state
from nmt.models.registry import create_model
from nmt.models.transformer import DecoderLayer, EncoderLayer

from .helpers import compose_config

PAD, BOS, EOS = 0, 2, 3
SRC_V, TGT_V = 13, 11

GRU_TINY = dict(emb_dim=8, hidden_dim=12, enc_layers=2, dec_layers=2, attn_dim=10, dropout=0.1)
TRANSFORMER_TINY = dict(
    d_model=16,
    heads=2,
    d_ff=32,
    enc_layers=2,
    dec_layers=2,
    max_positions=64,
    dropout=0.1,
    attn_dropout=0.1,
    act_dropout=0.1,
)

VARIANTS = {
    "gru-additive": (GRUBahdanauConfig, {"attention": "additive"}),
    "gru-dot-unidir": (GRUBahdanauConfig, {"attention": "dot", "bidirectional": False}),
    "gru-general-tied": (GRUBahdanauConfig, {"attention": "general", "tie_embeddings": True}),
    "gru-scaled-dot-unidir": (
        GRUBahdanauConfig,
        {"attention": "scaled_dot", "bidirectional": False, "dec_layers": 1},
    ),
    "transformer-prenorm": (TransformerConfig, {"norm_first": True}),
    "transformer-postnorm-learned": (
        TransformerConfig,
        {"norm_first": False, "learned_positions": True},
    ),
    "transformer-untied": (TransformerConfig, {"tie_embeddings": False}),
}


def build(name: str, shared_vocab: bool = False) -> Seq2Seq:
    """A tiny model built the way training builds it, from the config schema."""
    schema, overrides = VARIANTS[name]
    tiny = GRU_TINY if schema is GRUBahdanauConfig else TRANSFORMER_TINY
    cfg = OmegaConf.structured(schema(**{**tiny, **overrides}))
    src_v = TGT_V if shared_vocab else SRC_V
    return create_model(
        cfg, src_vocab_size=src_v, tgt_vocab_size=TGT_V, pad_id=PAD, shared_vocab=shared_vocab
    )


def random_batch(
    src_lens: list[int], tgt_lens: list[int], seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """src (B, S) ending in EOS, src_lens (B,), tgt_in (B, T) starting with BOS, tgt_lens (B,)."""
    gen = torch.Generator().manual_seed(seed)
    src_len, tgt_len = torch.tensor(src_lens), torch.tensor(tgt_lens)
    src = torch.randint(4, TGT_V, (len(src_lens), max(src_lens)), generator=gen)  # (B, S)
    src[torch.arange(len(src_lens)), src_len - 1] = EOS
    src = src.masked_fill(~lengths_to_mask(src_len), PAD)  # (B, S)
    tgt = torch.randint(4, TGT_V, (len(tgt_lens), max(tgt_lens)), generator=gen)  # (B, T)
    tgt[:, 0] = BOS
    tgt = tgt.masked_fill(~lengths_to_mask(tgt_len), PAD)  # (B, T)
    return src, src_len, tgt, tgt_len


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _decode_all(model: Seq2Seq, src: Tensor, src_lens: Tensor, tgt_in: Tensor):
    """Step-by-step logits (B, T, V) and attention (B, T, S) over the given target prefix."""
    state = model.encode(src, src_lens)
    logits, attn = [], []
    for t in range(tgt_in.size(1)):
        step_logits, state, weights = model.decode_step(tgt_in[:, t], state)
        logits.append(step_logits)
        attn.append(weights)
    return torch.stack(logits, 1), torch.stack(attn, 1)


@pytest.mark.parametrize("name", VARIANTS)
def test_output_shapes(name: str) -> None:
    model = build(name)
    src, src_lens, tgt, _ = random_batch([5, 3, 4], [4, 6, 2])
    assert model(src, src_lens, tgt).shape == (3, 6, TGT_V)
    state = model.encode(src, src_lens)
    logits, state, weights = model.decode_step(tgt[:, 0], state)
    assert logits.shape == (3, TGT_V) and weights.shape == (3, 5)


@pytest.mark.parametrize("name", VARIANTS)
@torch.no_grad()
def test_padding_changes_no_real_logits(name: str) -> None:
    model = build(name).eval()
    src, src_lens, tgt, tgt_lens = random_batch([6, 3, 4], [5, 2, 4])
    before = model(src, src_lens, tgt)
    noisy_src = torch.where(lengths_to_mask(src_lens), src, torch.randint_like(src, 4, TGT_V))
    noisy_tgt = torch.where(lengths_to_mask(tgt_lens), tgt, torch.randint_like(tgt, 4, TGT_V))
    after = model(noisy_src, src_lens, noisy_tgt)
    real = lengths_to_mask(tgt_lens)  # (B, T)
    assert torch.allclose(before[real], after[real], atol=1e-6)


@pytest.mark.parametrize("name", VARIANTS)
@torch.no_grad()
def test_projecting_only_real_positions_equals_the_full_logits(name: str) -> None:
    """forward(..., positions) is the full forward's logits at those flat positions, and the
    training loss over them equals cross-entropy over the padded grid with PAD ignored."""
    model = build(name).eval()
    src, src_lens, tgt, tgt_lens = random_batch([6, 3, 4], [5, 2, 4], seed=2)
    full = model(src, src_lens, tgt)  # (B, T, V)
    real = lengths_to_mask(tgt_lens)  # (B, T)
    positions = torch.nonzero(real.flatten()).squeeze(1)  # (N,)
    picked = model(src, src_lens, tgt, positions)  # (N, V)
    assert picked.shape == (int(real.sum()), TGT_V)
    torch.testing.assert_close(picked, full[real], atol=1e-6, rtol=1e-5)
    gold = torch.randint(4, TGT_V, tgt.shape).masked_fill(~real, PAD)  # (B, T)
    grid = F.cross_entropy(
        full.flatten(0, 1), gold.flatten(), ignore_index=PAD, label_smoothing=0.1, reduction="sum"
    )
    picked_loss = F.cross_entropy(picked, gold[real], label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(picked_loss, grid)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_loss_path_equals_cross_entropy_of_the_logits(name: str) -> None:
    """forward(..., positions, targets) gives the summed loss that cross-entropy of
    forward(..., positions) gives, and the same gradient for every parameter."""
    model = build(name).eval()  # no dropout: both passes see the same network
    src, src_lens, tgt, tgt_lens = random_batch([6, 3, 4], [5, 2, 4], seed=3)
    real = lengths_to_mask(tgt_lens)  # (B, T)
    positions = torch.nonzero(real.flatten()).squeeze(1)  # (N,)
    gold = torch.randint(4, TGT_V, positions.shape)  # (N,)
    logits = model(src, src_lens, tgt, positions)  # (N, V)
    want = F.cross_entropy(logits.float(), gold, label_smoothing=0.1, reduction="sum")
    want_grads = torch.autograd.grad(want, list(model.parameters()), allow_unused=True)
    got = model(src, src_lens, tgt, positions, gold, 0.1)
    got_grads = torch.autograd.grad(got, list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    for g_got, g_want in zip(got_grads, want_grads, strict=True):
        assert (g_got is None) == (g_want is None)
        if g_got is not None:
            torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="targets need positions"):
        model(src, src_lens, tgt, None, gold)


@pytest.mark.parametrize("name", VARIANTS)
@torch.no_grad()
def test_incremental_decoding_equals_forward(name: str) -> None:
    model = build(name).eval()
    src, src_lens, tgt, _ = random_batch([6, 3, 5], [7, 4, 7], seed=1)
    full, attn = model.forward_with_attention(src, src_lens, tgt)
    steps, step_attn = _decode_all(model, src, src_lens, tgt)
    assert torch.allclose(steps, full, atol=1e-5)
    cross = attn["cross"][-1].mean(dim=1)  # (B, T, S): last layer, heads averaged
    assert torch.allclose(step_attn, cross, atol=1e-6)


@pytest.mark.parametrize("name", VARIANTS)
@torch.no_grad()
def test_select_reorders_repeats_and_filters_rows(name: str) -> None:
    model = build(name).eval()
    src, src_lens, tgt, _ = random_batch([6, 3, 5], [4, 4, 4], seed=2)
    state = model.encode(src, src_lens)
    for t in range(2):
        _, state, _ = model.decode_step(tgt[:, t], state)
    expected, _, _ = model.decode_step(tgt[:, 2], state)  # (B, V)
    for index in ([2, 0, 1], [1, 1, 0, 0], [2]):
        rows = torch.tensor(index)
        chosen = state.select(rows, sentences=rows)  # every row with its sentence's copy
        logits, _, _ = model.decode_step(tgt[rows, 2], chosen)
        assert torch.allclose(logits, expected[rows], atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
@torch.no_grad()
def test_beams_sharing_their_sentence_state_equal_beams_with_copies(name: str) -> None:
    """Beam search keeps one copy of each sentence's encoder state for all its beams: the
    grouped decode step gives the logits and attention of rows that each hold a copy."""
    model = build(name).eval()
    src, src_lens, tgt, _ = random_batch([6, 3, 5], [4, 4, 4], seed=3)
    state = model.encode(src, src_lens)
    _, state, _ = model.decode_step(tgt[:, 0], state)
    beams = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])  # 3 beams per sentence, grouped
    shared = state.select(beams, group=3)
    copied = state.select(beams, sentences=beams)  # every row with its own copy, group 1
    pairs = zip(_tensors(shared.sentences), _tensors(state.sentences), strict=True)
    assert all(a is b for a, b in pairs)  # not copied
    assert _tensors(copied.sentences)[0].size(0) == 9 and copied.group == 1
    tokens = torch.tensor([4, 5, 6, 7, 8, 9, 4, 5, 6])
    for _ in range(3):  # several steps: the self-attention caches grow per beam
        a, shared, attn_a = model.decode_step(tokens, shared)
        b, copied, attn_b = model.decode_step(tokens, copied)
        assert torch.allclose(a, b, atol=1e-5) and torch.allclose(attn_a, attn_b, atol=1e-6)
        tokens = a.argmax(dim=-1)
    # dropping sentence 1 keeps the shared rows of sentences 0 and 2
    kept = shared.select(torch.tensor([0, 1, 2, 6, 7, 8]), sentences=torch.tensor([0, 2]))
    logits, _, _ = model.decode_step(tokens[[0, 1, 2, 6, 7, 8]], kept)
    expected, _, _ = model.decode_step(tokens, shared)
    assert torch.allclose(logits, expected[[0, 1, 2, 6, 7, 8]], atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
@torch.no_grad()
def test_the_group_size_is_never_guessed_from_row_counts(name: str) -> None:
    """A state whose group size does not match its rows is refused, not decoded."""
    model = build(name).eval()
    src, src_lens, tgt, _ = random_batch([6, 3, 5], [4, 4, 4], seed=4)
    state = model.encode(src, src_lens).select(torch.tensor([0, 0, 1, 1, 2, 2]), group=2)
    model.decode_step(tgt[[0, 0, 1, 1, 2, 2], 0], state)  # 2 rows per sentence: fine
    with pytest.raises(ValueError, match="group=1|1 per sentence"):
        model.decode_step(tgt[[0, 0, 1, 1, 2, 2], 0], replace(state, group=1))
    with pytest.raises(ValueError, match="3 per sentence|3 single-position queries"):
        model.decode_step(tgt[[0, 0, 1, 1, 2, 2], 0], replace(state, group=3))


def _tensors(state) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_state(state, lambda t: found.append(t) or t)
    return found


@pytest.mark.parametrize("name", VARIANTS)
@torch.no_grad()
def test_attention_rows_sum_to_one_and_skip_padding(name: str) -> None:
    model = build(name).eval()
    src, src_lens, tgt, _ = random_batch([6, 2, 4], [3, 5, 2])
    _, attn = model.forward_with_attention(src, src_lens, tgt)
    src_pad = ~lengths_to_mask(src_lens)[:, None, None, :]  # (B, 1, 1, S)
    for kind, layers in attn.items():
        for weights in layers:
            assert weights.dim() == 4
            assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5)
            if kind in ("cross", "enc_self"):
                assert (weights.masked_select(src_pad) == 0).all()
            else:  # decoder self-attention: nothing from the future
                assert (weights.triu(diagonal=1) == 0).all()
    expected_kinds = {"cross"} if "gru" in name else {"cross", "enc_self", "dec_self"}
    assert set(attn) == expected_kinds


# -- tied embeddings --------------------------------------------------------------------------


def _same(a: Tensor, b: Tensor) -> bool:
    return a.data_ptr() == b.data_ptr()


def test_transformer_ties_all_three_with_shared_vocab() -> None:
    model = build("transformer-prenorm", shared_vocab=True)
    assert _same(model.out_proj.weight, model.tgt_embed.weight)
    assert _same(model.src_embed.weight, model.tgt_embed.weight)
    separate = build("transformer-prenorm", shared_vocab=False)
    assert _same(separate.out_proj.weight, separate.tgt_embed.weight)
    assert not _same(separate.src_embed.weight, separate.tgt_embed.weight)
    untied = build("transformer-untied", shared_vocab=True)
    assert not _same(untied.out_proj.weight, untied.tgt_embed.weight)
    n_tied = sum(p.numel() for p in model.parameters())
    assert n_tied == untied.num_parameters() - 2 * TGT_V * TRANSFORMER_TINY["d_model"]


def test_gru_ties_output_projection() -> None:
    model = build("gru-general-tied", shared_vocab=True)
    assert _same(model.out_proj.weight, model.tgt_embed.weight)
    assert _same(model.src_embed.weight, model.tgt_embed.weight)
    untied = build("gru-additive", shared_vocab=True)
    assert not _same(untied.out_proj.weight, untied.tgt_embed.weight)


@pytest.mark.parametrize("attention", ["dot", "scaled_dot"])
def test_gru_refuses_a_parameter_free_dot_score_over_a_bidirectional_encoder(attention) -> None:
    """The keys (2 x hidden_dim) are not of the query's size (hidden_dim): only ``general``
    learns the map between them, and the parameter-free scores say so instead of adding one."""
    tiny = GRUBahdanauConfig(**{**GRU_TINY, "attention": attention, "bidirectional": True})
    with pytest.raises(ValueError, match=rf"model\.attention={attention} .* 12 .* 24 .*general"):
        create_model(OmegaConf.structured(tiny), src_vocab_size=SRC_V, tgt_vocab_size=TGT_V)
    general = OmegaConf.structured(replace(tiny, attention="general"))
    model = create_model(general, src_vocab_size=SRC_V, tgt_vocab_size=TGT_V)
    assert model.attention.key_proj.weight.shape == (12, 24)


# -- equivalence with torch's reference layers ------------------------------------------------


def _copy_common(mine: nn.Module, ref: nn.Module, norms: int) -> None:
    """Copy self-attention, feed-forward and layer norms (made non-trivial first) into mine."""
    norm_names = [f"norm{i}" for i in range(1, norms + 1)]
    for name in norm_names:
        nn.init.normal_(getattr(ref, name).weight)
        nn.init.normal_(getattr(ref, name).bias)
    for name in ["linear1", "linear2", *norm_names]:
        getattr(mine, name).load_state_dict(getattr(ref, name).state_dict())
    mine.self_attn.load_torch_weights(ref.self_attn)


@pytest.mark.parametrize("norm_first", [True, False])
@torch.no_grad()
def test_encoder_layer_matches_torch(norm_first: bool) -> None:
    ref = nn.TransformerEncoderLayer(
        16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    mine = EncoderLayer(16, 2, 32, dropout=0.0, norm_first=norm_first)
    _copy_common(mine, ref, norms=2)
    x = torch.randn(3, 5, 16)  # (B, S, D)
    real = lengths_to_mask(torch.tensor([5, 2, 4]))  # (B, S) True = a real token
    expected = ref.eval()(x, src_key_padding_mask=~real)  # torch's sense: True = padding
    out, _ = mine.eval()(x, real)
    assert torch.allclose(out[real], expected[real], atol=1e-5)


@pytest.mark.parametrize("norm_first", [True, False])
@torch.no_grad()
def test_decoder_layer_matches_torch(norm_first: bool) -> None:
    ref = nn.TransformerDecoderLayer(
        16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    mine = DecoderLayer(16, 2, 32, dropout=0.0, norm_first=norm_first)
    _copy_common(mine, ref, norms=3)
    mine.cross_attn.load_torch_weights(ref.multihead_attn)
    x, memory = torch.randn(3, 4, 16), torch.randn(3, 6, 16)  # (B, T, D), (B, S, D)
    real = lengths_to_mask(torch.tensor([6, 2, 5]))  # (B, S) True = a real token
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)  # (T, T) True = not allowed
    expected = ref.eval()(x, memory, tgt_mask=future, memory_key_padding_mask=~real)
    out, _, _ = mine.eval()(x, memory, real)
    assert torch.allclose(out, expected, atol=1e-5)


# -- learning ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "lr"), [("gru-additive", 2e-2), ("transformer-prenorm", 1e-2)])
def test_tiny_model_overfits_a_few_pairs(name: str, lr: float) -> None:
    model = build(name).train()
    src, src_lens, tgt, tgt_lens = random_batch([6, 5, 4, 6], [6, 4, 5, 3], seed=3)
    tgt_out = torch.cat([tgt[:, 1:], torch.zeros_like(tgt[:, :1])], dim=1)  # (B, T)
    tgt_out[torch.arange(4), tgt_lens - 1] = EOS
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(60):
        logits = model(src, src_lens, tgt)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, TGT_V), tgt_out.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0], losses[::10]


@pytest.mark.parametrize(
    ("name", "formula"),
    [("relu", torch.relu), ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / 2**0.5))),
     ("swish", lambda h: h * torch.sigmoid(h))],
)  # fmt: skip
def test_the_feed_forward_activation_is_the_one_configured(name, formula) -> None:
    torch.manual_seed(0)
    layer = EncoderLayer(8, 2, 16, dropout=0.0, activation=name)
    x = torch.randn(2, 3, 8)
    want = layer.linear2(formula(layer.linear1(x)))
    torch.testing.assert_close(layer.feed_forward(x), want, rtol=1e-5, atol=1e-6)


def test_the_default_transformer_has_relu_and_no_output_bias() -> None:
    cfg = compose_config("train", [])
    model = create_model(to_container(cfg.model), src_vocab_size=30, tgt_vocab_size=30)
    assert model.out_proj.bias is None
    assert {layer.activation for layer in model.encoder_layers} == {"relu"}
    biased = create_model({**to_container(cfg.model), "output_bias": True, "activation": "swish"},
                          src_vocab_size=30, tgt_vocab_size=30)  # fmt: skip
    assert biased.out_proj.bias is not None and biased.decoder_layers[0].activation == "swish"


def test_an_unknown_activation_is_refused_naming_the_option() -> None:
    with pytest.raises(Exception, match="model.activation"):
        compose_config("train", ["model.activation=tanh"])


def test_fairseq_positions_are_transformers_m2m100_table() -> None:
    """model.position_style=fairseq: the M2M100/NLLB sinusoid, bit for bit, in our layout."""
    from transformers.models.m2m_100.modeling_m2m_100 import (
        M2M100SinusoidalPositionalEmbedding as M2M100Positions,
    )

    from nmt.models.transformer import sinusoidal_positions
    from nmt.store.hf_names import permutation

    for d in (16, 1024):
        theirs = M2M100Positions.get_embedding(302, d, padding_idx=1)  # rows from position 0
        ours = sinusoidal_positions(300, d, "fairseq")[:, permutation(d)]
        assert torch.equal(ours, theirs[2:])  # fairseq's position t is row t + 2
    model = create_model({**to_container(compose_config("train", []).model),
                          "position_style": "fairseq", "max_positions": 64},
                         src_vocab_size=30, tgt_vocab_size=30)  # fmt: skip
    assert torch.equal(model.src_pos(3, 5), sinusoidal_positions(8, model.d_model, "fairseq")[3:])
