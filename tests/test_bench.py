"""FLOP counting (benchmarks.flops), the speed benchmark's settings (benchmarks.speed) and a
smoke run of its script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import speed
from benchmarks.flops import (
    forward_flops,
    forward_flops_breakdown,
    gru_forward_flops,
    model_kind,
    transformer_forward_flops,
)
from benchmarks.report import SetupError, json_out, write_result
from nmt.models.gru import GRUBahdanau
from nmt.models.transformer import Transformer

REPO = Path(__file__).resolve().parents[1]

TINY_TRANSFORMER = {
    "arch": "transformer",
    "d_model": 8,
    "heads": 2,
    "d_ff": 16,
    "enc_layers": 1,
    "dec_layers": 1,
    "dropout": 0.0,
    "attn_dropout": 0.0,
    "act_dropout": 0.0,
    "norm_first": True,
    "tie_embeddings": True,
    "learned_positions": False,
    "max_positions": 64,
}

TINY_GRU = {
    "arch": "gru_bahdanau",
    "emb_dim": 8,
    "hidden_dim": 16,
    "enc_layers": 2,
    "dec_layers": 2,
    "bidirectional": True,
    "dropout": 0.0,
    "attention": "additive",
    "attn_dim": 12,
    "tie_embeddings": False,
}


def mm(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) @ (k, n) product."""
    return 2 * m * k * n


def test_transformer_count_equals_hand_count():
    d, h, dk, f, v = 8, 2, 4, 16, 10
    s, t = 3, 2  # source positions (EOS included), decoder positions (BOS included)
    encoder = 4 * mm(s, d, d) + h * mm(s, dk, s) + h * mm(s, s, dk) + mm(s, d, f) + mm(s, f, d)
    self_attn = 4 * mm(t, d, d) + h * mm(t, dk, t) + h * mm(t, t, dk)  # full T x T
    cross = 2 * mm(t, d, d) + 2 * mm(s, d, d) + h * mm(t, dk, s) + h * mm(t, s, dk)
    decoder = self_attn + cross + mm(t, d, f) + mm(t, f, d)
    hand = encoder + decoder + mm(t, d, v)
    assert hand == 7328
    assert forward_flops(TINY_TRANSFORMER, [s], [t], v) == hand


def _counted(fn, *args) -> int:
    """FLOPs that torch's counter sees in ``fn(*args)``."""
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


@torch.no_grad()
def test_transformer_count_matches_torch_flop_counter():
    """With explicit attention (forward_with_attention) every product is a matmul torch sees."""
    cfg = {**TINY_TRANSFORMER, "d_model": 16, "d_ff": 32, "enc_layers": 2, "dec_layers": 3}
    model_args = {k: v for k, v in cfg.items() if k != "arch"}
    torch.manual_seed(0)
    model = Transformer(**model_args, src_vocab_size=50, tgt_vocab_size=50, shared_vocab=True)
    model.eval()
    counted = 0
    for s, t in ((7, 5), (3, 9)):  # one sentence at a time: no padding
        src, tgt = torch.randint(4, 50, (1, s)), torch.randint(4, 50, (1, t))
        counted += _counted(model.forward_with_attention, src, torch.tensor([s]), tgt)
    assert forward_flops(cfg, [7, 3], [5, 9], 50) == counted


@torch.no_grad()
@pytest.mark.parametrize(
    ("attention", "bidirectional"), [("additive", True), ("dot", False), ("general", True)]
)
def test_gru_count_matches_torch_flop_counter(attention, bidirectional):
    cfg = {**TINY_GRU, "attention": attention, "bidirectional": bidirectional}
    model_args = {k: v for k, v in cfg.items() if k != "arch"}
    torch.manual_seed(0)
    model = GRUBahdanau(**model_args, src_vocab_size=50, tgt_vocab_size=40).eval()
    counted = 0
    for s, t in ((7, 5), (4, 8)):
        src, tgt = torch.randint(4, 50, (1, s)), torch.randint(4, 40, (1, t))
        counted += _counted(model, src, torch.tensor([s]), tgt)
    assert forward_flops(cfg, [7, 4], [5, 8], 40) == counted


