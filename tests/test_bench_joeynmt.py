"""scripts/bench_joeynmt.py: the parts that need no JoeyNMT install (log parsing, statistics)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bj():
    sys.path.insert(0, str(REPO / "scripts"))  # it imports bench
    spec = importlib.util.spec_from_file_location(
        "bench_joeynmt", REPO / "scripts" / "bench_joeynmt.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_STEP = (
    "2026-11-29 13:19:{sec},000 - INFO - joeynmt.training - Epoch   1, Step: {step:8d}, "
    "Batch Loss: 9.0, Batch Acc: 0.0, Tokens per Sec: {rate:8d}, Lr: 0.000010"
)
LOG = "\n".join(
    [
        "2026-11-29 13:19:40,000 - INFO - joeynmt.training - EPOCH 1",
        _STEP.format(sec=42, step=1, rate=800),
        _STEP.format(sec=44, step=2, rate=900),
        _STEP.format(sec=45, step=3, rate=1000),
    ]
)


def test_train_log_windows_after_the_skipped_steps(bj) -> None:
    stats = bj.parse_train_log(LOG, logging_freq=1, skip=1)
    assert stats["logged_windows"] == 3 and stats["timed_windows"] == 2
    assert stats["window_tokens_per_s"] == [900.0, 1000.0]
    assert stats["step_seconds"] == [2.0, 1.0]
    with pytest.raises(RuntimeError, match="no window after its first 5 steps"):
        bj.parse_train_log(LOG, logging_freq=1, skip=5)
    with pytest.raises(RuntimeError, match="EPOCH 1"):
        bj.parse_train_log("nothing logged\n", logging_freq=1, skip=0)


def test_decode_stats_count_eos_as_a_step_up_to_the_cap(bj) -> None:
    stats = bj.decode_stats([16, 3, 20], seconds=2.0, cap=17)
    assert stats["sentences"] == 3 and stats["sentences_per_s"] == 1.5
    assert stats["capped_share"] == pytest.approx(2 / 3)  # 16 tokens + EOS, and 20 cut to 17
