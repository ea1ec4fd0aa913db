"""The profile of a training step and of decoding (benchmarks.profiling, ``bench.py --profile``)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import profiling
from benchmarks.report import SetupError

REPO = Path(__file__).resolve().parents[1]
PHASES = {"batch", "forward", "backward", "clip", "optimizer"}


def bench_script():
    spec = importlib.util.spec_from_file_location("bench_script", REPO / "scripts" / "bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OPERATOR_KINDS = {
    "aten::mm": "matrix products",
    "aten::addmm": "matrix products",
    "aten::_to_copy": "casts and copies",
    "aten::copy_": "casts and copies",
    "aten::native_layer_norm_backward": "normalisation",
    "aten::_softmax": "softmax",
    "aten::native_dropout": "dropout and masks",
    "aten::_foreach_mul_": "optimizer",
    "aten::index_select": "gather and scatter",
    "aten::transpose": "reshapes and views",
    "aten::add_": "elementwise",
    "aten::addcdiv_": "elementwise",
    "something::else": "other",
}


def test_operators_fall_into_kinds():
    for name, kind in OPERATOR_KINDS.items():
        assert profiling.kind_of(name) == kind, name


def test_layers_of_a_stack_are_pooled_by_name():
    assert (
        profiling.module_label("encoder_layers.3.self_attn") == "module::encoder_layers.*.self_attn"
    )
    assert profiling.module_label("encoder_layers.12") == "module::encoder_layers.*"
    assert profiling.module_label("out_proj") == "module::out_proj"
    assert profiling.module_label("layer2.norm1") == "module::layer2.norm1"  # a digit in a name


def test_module_ranges_nest_and_leave_no_hooks():
    net = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU()),
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()),
        torch.nn.Linear(64, 8),
    )
    x = torch.randn(16, 32)
    with profiling.labelled_modules(net), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            net(x)
    events = {e.key: e for e in prof.key_averages()}
    # the two inner stacks pool into one row per position; each ran 3 times per stack
    assert events["module::*"].count == 3 * 3
    assert events["module::*.*"].count == 3 * 2 * 2
    # a module's time includes its children's
    assert events["module::*"].cpu_time_total >= events["module::*.*"].cpu_time_total
    for module in net.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


@pytest.mark.slow(seconds=20)
def test_profile_run_groups_a_step_by_phase_module_and_operator(tmp_path, capsys):
    out = tmp_path / "profile.json"
    argv = [
        "--profile", "--quick", "--models", "transformer", "--precision", "32", "--steps", "2",
        "--warmup", "1", "--max-tokens", "1024", "--sentences", "6", "--device", "cpu",
        "--runs", str(tmp_path / "no_runs"), "--out", str(out),
    ]  # fmt: skip
    assert bench_script().main(argv) == 0
    printed = capsys.readouterr().out
    assert "transformer training step, 32" in printed and "operator kind (self time)" in printed
    result = json.loads(out.read_text())
    assert result["schema"] == profiling.SCHEMA
    train = result["models"]["transformer"]["train"]["32"]
    assert train["steps"] == 2 and train["wall_seconds_per_step"] > 0
    assert set(train["phases"]) == PHASES
    covered = sum(p["share"] for p in train["phases"].values())
    assert 0.8 <= covered <= 1.0 + 1e-6  # the phases are the step; the rest is the loop
    for rows in ("phases", "modules", "operator_kinds", "operators"):
        for name, row in train[rows].items():
            assert 0 <= row["share"] <= 1.0 + 1e-6, (rows, name)
    # the forward of the model's parts, layers pooled; none of them outlasts the forward phase
    modules = train["modules"]
    assert "encoder_layers.*.self_attn" in modules and "decoder_layers.*.cross_attn" in modules
    assert not any(re.search(r"\.\d+(\.|$)", name) for name in modules)
    forward = train["phases"]["forward"]["seconds_per_step"]
    assert max(m["seconds_per_step"] for m in modules.values()) <= forward * 1.05
    # operators' self time accounts for the step, and the kinds sum to the operators
    assert 0.5 <= train["operator_self_share"] <= 1.0 + 1e-6
    kinds = sum(k["share"] for k in train["operator_kinds"].values())
    assert kinds == pytest.approx(train["operator_self_share"], rel=1e-6)
    assert train["operator_kinds"]["matrix products"]["share"] > 0
    assert "aten::mm" in train["operators"] or "aten::addmm" in train["operators"]
    decode = result["models"]["transformer"]["decode"]
    assert decode["weights"] == "random"
    assert set(decode["runs"]) == {"greedy_batched", "beam5_batched"}
    for run in decode["runs"].values():
        assert run["sentences"] == 6
        assert set(run["phases"]) == {"search"}
        assert run["phases"]["search"]["share"] == pytest.approx(1.0, abs=0.05)
        assert "decoder_layers.*.self_attn" in run["modules"]


def test_profile_writes_a_dated_file_by_default(tmp_path, monkeypatch):
    script = bench_script()
    seen = {}

    def fake_make_settings(**kwargs):
        seen.update(kwargs)
        raise SetupError("stop here")

    monkeypatch.setattr(script.speed, "make_settings", fake_make_settings)
    assert script.main(["--profile", "--device", "cpu"]) == 2
    assert re.search(r"outputs/bench/profile-[\d-]+_[\d-]+\.json$", seen["out"])
    assert seen["sentences"] == script.PROFILE_SENTENCES