PROJECTIONS = {
    "transformer": [
        "enc_attn_proj",
        "enc_ffn",
        "dec_self_attn_proj",
        "dec_cross_attn_proj",
        "dec_ffn",
        "output_proj",
    ],
    "gru": ["encoder_gru", "attn_keys", "attn_query", "decoder_gru", "pre_output", "output_proj"],
}
QUADRATIC = {
    "transformer": ["enc_attn_scores", "dec_self_attn_scores", "dec_cross_attn_scores"],
    "gru": ["attn_scores_context"],
}


@pytest.mark.parametrize("cfg", [TINY_TRANSFORMER, TINY_GRU], ids=["transformer", "gru"])
def test_projections_scale_linearly_in_tokens(cfg):
    kind = model_kind(cfg)
    src, tgt = [5, 9, 3], [6, 11, 4]
    one = forward_flops_breakdown(cfg, src, tgt, 30)
    double = forward_flops_breakdown(cfg, [2 * n for n in src], [2 * n for n in tgt], 30)
    for key in PROJECTIONS[kind]:
        assert one[key] > 0
        assert double[key] == 2 * one[key], key
    for key in QUADRATIC[kind]:  # attention over the sentence grows with its square
        assert double[key] == 4 * one[key], key
    # per sentence, so a batch costs the sum of its sentences
    parts = [forward_flops(cfg, [s], [t], 30) for s, t in zip(src, tgt, strict=True)]
    assert forward_flops(cfg, src, tgt, 30) == sum(parts)


def test_gru_count_by_components():
    e, h, c, a, v = 8, 16, 32, 12, 40  # C = 2H (bidirectional)
    s, t = 7, 5
    gru = gru_forward_flops(TINY_GRU, [s], [t], v)
    assert gru["encoder_gru"] == s * 2 * (mm(1, e, 3 * h) + mm(1, h, 3 * h)) + s * 2 * (
        mm(1, c, 3 * h) + mm(1, h, 3 * h)
    )
    assert gru["decoder_gru"] == t * (mm(1, e + c, 3 * h) + 2 * mm(1, h, 3 * h) + mm(1, h, 3 * h))
    assert gru["attn_scores_context"] == t * (mm(s, a, 1) + mm(1, s, c))
    assert gru["output_proj"] == mm(t, e, v)


def test_model_kind():
    assert model_kind(TINY_TRANSFORMER) == "transformer"
    assert model_kind(TINY_GRU) == "gru"
    with pytest.raises(ValueError, match="no FLOP count"):
        model_kind({"arch": "somewhere.Else"})
    assert transformer_forward_flops(TINY_TRANSFORMER, [], [], 10)["output_proj"] == 0


TRAIN_KEYS = {
    "precision", "steps", "step_seconds_median", "tgt_tokens_per_s", "src_tgt_tokens_per_s",
    "train_flops_per_tgt_token", "forward_flops_per_tgt_token", "forward_flops_share",
    "achieved_tflops", "peak_tflops", "mfu", "peak_memory_bytes", "memory_growth_bytes",
    "memory_method", "padding_share",
}  # fmt: skip
RUN_KEYS = {
    "beam", "batching", "cache", "sentences", "seconds", "sentences_per_s", "tgt_tokens",
    "tgt_tokens_per_s", "capped_share",
}  # fmt: skip
DECODE_RUNS = {
    "greedy_batched", "beam5_batched", "greedy_single", "beam5_single", "greedy_batched_no_cache",
}  # fmt: skip


