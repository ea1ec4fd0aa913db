"""trainer.compile=true (torch.compile) trains the same model as eager mode."""

from __future__ import annotations

import numpy as np
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


@pytest.mark.slow(seconds=15)
def test_a_compiled_gru_does_not_recompile_for_each_target_length():
    """The GRU's recurrent loop stays out of torch.compile's graphs: traced, it would be
    unrolled into a new graph for every target length. Graphs are captured for the first batch
    shape and again, with dynamic sizes, for the second; later lengths capture none."""
    from nmt.models.gru import GRUBahdanau

    torch.manual_seed(0)
    model = GRUBahdanau(
        emb_dim=8, hidden_dim=8, enc_layers=1, dec_layers=1, bidirectional=True, dropout=0.0,
        attention="additive", attn_dim=8, tie_embeddings=False, src_vocab_size=20,
        tgt_vocab_size=20,
    )  # fmt: skip
    compiled = torch.compile(model, backend="eager")  # graph capture is dynamo's, any backend
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for rows, src_len, tgt_len in ((3, 5, 4), (4, 6, 5), (2, 7, 9), (5, 4, 12), (3, 6, 3)):
        lens = np.array([src_len] + [max(1, src_len - k) for k in range(1, rows)])
        src = torch.randint(3, 20, (rows, src_len))
        tgt = torch.randint(3, 20, (rows, tgt_len))
        positions = torch.arange(rows * tgt_len)
        targets = torch.randint(3, 20, (rows * tgt_len,))
        loss = compiled(src, torch.from_numpy(lens), tgt, positions, targets, src_lens_host=lens)
        loss.backward()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] > graphs[0] > 0  # captured, then recaptured with dynamic sizes
    assert graphs[2:] == [graphs[1]] * 3, graphs  # no graph for another target length
