"""The CPU dropout: the drop rate is p in every lane of a random word, kept elements are
scaled by 1 / keep probability, the gradient follows the mask, seeds decide the masks."""

from __future__ import annotations

import pytest
import torch

from nmt.models.dropout import LANES, Dropout, dropout, keep_mask, reference_dropout

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_every_lane_drops_at_rate_p_independently(p: float) -> None:
    torch.manual_seed(0)
    n = 1 << 20
    keep, scale = keep_mask(torch.Size([n]), p, torch.device("cpu"))
    rate = round(p * LANES) / LANES
    assert scale == pytest.approx(1 / (1 - rate))
    sigma = (rate * (1 - rate) / (n // 4)) ** 0.5
    for lane in range(4):  # element i takes lane i % 4 of a word
        dropped = (~keep[lane::4]).float().mean().item()
        assert abs(dropped - rate) < 5 * sigma, (lane, dropped)
    # neighbours (same word, and adjacent words) are uncorrelated
    k = keep.float() - (1 - rate)
    for shift in (1, 4):
        corr = (k[:-shift] * k[shift:]).mean().item() / (rate * (1 - rate))
        assert abs(corr) < 0.01, (shift, corr)


def test_kept_elements_are_scaled_and_the_mean_is_kept() -> None:
    torch.manual_seed(1)
    x = torch.rand(1000, 512) + 0.5
    out = dropout(x, 0.1, True)
    kept = out != 0
    scale = LANES / (LANES - round(0.1 * LANES))
    torch.testing.assert_close(out[kept], x[kept] * scale)
    assert out.mean().item() == pytest.approx(x.mean().item(), rel=0.01)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gradient_follows_the_mask(dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    x = torch.randn(64, 48, dtype=dtype, requires_grad=True)
    out = dropout(x, 0.25, True)
    assert out.dtype == dtype
    (grad,) = torch.autograd.grad((out * 3).sum(), [x])
    kept = out.detach() != 0
    scale = LANES / (LANES - round(0.25 * LANES))
    torch.testing.assert_close(grad, (3 * scale * kept).to(dtype))


def test_the_seed_decides_the_masks() -> None:
    x = torch.ones(100, 100)
    torch.manual_seed(7)
    a, b = dropout(x, 0.5, True), dropout(x, 0.5, True)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.5, True), a)
    assert not torch.equal(a, b)


def test_off_in_eval_at_zero_and_all_dropped_at_one() -> None:
    x = torch.randn(8, 8)
    assert dropout(x, 0.5, False) is x and dropout(x, 0.0, True) is x
    assert torch.equal(dropout(x, 1.0, True), torch.zeros_like(x))
    module = Dropout(0.2).eval()
    assert module(x) is x and module.state_dict() == {} and "p=0.2" in repr(module)
    with pytest.raises(ValueError, match="between 0 and 1"):
        Dropout(1.5)


def test_the_drop_rate_matches_f_dropout() -> None:
    torch.manual_seed(3)
    x = torch.ones(512, 512)
    ours = (dropout(x, 0.1, True) == 0).float().mean().item()
    theirs = (reference_dropout(x, 0.1, True) == 0).float().mean().item()
    assert abs(ours - theirs) < 0.005


def test_the_reference_is_the_definition() -> None:
    """Zeroed with probability p, the rest scaled by 1 / (1 - p); the identity in eval."""
    torch.manual_seed(0)
    x = torch.rand(256, 256) + 0.5
    y = reference_dropout(x, 0.25, True)
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] / 0.75)
    assert abs(1 - kept.float().mean().item() - 0.25) < 0.01
    assert torch.equal(reference_dropout(x, 0.25, False), x)
