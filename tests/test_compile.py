"""trainer.compile=true (torch.compile) trains the same model as eager mode."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from nmt.store.checkpoint import load_checkpoint
from nmt.train.command import train

from .helpers import DETERMINISTIC, compose_config, tiny_run_overrides

STEPS = 6


@pytest.mark.slow(seconds=58)
def test_compiled_training_equals_eager_training(corpus, tmp_path):
    common = (
        f"trainer.max_steps={STEPS}",
        "trainer.val_every=1000",
        *DETERMINISTIC,
        "trainer.precision=32",
    )
    runs, graphs = {}, {}
    for name, flag in (("eager", "false"), ("compiled", "true")):
        cfg = compose_config(
            "train", tiny_run_overrides(corpus, tmp_path, *common, f"trainer.compile={flag}")
        )
        torch._dynamo.reset()
        counters.clear()
        result = train(cfg, tmp_path / name)
        assert result["state"]["step"] == STEPS
        graphs[name] = counters["stats"]["unique_graphs"]
        runs[name] = load_checkpoint(tmp_path / name / "checkpoints" / "last.pt")
    # trainer.compile=true really compiled (graphs captured), and eager mode captured none
    assert graphs["eager"] == 0 and graphs["compiled"] >= 1, graphs
    eager, compiled = runs["eager"]["model"], runs["compiled"]["model"]
    assert set(compiled) == set(eager)  # saved without the compiled wrapper's key prefix
    for key, value in eager.items():
        torch.testing.assert_close(compiled[key], value, rtol=1e-3, atol=1e-4, msg=key)
    # the batches have different shapes, so the compiled run went through recompilation
    # (dynamic shapes) and still matched; its checkpoint loads into the eager model above
    assert runs["compiled"]["state"]["history"][-1]["loss"] == pytest.approx(
        runs["eager"]["state"]["history"][-1]["loss"], rel=1e-3
    )
