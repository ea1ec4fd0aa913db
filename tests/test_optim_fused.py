"""The optimizer runs torch's fused Adam/AdamW kernel on CPU and CUDA (nmt.train.optim)."""

from __future__ import annotations

import pytest
import torch

from nmt.train import optim

from .helpers import compose_config


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(50, 16), torch.nn.Linear(16, 32), torch.nn.LayerNorm(32)
    )


def steps(model: torch.nn.Module, opt: torch.optim.Optimizer, n: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_the_cpu_optimizer_is_fused_and_updates_as_the_default_loop(name):
    cfg = compose_config("train", [f"optim.name={name}", "optim.weight_decay=0.01"]).optim
    fused_model, loop_model = tiny_model(), tiny_model()
    fused = optim.build_optimizer(fused_model, cfg)
    loop = optim.build_optimizer(loop_model, cfg, fused=False)
    assert all(g["fused"] for g in fused.param_groups)
    assert not any(g["fused"] for g in loop.param_groups)
    # the weight-decay groups are kept
    assert [g["weight_decay"] for g in fused.param_groups] == [0.01, 0.0]
    steps(fused_model, fused, 5)
    steps(loop_model, loop, 5)
    for a, b in zip(fused_model.parameters(), loop_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(fused_model.parameters(), tiny_model().parameters(), strict=True)
    )


def test_a_state_of_the_default_loop_resumes_in_the_fused_optimizer():
    """A checkpoint written before the optimizer was fused continues as the loop would have."""
    cfg = compose_config("train", []).optim
    old_model, new_model, ref_model = tiny_model(), tiny_model(), tiny_model()
    old = optim.build_optimizer(old_model, cfg, fused=False)
    ref = optim.build_optimizer(ref_model, cfg, fused=False)
    steps(old_model, old, 3)
    steps(ref_model, ref, 3)
    new_model.load_state_dict(old_model.state_dict())
    new = optim.build_optimizer(new_model, cfg)
    optim.load_optimizer_state(new, old.state_dict())
    assert all(g["fused"] for g in new.param_groups)
    steps(new_model, new, 3, seed=2)
    steps(ref_model, ref, 3, seed=2)
    for a, b in zip(new_model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # and the other way: a fused state loads into the loop
    back = optim.build_optimizer(tiny_model(), cfg, fused=False)
    optim.load_optimizer_state(back, new.state_dict())
    assert not any(g["fused"] for g in back.param_groups)
