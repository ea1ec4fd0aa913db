"""Attention building blocks: masked softmax, the scoring functions, multi-head attention."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from nmt.models.attention import (
    AdditiveScore,
    DotScore,
    GeneralScore,
    MultiHeadAttention,
    ScaledDotScore,
    dot_scores,
    make_score,
    masked_softmax,
    scaled_dot_scores,
)

D, H = 8, 2


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# -- masked softmax ---------------------------------------------------------------------------


def test_masked_softmax_rows_sum_to_one_and_masked_get_zero() -> None:
    scores = torch.randn(3, 5)  # (B, S)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 0, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    weights = masked_softmax(scores, mask)  # (B, S)
    assert torch.allclose(weights.sum(-1), torch.ones(3))
    assert (weights[~mask] == 0).all()
    expected = torch.softmax(scores[0, :3], dim=0)  # (3,)
    assert torch.allclose(weights[0, :3], expected)


def test_masked_softmax_fully_masked_row_is_zero_not_nan() -> None:
    scores = torch.randn(2, 4, requires_grad=True)  # (B, S)
    mask = torch.tensor([[True, True, False, False], [False] * 4])
    weights = masked_softmax(scores, mask)  # (B, S)
    assert torch.equal(weights[1], torch.zeros(4))
    weights.sum().backward()
    assert not torch.isnan(scores.grad).any()


def test_masked_softmax_broadcasts_mask() -> None:
    scores = torch.randn(2, 3, 4, 5)  # (B, H, Tq, Tk)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)[:, None, None]
    weights = masked_softmax(scores, mask)  # (B, H, Tq, Tk)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 4))
    assert (weights[0, ..., 2:] == 0).all()


# -- scoring functions on hand-computed examples ----------------------------------------------

QUERY = [1.0, -1.0]
KEYS = [[1.0, 2.0], [0.5, -1.0], [7.0, 7.0]]  # the last key is padding
VALUES = [[1.0, 0.0, 2.0], [0.0, 1.0, -1.0], [100.0, 100.0, 100.0]]
VALID = [True, True, False]  # the real keys


def _expected(scores: list[float]) -> tuple[list[float], list[float]]:
    """Softmax over the two real keys and the context they give, in plain Python."""
    exps = [math.exp(s) for s in scores[:2]]
    weights = [e / sum(exps) for e in exps] + [0.0]
    context = [sum(w * v[i] for w, v in zip(weights, VALUES, strict=True)) for i in range(3)]
    return weights, context


def _run(module: nn.Module) -> tuple[Tensor, Tensor]:
    query = torch.tensor([QUERY])  # (1, 2)
    keys = torch.tensor([KEYS])  # (1, 3, 2)
    values = torch.tensor([VALUES])  # (1, 3, 3)
    valid = torch.tensor([VALID])  # (1, 3)
    context, weights = module(query, module.project_keys(keys), values, valid)
    return context[0], weights[0]


def _check(module: nn.Module, scores: list[float]) -> None:
    weights, context = _expected(scores)
    got_context, got_weights = _run(module)
    assert torch.allclose(got_weights, torch.tensor(weights), atol=1e-6)
    assert torch.allclose(got_context, torch.tensor(context), atol=1e-5)


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _matvec(m: list[list[float]], x: list[float]) -> list[float]:
    return [_dot(row, x) for row in m]


def test_additive_score() -> None:
    wq, wk, v = [[1.0, 0.5], [0.0, -1.0]], [[0.5, 0.0], [1.0, 1.0]], [1.0, -2.0]
    module = AdditiveScore(query_dim=2, key_dim=2, attn_dim=2)
    with torch.no_grad():
        module.query_proj.weight.copy_(torch.tensor(wq))
        module.key_proj.weight.copy_(torch.tensor(wk))
        module.v.weight.copy_(torch.tensor([v]))
    q = _matvec(wq, QUERY)
    hidden = [[math.tanh(a + b) for a, b in zip(q, _matvec(wk, k), strict=True)] for k in KEYS]
    scores = [_dot(v, h) for h in hidden]
    _check(module, scores)


def test_dot_score() -> None:
    module = DotScore(query_dim=2, key_dim=2)
    assert not list(module.parameters())
    _check(module, [_dot(QUERY, k) for k in KEYS])


def test_scaled_dot_score_scales_before_softmax() -> None:
    module = ScaledDotScore(query_dim=2, key_dim=2)
    _check(module, [_dot(QUERY, k) / math.sqrt(2) for k in KEYS])


def test_general_score() -> None:
    w = [[2.0, 0.0], [1.0, -1.0]]  # (Dq, Dk)
    module = GeneralScore(query_dim=2, key_dim=2)
    with torch.no_grad():
        module.key_proj.weight.copy_(torch.tensor(w))
    _check(module, [_dot(QUERY, _matvec(w, k)) for k in KEYS])


@pytest.mark.parametrize("name", ["dot", "scaled_dot"])
def test_dot_scores_have_no_parameters_and_refuse_keys_of_another_size(name: str) -> None:
    assert not list(make_score(name, query_dim=4, key_dim=4, attn_dim=5).parameters())
    with pytest.raises(ValueError, match=rf"model\.attention={name} .* 4 .* 6 .*general"):
        make_score(name, query_dim=4, key_dim=6, attn_dim=5)


def test_general_score_maps_keys_of_another_size() -> None:
    module = make_score("general", query_dim=4, key_dim=6, attn_dim=5)
    keys = torch.randn(2, 3, 6)  # (B, S, Dk)
    assert module.project_keys(keys).shape == (2, 3, 4)
    context, weights = module(torch.randn(2, 4), module.project_keys(keys), keys, None)
    assert context.shape == (2, 6) and weights.shape == (2, 3)


def test_make_score_rejects_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown attention"):
        make_score("cosine", 2, 2, 2)


# -- multi-head attention ---------------------------------------------------------------------


def _pair() -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    nn.init.normal_(ref.in_proj_bias)  # non-zero biases, so a swapped bias would show
    nn.init.normal_(ref.out_proj.bias)
    mine = MultiHeadAttention(D, H)
    mine.load_torch_weights(ref)
    return mine.eval(), ref.eval()


def _valid(lens: list[int], length: int) -> Tensor:
    return torch.arange(length)[None, :] < torch.tensor(lens)[:, None]  # (B, L) True = real


@pytest.mark.parametrize("need_weights", [False, True])
def test_mha_matches_torch_with_key_padding(need_weights: bool) -> None:
    mine, ref = _pair()
    q, kv = torch.randn(3, 4, D), torch.randn(3, 6, D)  # (B, Tq, D), (B, Tk, D)
    valid = _valid([6, 2, 4], 6)  # (B, Tk)
    out, weights = mine(q, kv, kv, key_valid=valid, need_weights=need_weights)
    ref_out, ref_weights = ref(q, kv, kv, key_padding_mask=~valid, average_attn_weights=False)
    assert torch.allclose(out, ref_out, atol=1e-5)
    if need_weights:
        assert torch.allclose(weights, ref_weights, atol=1e-6)


@pytest.mark.parametrize("with_padding", [False, True])
def test_mha_matches_torch_causal(with_padding: bool) -> None:
    mine, ref = _pair()
    x = torch.randn(2, 5, D)  # (B, T, D)
    valid = _valid([5, 3], 5) if with_padding else None
    pad = ~valid if valid is not None else None  # torch's sense: True = padding
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)  # (T, T) True = not allowed
    ref_out, _ = ref(x, x, x, key_padding_mask=pad, attn_mask=future)
    for need_weights in (False, True):
        out, _ = mine(x, x, x, key_valid=valid, causal=True, need_weights=need_weights)
        assert torch.allclose(out, ref_out, atol=1e-5)


def test_sdpa_path_equals_explicit_weights_path() -> None:
    mine, _ = _pair()
    q, kv = torch.randn(2, 3, D), torch.randn(2, 7, D)
    valid = _valid([7, 4], 7)
    fast, none = mine(q, kv, kv, key_valid=valid)
    slow, weights = mine(q, kv, kv, key_valid=valid, need_weights=True)
    assert none is None and weights.shape == (2, H, 3, 7)
    assert torch.allclose(fast, slow, atol=1e-6)
    assert torch.allclose(weights.sum(-1), torch.ones(2, H, 3))
    assert (weights[1, ..., 4:] == 0).all()


def test_extra_padded_keys_change_nothing() -> None:
    mine, _ = _pair()
    q, kv = torch.randn(2, 3, D), torch.randn(2, 4, D)
    valid = _valid([4, 2], 4)
    out, weights = mine(q, kv, kv, key_valid=valid, need_weights=True)
    longer = torch.cat([kv, 50 * torch.randn(2, 3, D)], dim=1)  # (B, 7, D)
    longer_valid = _valid([4, 2], 7)
    for need_weights in (False, True):
        out2, weights2 = mine(q, longer, longer, key_valid=longer_valid, need_weights=need_weights)
        assert torch.allclose(out, out2, atol=1e-6)
    assert torch.allclose(weights, weights2[..., :4], atol=1e-7)


def test_incremental_self_attention_equals_full_causal() -> None:
    mine, _ = _pair()
    x = torch.randn(2, 6, D)  # (B, T, D)
    full, _ = mine(x, x, x, causal=True)
    cache = {"k": torch.zeros(2, H, 0, D // H), "v": torch.zeros(2, H, 0, D // H)}
    steps = []
    for t in range(6):
        step = x[:, t : t + 1]  # (B, 1, D)
        out, _ = mine(step, step, step, causal=True, cache=cache)
        steps.append(out)
    assert cache["k"].shape == (2, H, 6, D // H)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-6)


def test_incremental_chunk_with_cache_is_causal() -> None:
    mine, _ = _pair()
    x = torch.randn(2, 6, D)
    full, _ = mine(x, x, x, causal=True)
    cache = {"k": torch.zeros(2, H, 0, D // H), "v": torch.zeros(2, H, 0, D // H)}
    first, _ = mine(x[:, :2], x[:, :2], x[:, :2], causal=True, cache=cache)
    rest, _ = mine(x[:, 2:], x[:, 2:], x[:, 2:], causal=True, cache=cache)
    assert torch.allclose(torch.cat([first, rest], dim=1), full, atol=1e-6)


def test_cross_attention_cache_is_reused() -> None:
    mine, _ = _pair()
    q, memory = torch.randn(2, 3, D), torch.randn(2, 5, D)
    valid = _valid([5, 3], 5)
    full, _ = mine(q, memory, memory, key_valid=valid)
    cache = mine.project_kv(memory, memory)  # {"k", "v"}: (B, H, S, dk)
    cached, _ = mine(q, None, None, key_valid=valid, cache=cache)
    assert torch.allclose(full, cached, atol=1e-6)


def test_one_scaled_dot_product_serves_the_recurrent_scores_and_multi_head_attention() -> None:
    """q . k and q . k / sqrt(d) by hand; DotScore, ScaledDotScore and the heads of
    MultiHeadAttention's path with weights all give exactly these scores."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    by_hand = torch.einsum("bqd,bkd->bqk", q, k)
    assert torch.allclose(dot_scores(q, k), by_hand, atol=1e-6)
    assert torch.allclose(scaled_dot_scores(q, k), by_hand / 2.0, atol=1e-6)
    assert torch.equal(DotScore(4, 4).score(q, k), dot_scores(q, k))
    assert torch.equal(ScaledDotScore(4, 4).score(q, k), scaled_dot_scores(q, k))
    mine, _ = _pair()
    x = torch.randn(2, 3, D)
    _, weights = mine(x, x, x, need_weights=True)  # (B, H, T, T)
    heads = mine.q_proj(x).view(2, 3, H, D // H).transpose(1, 2)  # (B, H, T, dk)
    keys = mine.k_proj(x).view(2, 3, H, D // H).transpose(1, 2)
    want = masked_softmax(scaled_dot_scores(heads, keys), None)
    assert torch.allclose(weights, want, atol=1e-6)
