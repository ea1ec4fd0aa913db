"""The comparison with transformers' Seq2SeqTrainer and generate (benchmarks.hf_trainer,
scripts/bench_hf_trainer.py): the batches both sides train on, and the whole bench on a tiny
model, so that it keeps running as transformers and nmt change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import hf_trainer

from .helpers import REPO

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=80),
    budget=st.integers(1, 400),
    seed=st.integers(0, 5),
)
def test_token_batches_hold_every_pair_once_within_the_budget(lengths, budget, seed) -> None:
    src, tgt = [a for a, _ in lengths], [b for _, b in lengths]
    batches = hf_trainer.token_batches(src, tgt, budget, seed)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        longest = max(max(src[i], tgt[i]) for i in batch)
        assert len(batch) == 1 or len(batch) * longest <= budget
    assert batches == hf_trainer.token_batches(src, tgt, budget, seed)


def test_token_batches_group_pairs_of_about_the_same_length() -> None:
    src = [1, 50, 2, 51, 3, 52, 4, 53]
    batches = hf_trainer.token_batches(src, src, 110, seed=0)
    assert sorted(sorted(src[i] for i in b) for b in batches) == [[1, 2, 3, 4], [50, 51], [52, 53]]


@pytest.mark.slow(seconds=45)
def test_the_bench_times_both_sides_on_the_same_batches(multi30k: Path, tmp_path: Path) -> None:
    s = hf_trainer.Settings(
        work=tmp_path / "work", multi30k=multi30k, cwd=REPO, rounds=1, updates=4, skip=1,
        precisions=["32"], pairs=200, decode_sentences=16, decode_rounds=1, decode_length=4,
        quick=True,
    )  # fmt: skip
    result = hf_trainer.run(s)
    json.dumps(result)  # written as JSON
    fp32, auto = result["training"]["32"], result["training"]["auto"]
    (r,) = fp32["rounds"]
    assert r["ours"] > 0 and r["theirs"] > 0 and r["ours_precision"] == "32"
    # the same pairs in batches built the same way: about as many target tokens per update
    assert 0.5 < r["ours_tokens_per_update"] / r["theirs_tokens_per_update"] < 2
    assert auto["rounds"][0]["theirs"] == r["theirs"]  # their best precision: the only one
    for beam in ("beam1", f"beam{hf_trainer.BEAM}"):
        speeds = result["decoding"][beam]["sentences_per_s"]
        assert {"ours", "generate"} <= set(speeds) and min(speeds.values()) > 0
    assert "Seq2SeqTrainer" in hf_trainer.report(result)
