"""A smoke run of ``make bench-serve`` on tiny checkpoints: every part runs and its JSON holds
the figures the README quotes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError
from nmt.data.datasets import encode_texts
from nmt.decode.engines import make_engine
from nmt.decode.options import DecodeOptions
from nmt.models.int8 import Int8GRUCell, Int8Linear, int8_error_bound, quantize_int8
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


def run_bench(cmd: list[str], out: Path) -> dict:
    """Run a bench command on one thread; its JSON."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


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
    result = run_bench(cmd, out)
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
    outputs stay close to the fp32 model's (the same tokens on most sentences, greedy and
    beam 2). It is built and decodes with every warning an error: no deprecated PyTorch API."""
    cpu = torch.device("cpu")
    gru = load_trained(runs["gru"], cpu)
    src = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()[:40]
    data = encode_texts(gru.tokenizers, src, src)
    fp32_engine = make_engine("torch", gru, DecodeOptions(), cpu)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = make_engine("torch-int8", gru, DecodeOptions(), cpu)
        assert engine.name == "torch-int8" and engine.model is not gru.model
        assert isinstance(engine.model.out_proj, Int8Linear)
        assert isinstance(gru.model.out_proj, torch.nn.Linear)  # the float model unchanged
        for beam in (1, 2):
            opts = DecodeOptions(beam=beam, max_output_len_a=0.0, max_output_len_b=8)
            fp32 = [h.tokens for h in fp32_engine.hypotheses(data, opts)]
            int8 = [h.tokens for h in engine.hypotheses(data, opts)]
            assert sum(a == b for a, b in zip(fp32, int8, strict=True)) >= 0.75 * len(src)
    transformer = load_trained(runs["transformer"], cpu)
    with pytest.raises(ConfigError, match="decodes the GRU model"):
        make_engine("torch-int8", transformer, opts, cpu)


def test_int8_linear_is_close_to_the_float_linear() -> None:
    """Per-row int8 weights and activations: every output within the bound the roundings
    allow (half a step per entry, :func:`int8_error_bound`), and about 1% off overall: a
    rounding error uniform on half a step is 1/sqrt(12) of a step, a step 1/127 of a row's
    largest entry, about 3 standard deviations of Gaussian entries, so about 0.7% of an
    entry per factor, 1% for a product of two."""
    torch.manual_seed(0)
    for bias in (True, False):
        linear = torch.nn.Linear(96, 40, bias=bias)
        x = torch.randn(3, 21, 96)
        x[0, 0] = 0.0  # a row of zeros stays zeros
        with torch.no_grad():
            ref, out = linear(x), Int8Linear.from_float(linear)(x)
        assert out.shape == ref.shape and out.dtype == ref.dtype
        bound = int8_error_bound(x.reshape(-1, 96), linear.weight.detach())
        assert ((out - ref).reshape(-1, 40).abs() <= bound + 1e-5).all()
        assert (out - ref).norm() / ref.norm() < 0.02
        assert torch.equal(out[0, 0], ref[0, 0])  # the bias alone (or zeros)


def test_int8_linear_is_exact_on_the_int8_grid() -> None:
    """Rows whose largest entry is 127 times their step are integers times that step: nothing
    rounds, and the integer product is exact."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (12, 16), generator=g).float()
    weight[:, 0] = 127.0
    x = torch.randint(-127, 128, (5, 16), generator=g).float()
    x[:, 1] = -127.0
    scales = torch.tensor([0.5, 0.25, 2.0, 1.0, 0.125])[:, None]
    layer = Int8Linear(weight * 0.01, None)
    assert torch.equal(layer(x * scales), (x @ weight.t()) * scales * 0.01)


def test_int8_gru_cell_is_close_to_the_gru_cell() -> None:
    """nn.GRUCell's gates on int8 projections of the same weights: the gates are squashed
    (sigmoid slope <= 1/4, tanh <= 1), so the state moves by about the projections' error."""
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(48, 32)
    x, h = torch.randn(10, 48), torch.randn(10, 32)
    int8 = Int8GRUCell(cell)
    with torch.no_grad():
        assert (int8(x, h) - cell(x, h)).abs().max() < 0.03
        assert (int8(x) - cell(x)).abs().max() < 0.03
        exact = int8(x, h)
    # the gates in their places: r, z, n swapped would move the state far more
    swapped = torch.nn.GRUCell(48, 32)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            r, z, n = getattr(cell, name).chunk(3)
            getattr(swapped, name).copy_(torch.cat([z, r, n]))
        assert (Int8GRUCell(swapped)(x, h) - exact).abs().max() > 0.1


