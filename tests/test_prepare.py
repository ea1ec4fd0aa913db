"""Prepared training data: streaming preparation equals the in-memory encoding, the
sentencepiece sample, batch order kept from before the cache existed, several weighted corpora
and bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.config import ConfigError
from nmt.config_checks import TrainCorpus, train_corpora
from nmt.data import binarize
from nmt.data.batching import (
    BatchList,
    TokenBatchSampler,
    cut_batches,
    eval_batches,
)
from nmt.data.binarize import Reservoir
from nmt.data.corpus import DataError, clean_pairs, read_parallel
from nmt.data.datasets import prepare_data
from nmt.data.tokenizer import TokenizerPair, train_tokenizers
from nmt.train.command import train

from .helpers import compose_config, data_cfg, in_memory, tiny_run_overrides, write_subset

FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# --------------------------------------------------------------------------- exact ids


@pytest.mark.parametrize("workers, chunk", [(1, 20_000), (2, 700)])
def test_streaming_preparation_equals_the_in_memory_encoding(
    real_corpus: Path,
    joint_tok: TokenizerPair,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
    chunk: int,
) -> None:
    monkeypatch.setattr(binarize, "CHUNK_PAIRS", chunk)  # 2 workers: 5 chunks in 2 processes
    data = prepare_data(data_cfg(str(real_corpus), tmp_path, num_workers=workers), joint_tok)
    src_ids, tgt_ids, stats = in_memory(real_corpus, joint_tok)
    assert stats["dropped_empty"] == 2 and stats["dropped_too_long"] >= 1
    assert stats["dropped_ratio"] >= 1
    assert data.stats["train"] == stats
    assert len(data.train) == len(src_ids) == stats["kept"]
    assert [data.train.src(i).tolist() for i in range(len(src_ids))] == src_ids
    assert [data.train.tgt(i).tolist() for i in range(len(tgt_ids))] == tgt_ids
    manifest = json.loads((data.cache_dir / "manifest.json").read_text())
    assert manifest["workers"] == workers
    assert manifest["arrays"]["src.tokens"]["dtype"] == "<u2"  # 600 pieces fit in 16 bits
    assert isinstance(data.train.src_lens, np.memmap)


def test_trained_tokenizer_is_the_whole_corpus_one_when_it_fits_the_sample(
    real_corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nmt.data")
    data = prepare_data(data_cfg(str(real_corpus), tmp_path))
    assert "sentencepiece sample: 3002 of 3002 cleaned training pairs" in caplog.text
    src, tgt, _ = clean_pairs(*read_parallel(f"{real_corpus}.de", f"{real_corpus}.en"))
    caplog.clear()
    pair = train_tokenizers(src, tgt, tmp_path / "cache" / "spm", joint=True, vocab_size=600)
    assert "reusing" in caplog.text  # the same sentences in the same order: the same model
    assert pair.src.proto == data.tokenizers.src.proto
    src_ids, _, _ = in_memory(real_corpus, data.tokenizers)
    assert [data.train.src(i).tolist() for i in range(len(src_ids))] == src_ids
    smaller = prepare_data(data_cfg(str(real_corpus), tmp_path, spm_sample=500))
    assert "sentencepiece sample: 500 of 3002 cleaned training pairs" in caplog.text
    assert smaller.cache_dir != data.cache_dir  # data.spm_sample is part of the key
    assert smaller.tokenizers.src.proto != data.tokenizers.src.proto


def test_reservoir_sample_is_uniform_and_deterministic() -> None:
    stream = [str(i) for i in range(1000)]
    small = Reservoir(5000, seed=1)
    for k in range(0, 1000, 64):
        small.add(stream[k : k + 64], stream[k : k + 64])
    assert small.src == stream and small.seen == 1000  # fewer than the size: all, in order
    hits = np.zeros(1000)
    draws = []
    for seed in range(300):
        sample = Reservoir(100, seed)
        for k in range(0, 1000, 37):
            sample.add(stream[k : k + 37], stream[k : k + 37])
        assert len(sample.src) == 100 == len(set(sample.src)) and sample.src == sample.tgt
        hits[[int(x) for x in sample.src]] += 1
        draws.append(sample.src)
    again = Reservoir(100, 0)
    again.add(stream, stream)  # other block sizes give another draw, the same distribution
    assert len(again.src) == 100
    share = hits / 300  # each pair is drawn with probability 0.1
    assert abs(share.mean() - 0.1) < 1e-9
    assert 0.08 < share[:500].mean() < 0.12 and 0.08 < share[500:].mean() < 0.12
    assert share.max() < 0.25 and draws[0] != draws[1]


# --------------------------------------------------------------------------- batch order


# digests of TokenBatchSampler / eval_batches output computed with the code before the cache
BEFORE = {
    "0/1/0": ["d0c4a1ef4813565a", "4113a418c0780a4c", "d28ed69126e4157e"],
    "0/2/0": ["ee38dcd34e1e9d2a", "7f06e4d0c4529559", "33d0a3da078ab2dd"],
    "0/2/1": ["08f19abbe421d835", "42692d9fff77b946", "9ea36665c128dd2b"],
    "7/1/0": ["b36d570243ed35c7", "91be1f1e2ba86303", "a58bac094c78beed"],
    "7/2/0": ["7557f007b60b0510", "fda32259f04857b1", "0d3dbbc41d6b75c0"],
    "7/2/1": ["af96faf235183ade", "bfc35cb98c442b24", "8de3b3c8309880bc"],
    "eval": "11113e2b6aabf989",
}


def digest(batches: object) -> str:
    return hashlib.sha256(json.dumps([list(map(int, b)) for b in batches]).encode()).hexdigest()[
        :16
    ]


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_same_seed_gives_the_batches_of_before(dtype: type) -> None:
    rng = np.random.default_rng(2024)
    src = rng.integers(1, 80, 5000)
    tgt = np.clip(src + rng.integers(-10, 10, 5000), 0, 99)
    src, tgt = src.astype(dtype), tgt.astype(dtype)  # int32: as memory-mapped lengths are
    for seed in (0, 7):
        for ranks in (1, 2):
            for rank in range(ranks):
                s = TokenBatchSampler(src, tgt, 1500, seed=seed, num_replicas=ranks, rank=rank)
                got = [digest(s.batches(e)) for e in (0, 1, 5)]
                assert got == BEFORE[f"{seed}/{ranks}/{rank}"]
    assert digest(eval_batches(src, 1500, tgt)) == BEFORE["eval"]


def greedy_cut(order: np.ndarray, cost: np.ndarray, max_tokens: int) -> list[list[int]]:
    """The example-by-example loop that cut_batches replaces."""
    batches: list[list[int]] = []
    current: list[int] = []
    widest = 0
    for i in order.tolist():
        w = max(widest, int(cost[i]))
        if current and (len(current) + 1) * w > max_tokens:
            batches.append(current)
            current, w = [], int(cost[i])
        current.append(i)
        widest = w
    return batches + [current] if current else batches


@FAST
@given(
    cost=st.lists(st.integers(1, 70), max_size=300),
    max_tokens=st.integers(1, 400),
    seed=st.integers(0, 3),
)
def test_cut_batches_equals_the_greedy_loop(cost: list[int], max_tokens: int, seed: int) -> None:
    c = np.array(cost, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(c))
    got = cut_batches(order, c, max_tokens)
    assert isinstance(got, BatchList)
    assert got == greedy_cut(order, c, max_tokens)
    assert [list(b) for b in got[1::2]] == greedy_cut(order, c, max_tokens)[1::2]


# --------------------------------------------------------------------------- several corpora


def test_corpus_weights_give_the_expected_shares_per_epoch() -> None:
    sizes, weights = [1000, 3000, 500], [2.0, 0.5, 1.0]
    rng = np.random.default_rng(3)
    src, tgt = rng.integers(1, 30, sum(sizes)), rng.integers(1, 30, sum(sizes))
    corpora = list(zip(sizes, weights, strict=True))
    sampler = TokenBatchSampler(src, tgt, 600, seed=5, corpora=corpora)
    again = TokenBatchSampler(src, tgt, 600, seed=5, corpora=corpora)
    halves = []
    for epoch in (0, 1, 2):
        seen = np.array([i for b in sampler.batches(epoch) for i in b])
        assert sorted(seen.tolist()) == sorted(sampler.epoch_examples(epoch).tolist())
        counts = np.bincount(seen, minlength=sum(sizes))
        assert (counts[:1000] == 2).all()  # weight 2: every pair twice
        half = counts[1000:4000]
        assert set(half.tolist()) == {0, 1} and half.sum() == 1500  # weight 0.5: half, once
        assert (counts[4000:] == 1).all()
        halves.append(np.flatnonzero(half).tolist())
        assert again.batches(epoch) == sampler.batches(epoch)  # deterministic from the seed
    assert halves[0] != halves[1] != halves[2]  # a different half each epoch
    other = TokenBatchSampler(src, tgt, 600, seed=6, corpora=corpora)
    assert other.batches(0) != sampler.batches(0)
    plain = TokenBatchSampler(src, tgt, 600, seed=5)
    ones = TokenBatchSampler(src, tgt, 600, seed=5, corpora=[(n, 1.0) for n in sizes])
    assert ones.batches(1) == plain.batches(1)  # weights of 1: the unweighted epoch


def test_train_corpora_option() -> None:
    assert train_corpora("/c/train") == [TrainCorpus("/c/train", 1.0)]
    assert train_corpora(["/a:2", "b:0.25", "/x:y/z"]) == [
        TrainCorpus("/a", 2.0), TrainCorpus("b", 0.25), TrainCorpus("/x:y/z", 1.0),
    ]  # fmt: skip
    bad = {
        r"data\.train=\[\] names no training corpus": [],
        r"data\.train\[1\]='b:0': the sampling weight after ':' must be a number > 0": ["a", "b:0"],
        r"data\.train\[0\]=7 must be a non-empty split name": [7],
        r"data\.train=3 must be a corpus": 3,
    }
    for message, value in bad.items():
        with pytest.raises(ConfigError, match=message):
            train_corpora(value)
    cfg = compose_config(
        "train",
        [
            "data=parallel",
            "data.src_lang=de",
            "data.tgt_lang=en",
            "data.train=[/a/news:0.5,/b/crawl]",
            "data.valid=/a/dev",
        ],
    )
    assert train_corpora(cfg.data.train) == [TrainCorpus("/a/news", 0.5), TrainCorpus("/b/crawl")]


def test_several_weighted_corpora_train(
    multi30k: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, one_thread: None
) -> None:
    a = write_subset(multi30k, tmp_path / "a", "train", 120)
    b = write_subset(multi30k, tmp_path / "b", "train", 60, start=500)
    caplog.set_level(logging.INFO)
    overrides = tiny_run_overrides(
        a, tmp_path, "trainer.max_steps=3", "trainer.val_every=100", "trainer.threads=1",
        f"data.train=[{a}:2,{b}:0.5]",
    )  # fmt: skip
    result = train(compose_config("train", overrides), tmp_path / "run")
    assert result["state"]["step"] == 3
    assert f"corpus {a.name}: 120 pairs x weight 2 = 240 per epoch (88.9% of the epoch)" in (
        caplog.text
    )
    assert f"corpus {b.name}: 60 pairs x weight 0.5 = 30 per epoch (11.1% of the epoch)" in (
        caplog.text
    )
    data = prepare_data(compose_config("train", overrides).data)
    assert [(c.pairs, c.weight) for c in data.train_corpora] == [(120, 2.0), (60, 0.5)]
    assert len(data.train) == 180 and data.stats["train"]["read"] == 180


# --------------------------------------------------------------------------- bad input


def write(path: Path, data: bytes) -> None:
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


BAD_INPUTS = {
    "missing file": ({"tr.de": b"a\n"}, r"no en file for corpus prefix .*tr\.en\.gz"),
    "line counts": (
        {"tr.de": b"a\nb\nc\n", "tr.en": b"x\ny\n"},
        r"tr\.de has 3 lines, .*tr\.en has 2 lines",
    ),
    "invalid utf-8": (
        {"tr.de": b"a\nb\nc\n", "tr.en": b"x\ny\nz\xe9\n"},
        r"tr\.en:3: invalid UTF-8",
    ),
    "invalid utf-8, gzip, far": (
        {
            "tr.de": b"Hallo\n" * 300_000,
            "tr.en.gz": b"hi\n" * 234_566 + b"\xff\n" + b"hi\n" * 65_433,
        },
        r"tr\.en\.gz:234567: invalid UTF-8",
    ),
    "line counts, far": (
        {"tr.de": b"Hallo\n" * 300_000, "tr.en": b"hi\n" * 300_001},
        r"tr\.de has 300000 lines, .*tr\.en has 300001 lines",
    ),
    "empty result": (
        {"tr.de": b" \n\t\n", "tr.en": b"x\ny\n"},
        "read 2, dropped 2 with an empty side",
    ),
    "truncated gzip": (
        {"tr.de.gz": b"Ein Hund.\n" * 5000, "tr.en": b"A dog.\n" * 5000},
        r"tr\.de\.gz: not a valid gzip file",
    ),
}


@pytest.mark.parametrize("trained", [False, True], ids=["given tokenizer", "trained tokenizer"])
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gives_the_clear_errors_of_before(
    joint_tok: TokenizerPair, tmp_path: Path, case: str, trained: bool
) -> None:
    files, message = BAD_INPUTS[case]
    for name, data in files.items():
        write(tmp_path / name, data)
    if case == "truncated gzip":
        path = tmp_path / "tr.de.gz"
        path.write_bytes(path.read_bytes()[:-20])
    (tmp_path / "va.de").write_bytes(b"a\n")
    (tmp_path / "va.en").write_bytes(b"b\n")
    cfg = data_cfg(str(tmp_path / "tr"), tmp_path / "root", valid=str(tmp_path / "va"))
    with pytest.raises(DataError, match=message):
        prepare_data(cfg, None if trained else joint_tok)
    assert not (tmp_path / "root").exists()  # nothing left behind


def test_filtering_everything_names_the_limits(
    real_corpus: Path, joint_tok, tmp_path: Path
) -> None:
    with pytest.raises(DataError, match="read 3004, dropped 2 with an empty side, 3002 longer"):
        prepare_data(data_cfg(str(real_corpus), tmp_path / "root", max_len=1), joint_tok)
    assert not (tmp_path / "root").exists()
