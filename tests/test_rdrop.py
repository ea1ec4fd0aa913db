"""R-Drop: the blockwise loss equals its plain definition (value and gradients), two identical
passes give the ordinary loss, the models run the two passes as one doubled batch, and training
with it resumes bit for bit."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from nmt.config import ConfigError, GRUBahdanauConfig, TransformerConfig
from nmt.models.loss import projected_cross_entropy
from nmt.models.rdrop import projected_rdrop_loss, reference_rdrop_loss
from nmt.models.registry import create_model
from nmt.store.checkpoint import load_checkpoint
from nmt.train.command import train

from .helpers import compose_config, tiny_run_overrides
from .test_loss import MatrixProducts, grads

pytestmark = pytest.mark.usefixtures("one_thread")

N, D, V = 23, 16, 37


def inputs(bias: bool, seed: int = 0):
    """Two passes' features (the second near the first, as dropout leaves it), the projection
    and the targets."""
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(N, D, generator=g).requires_grad_()
    x2 = (x1.detach() + 0.5 * torch.randn(N, D, generator=g)).requires_grad_()
    w = (torch.randn(V, D, generator=g) * 0.3).requires_grad_()
    b = (torch.randn(V, generator=g) * 0.1).requires_grad_() if bias else None
    y = torch.randint(0, V, (N,), generator=g)
    return x1, x2, w, b, y


@pytest.mark.parametrize("alpha", [0.5, 5.0])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 5, 100, None])
def test_equals_the_definition_with_its_gradients(alpha, smoothing, bias, rows) -> None:
    x1, x2, w, b, y = inputs(bias)
    want = reference_rdrop_loss(x1, x2, w, b, y, smoothing, alpha)
    got = projected_rdrop_loss(x1, x2, w, b, y, smoothing, alpha, rows=rows)
    assert got.shape == () and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    for g_got, g_want in zip(grads(got, (x1, x2, w, b)), grads(want, (x1, x2, w, b)), strict=True):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-6)


def test_the_consistency_term_is_the_symmetric_divergence_the_paper_adds() -> None:
    """alpha scales (KL(p1||p2) + KL(p2||p1)) / 2 beside the two cross-entropies, all halved."""
    x1, x2, w, b, y = inputs(True)
    plain = projected_cross_entropy(x1, w, b, y, 0.1) + projected_cross_entropy(x2, w, b, y, 0.1)
    logp1, logp2 = (torch.log_softmax(torch.nn.functional.linear(x, w, b), -1) for x in (x1, x2))
    kl = ((logp1.exp() * (logp1 - logp2)).sum() + (logp2.exp() * (logp2 - logp1)).sum()) / 2
    got = projected_rdrop_loss(x1, x2, w, b, y, 0.1, 3.0)
    torch.testing.assert_close(got, (plain + 3.0 * kl) / 2, rtol=1e-5, atol=1e-4)
    assert kl > 0


def test_two_identical_passes_give_the_ordinary_loss() -> None:
    x1, _, w, b, y = inputs(True)
    got = projected_rdrop_loss(x1, x1, w, b, y, 0.1, 4.0, rows=6)
    want = projected_cross_entropy(x1, w, b, y, 0.1)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    for g_got, g_want in zip(grads(got, (x1, w, b)), grads(want, (x1, w, b)), strict=True):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-6)


def test_under_bf16_autocast_it_stays_close_to_the_definition() -> None:
    x1, x2, w, b, y = inputs(True, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = reference_rdrop_loss(x1, x2, w, b, y, 0.1, 1.0)
        got = projected_rdrop_loss(x1, x2, w, b, y, 0.1, 1.0, rows=4)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-2)
    exact = grads(reference_rdrop_loss(x1, x2, w, b, y, 0.1, 1.0), (x1, x2, w, b))
    for g_got, g_exact in zip(grads(got, (x1, x2, w, b)), exact, strict=True):
        assert g_got.dtype == torch.float32
        assert (g_got - g_exact).abs().max() <= 0.05 * g_exact.abs().max()


@pytest.mark.parametrize("off", [torch.no_grad, torch.inference_mode])
def test_without_gradients_it_only_scores(off) -> None:
    x1, x2, w, b, y = inputs(True)
    with off(), MatrixProducts() as products:
        got = projected_rdrop_loss(x1, x2, w, b, y, 0.1, 1.0, rows=5)
    assert products.count == 2 * -(-N // 5)  # the logits of both passes, no gradient
    torch.testing.assert_close(got, reference_rdrop_loss(x1, x2, w, b, y, 0.1, 1.0).detach())


def test_bad_shapes_are_refused() -> None:
    x1, x2, w, b, y = inputs(False)
    with pytest.raises(ValueError, match="x1, x2"):
        projected_rdrop_loss(x1, x2[:-1], w, b, y, 0.1, 1.0)


# ------------------------------------------------------------------------------- in the models


def tiny_model(kind: str, dropout: float) -> torch.nn.Module:
    if kind == "gru":
        cfg = GRUBahdanauConfig(emb_dim=8, hidden_dim=12, attn_dim=10, dropout=dropout)
    else:
        cfg = TransformerConfig(d_model=16, heads=2, d_ff=32, enc_layers=1, dec_layers=1,
                                dropout=dropout, attn_dropout=dropout)  # fmt: skip
    torch.manual_seed(0)
    return create_model(
        OmegaConf.structured(cfg), src_vocab_size=30, tgt_vocab_size=30, pad_id=0,
        shared_vocab=True,
    )  # fmt: skip


def batch():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 30, (3, 6), generator=g)
    src_lens = torch.tensor([6, 4, 5])
    src[1, 4:] = 0
    src[2, 5:] = 0
    tgt_in = torch.randint(4, 30, (3, 5), generator=g)
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13])  # real target positions
    targets = torch.randint(4, 30, (positions.numel(),), generator=g)
    return src, src_lens, tgt_in, positions, targets


@pytest.mark.parametrize("kind", ["gru", "transformer"])
def test_without_dropout_a_model_gives_the_ordinary_loss(kind: str) -> None:
    model = tiny_model(kind, 0.0).train()
    src, src_lens, tgt_in, positions, targets = batch()
    plain = model(src, src_lens, tgt_in, positions, targets, 0.1)
    twice = model(src, src_lens, tgt_in, positions, targets, 0.1, rdrop_alpha=2.0)
    torch.testing.assert_close(twice, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["gru", "transformer"])
def test_a_model_runs_both_passes_as_one_doubled_batch(kind: str) -> None:
    """Under dropout the two copies of each sentence get masks of their own: the loss is the
    definition's over the doubled batch's two halves, and the halves differ."""
    model = tiny_model(kind, 0.3).train()
    src, src_lens, tgt_in, positions, targets = batch()
    torch.manual_seed(11)
    got = model(src, src_lens, tgt_in, positions, targets, 0.1, rdrop_alpha=2.0)
    torch.manual_seed(11)
    doubled = [torch.cat([x, x]) for x in (src, src_lens, tgt_in)]
    features = model.features(*doubled, torch.cat([positions, positions + tgt_in.numel()]))
    first, second = features.chunk(2)
    assert not torch.allclose(first, second)
    proj = model.out_proj
    want = reference_rdrop_loss(first, second, proj.weight, proj.bias, targets, 0.1, 2.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ training


def test_a_negative_alpha_is_refused_by_name(corpus, tmp_path) -> None:
    cfg = compose_config("train", tiny_run_overrides(corpus, tmp_path, "trainer.rdrop_alpha=-1"))
    with pytest.raises(ConfigError, match="trainer.rdrop_alpha=-1"):
        train(cfg, tmp_path / "run")


@pytest.mark.slow(seconds=8)
def test_training_with_rdrop_resumes_bit_for_bit(corpus, tmp_path, threads_restored) -> None:
    """Half a run, resumed, ends with the weights of the whole run; and R-Drop changed them."""
    common = ("trainer.val_every=4", "model.dropout=0.1", "trainer.seed=5", "trainer.threads=1",
              "trainer.accumulate=2")  # fmt: skip

    def run(name: str, *extra: str) -> dict:
        overrides = tiny_run_overrides(corpus, tmp_path, *common, *extra)
        return train(compose_config("train", overrides), tmp_path / name)

    run("full", "trainer.max_steps=8", "trainer.rdrop_alpha=1")
    run("half", "trainer.max_steps=4", "trainer.rdrop_alpha=1")
    resumed = run("x", "trainer.max_steps=8", "trainer.rdrop_alpha=1",
                  f"trainer.resume={tmp_path / 'half'}")  # fmt: skip
    assert resumed["state"]["step"] == 8
    run("plain", "trainer.max_steps=8")

    def weights(name: str) -> dict[str, torch.Tensor]:
        return load_checkpoint(tmp_path / name / "checkpoints" / "last.pt")["model"]

    full, half, plain = weights("full"), weights("half"), weights("plain")
    assert all(torch.equal(full[k], half[k]) for k in full)
    assert not all(torch.equal(full[k], plain[k]) for k in full)
