"""A smoke run of ``make bench-serve`` on tiny checkpoints: every part runs and its JSON holds
the figures the README quotes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError
from nmt.data.datasets import encode_texts
from nmt.decode.engines import make_engine
from nmt.decode.options import DecodeOptions
from nmt.store.loading import load_trained
from nmt.train.command import train

from .helpers import REPO, TINY_TRANSFORMER, compose_config, tiny_run_overrides


@pytest.fixture(scope="module")
def runs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench_serve")
    steps = ("trainer.max_steps=6", "trainer.val_every=6", "trainer.device=cpu")
    out = {}
    overrides = tiny_run_overrides(corpus, root, *steps)  # one data root: one tokenizer
    # the package's search is beam 5: the load test runs it and greedy search
    train(compose_config("train", [*overrides, "decode.beam=5"]), root / "t")
    out["transformer"] = root / "t" / "checkpoints" / "best.pt"
    gru = [o for o in overrides if o not in TINY_TRANSFORMER]
    gru += ["model=gru_bahdanau", "model.emb_dim=32", "model.hidden_dim=32", "model.attn_dim=32"]
    train(compose_config("train", gru), root / "g")
    out["gru"] = root / "g" / "checkpoints" / "best.pt"
    return out


def test_bench_serve_quick_run(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "scripts/bench_serve.py", "--quick", "--threads", "1",
        "--transformer", str(runs["transformer"]), "--transformer-base", str(runs["transformer"]),
        "--gru", str(runs["gru"]), "--sentences", "12", "--base-sentences", "6",
        "--fixed-length", "5", "--levels", "1,4", "--per-request", "3", "--requests", "12",
        "--malformed", "18",
        "--work", str(tmp_path / "work"), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    transformer = result["models"]["transformer"]
    assert set(transformer["runs"]) == {
        f"{engine}.beam{beam}"
        for engine in ("torch", "ctranslate2-float32", "ctranslate2-int8")
        for beam in (1, 5)
    }
    assert transformer["parity"]["greedy_identical_share"] >= 0.99
    base_runs = result["models"]["transformer_base"]["runs"].values()
    assert {r["tgt_tokens"] for r in base_runs} == {
        6 * 6  # fixed length: 5 tokens and EOS for every sentence, whichever engine
    }
    for run in base_runs:  # and once with the natural lengths, for a BLEU that means something
        assert run["natural_length"]["tgt_tokens"] != 6 * 6 and run["natural_length"]["bleu"] >= 0
    assert transformer["runs"]["ctranslate2-float32.beam5"]["ctranslate2_calls"] >= 1
    assert set(result["models"]["gru"]["runs"]) == {
        "torch.beam1", "torch-int8.beam1", "torch.beam5", "torch-int8.beam5"
    }  # fmt: skip
    beams = [5, 1]
    assert result["server"]["decode"]["beam"] == 5
    for engine in ("torch", "ctranslate2"):
        server = result["server"][engine]
        levels = [
            (level["beam"], level["clients"], level["sentences_per_request"])
            for level in server["levels"]
        ]
        assert levels == [(b, c, n) for b in beams for c, n in ((1, 1), (4, 1), (4, 3))]
        assert [level["errors"] for level in server["levels"]] == [0] * len(levels)
        assert [level["answered"] for level in server["levels"]] == [12] * len(levels)
        assert server["malformed"]["all_4xx"] and server["malformed"]["then_serves"]
        assert server["exit_code_after_sigterm"] == 0
        for bound in ("in_batches_of_4", "in_length_sorted_batches_of_4"):
            assert set(server[f"offline_{bound}_sentences_per_s"]) == {"beam5", "beam1"}
            assert all(  # the 4 single-sentence clients against batches of 4 sentences
                (f"vs_offline_{bound}" in level)
                == (level["clients"] == 4 and level["sentences_per_request"] == 1)
                for level in server["levels"]
            )
    assert result["server"]["ctranslate2_rss_vs_torch"] < 1


def test_engine_torch_int8_decodes_the_gru_and_refuses_the_transformer(
    runs: dict[str, Path], corpus: Path
) -> None:
    """engine=torch-int8: the GRU with int8 weights, through nmt-eval's engine choice; its
    outputs stay close to the fp32 model's (the same tokens on most sentences)."""
    cpu = torch.device("cpu")
    gru = load_trained(runs["gru"], cpu)
    engine = make_engine("torch-int8", gru, DecodeOptions(), cpu)
    assert engine.name == "torch-int8" and engine.model is not gru.model
    assert isinstance(engine.model.out_proj, torch.ao.nn.quantized.dynamic.Linear)
    src = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()[:40]
    data = encode_texts(gru.tokenizers, src, src)
    opts = DecodeOptions(beam=2, max_output_len_a=0.0, max_output_len_b=8)
    fp32 = [h.tokens for h in make_engine("torch", gru, opts, cpu).hypotheses(data, opts)]
    int8 = [h.tokens for h in engine.hypotheses(data, opts)]
    assert sum(a == b for a, b in zip(fp32, int8, strict=True)) >= 0.75 * len(src)
    transformer = load_trained(runs["transformer"], cpu)
    with pytest.raises(ConfigError, match="decodes the GRU model"):
        make_engine("torch-int8", transformer, opts, cpu)