@pytest.mark.slow(seconds=13)
def test_bench_quick_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, str(REPO / "scripts" / "bench.py"), "--quick", "--models", "transformer",
        "--steps", "2", "--max-tokens", "1024", "--sentences", "12", "--single-sentences", "3",
        "--device", "cpu", "--runs", str(tmp_path / "no_runs"), "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "weights=random" in proc.stdout
    result = json.loads(out.read_text())
    assert result["schema"] == "nmt-bench/1" and result["quick"] is True
    machine = result["machine"]
    for key in ("device_name", "torch", "torch_threads", "matmul_peak"):
        assert key in machine
    for precision in ("32", "bf16"):
        assert machine["matmul_peak"][precision]["tflops"] > 0
    model = result["models"]["transformer"]
    assert model["parameters"] > 0
    assert set(model["train"]) == set(result["settings"]["precisions"])
    for train in model["train"].values():
        assert set(train) >= TRAIN_KEYS
        assert train["steps"] == 2 and train["tgt_tokens_per_s"] > 0 and train["mfu"] > 0
        assert sum(train["forward_flops_share"].values()) == pytest.approx(1.0)
    decode = model["decode"]
    assert decode["weights"] == "random" and decode["test_set"] == "test_2016_flickr"
    assert set(decode["runs"]) == DECODE_RUNS
    for name, run in decode["runs"].items():
        assert set(run) >= RUN_KEYS, name
        assert run["sentences"] == (3 if "single" in name else 12)
        assert run["sentences_per_s"] > 0
    assert decode["runs"]["greedy_batched_no_cache"]["same_as_cached_greedy"] >= 0.9
    views = decode["attention_views"]  # --quick: one sentence, the default layers
    assert (views["sentences"], views["layers"]) == (1, "last")
    # the 3+3 Transformer: the alignment, every decoder layer's cross-attention as a head mean
    # and by head, and the last encoder and decoder self-attention layer
    assert views["pictures"] == 1 + 2 * 3 + 2
    assert len(views["samples"]) == 3 and views["seconds"] > 0
    assert "the attention views of 1 validation sentence(s) (9 pictures) drawn in" in proc.stdout


def test_bench_compile_and_override_options(tmp_path):
    s = speed.make_settings(
        device="cpu",
        compile="both",
        overrides=["model.attn_dropout=0", "model.dropout=0.2"],
        data_root=tmp_path,
    )
    assert s.compile_modes == [False, True]
    assert s.overrides == ["model.attn_dropout=0", "model.dropout=0.2"]
    cfg = speed.train_config("transformer", s)
    assert cfg.model.attn_dropout == 0 and cfg.model.dropout == 0.2
    plain = speed.make_settings(device="cpu", data_root=tmp_path)
    assert plain.compile_modes == [False] and plain.overrides == [] and plain.decode
    assert not speed.make_settings(decode=False, data_root=tmp_path).decode


def test_bench_settings_name_bad_values(tmp_path):
    with pytest.raises(SetupError, match="unknown model config.*nosuchmodel"):
        speed.make_settings(device="cpu", models="transformer,nosuchmodel", data_root=tmp_path)
    with pytest.raises(SetupError, match="--steps=0 must be >= 1"):
        speed.make_settings(device="cpu", steps=0, data_root=tmp_path)


def test_json_out_and_write_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default JSON file is dated under outputs/bench; ``--out`` is kept as given; the
    result is written whole, and its seconds are printed only where it has them."""
    default = json_out(None, "bench-x", tmp_path)
    assert default.parent == tmp_path / "outputs" / "bench"
    assert re.fullmatch(r"bench-x-\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.json", default.name)
    assert json_out(str(tmp_path / "mine.json"), "bench-x", tmp_path) == tmp_path / "mine.json"
    for result, tail in (({"seconds": 41.6, "a": [1]}, "(42 s)"), ({"wall_s": 3.0}, default.name)):
        write_result(default, result, "the report")
        assert json.loads(default.read_text()) == result
        out = capsys.readouterr().out
        assert out.startswith("the report\n") and out.rstrip().endswith(tail)