def test_int8_model_quantizes_without_a_deprecated_api() -> None:
    """The int8 copy is built with every warning an error (PyTorch warns on its deprecated
    quantization API); the linear layers and GRU cells are int8, a one-output projection and
    the embeddings stay float, the float model is untouched."""
    model = torch.nn.ModuleDict(
        {
            "proj": torch.nn.Linear(8, 6),
            "score": torch.nn.Linear(6, 1),
            "cells": torch.nn.ModuleList([torch.nn.GRUCell(6, 4)]),
            "embed": torch.nn.Embedding(10, 8),
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        int8 = quantize_int8(model)
        int8["cells"][0](int8["proj"](int8["embed"](torch.tensor([1, 2]))))
    assert isinstance(int8["proj"], Int8Linear) and isinstance(int8["cells"][0], Int8GRUCell)
    assert type(int8["score"]) is torch.nn.Linear and type(int8["embed"]) is torch.nn.Embedding
    assert type(model["proj"]) is torch.nn.Linear and type(model["cells"][0]) is torch.nn.GRUCell


@pytest.mark.slow(seconds=42)  # mostly its 20 servers starting, and the phases' clocks
def test_bench_serve_overload_quick_run(runs: dict[str, Path], tmp_path: Path) -> None:
    """--overload on both engines: the sustainable load, 4x it, the abandoned burst (on this code
    and, through --ab-base, on a checkout: here this one) and the A/B levels, in the JSON."""
    out = tmp_path / "overload.json"
    cmd = [
        sys.executable, "scripts/bench_serve.py", "--threads", "1", "--no-offline", "--overload",
        "--transformer", str(runs["transformer"]), "--sentences", "12",
        "--overload-seconds", "1", "--patience", "5", "--burst-clients", "3",
        "--burst-patience", "1", "--recovery-cap", "3", "--ab-base", str(REPO),
        "--ab-rounds", "1", "--levels", "1", "--requests", "4", "--level-seconds", "5",
        "--setting-ab", "decode_nice=0", "--setting-rounds", "1", "--setting-levels",
        "--work", str(tmp_path / "work"), "--out", str(out),
    ]  # fmt: skip
    result = run_bench(cmd, out)
    assert "models" not in result or not result["models"]  # --no-offline
    known = {"200", "503", "504", "gave up"}
    for engine in ("torch", "ctranslate2"):
        over = result["overload"][engine]
        assert [lv["clients"] for lv in over["sustainable"]["levels"]] == [1, 2, 4, 8, 16]
        assert over["sustainable"]["requests_per_s"] > 0
        loaded = over["overload_4x"]
        assert sum(loaded["statuses"].values()) == loaded["sent"] > 0
        assert set(loaded["statuses"]) <= known
        assert loaded["probes_failed"] == 0 and set(loaded["probes_while_loaded"]) == {
            "/health",
            "/ready",
        }
        for burst in (over["abandoned_burst"], over["abandoned_burst_before"]):
            assert sum(burst["statuses"].values()) == 3 and set(burst["statuses"]) <= known
            assert burst["probes"] >= 1
        assert over["abandoned_burst"]["health_after_clients_left"]["queued"] == 0
        for side in ("A", "B"):
            assert over["ab"]["medians"][side]["1_clients"]["sentences_per_s"] > 0
        setting = over["setting_ab"]
        assert setting["A"] == "decode_nice=0" and setting["rate"] == loaded["requests_per_s"]
        for side in ("A", "B"):
            (run,) = setting["runs"][side]
            assert sum(run["statuses"].values()) == run["sent"] > 0
            assert setting["medians"][side]["answered_200_share"] is not None
            assert run["load_generator_cores"] > 0
            (levels,) = setting["levels"][side]  # --setting-levels: a fresh server per round
            assert [lv["clients"] for lv in levels] == [1]
            assert setting["level_medians"][side]["1_clients"]["sentences_per_s"] > 0
