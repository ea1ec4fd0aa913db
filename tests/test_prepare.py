"""Prepared training data: streaming preparation, the binarized cache, its verification and
recovery, several weighted corpora, and batch order kept from before the cache existed."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from nmt.bench.memory import pss_parts
from nmt.config import ConfigError, DataConfig, TrainCorpus, train_corpora
from nmt.data import batching, binarize, cache
from nmt.data.batching import (
    BatchList,
    TokenBatchSampler,
    TokenDataset,
    cut_batches,
    eval_batches,
    make_batch,
    padding_share,
)
from nmt.data.binarize import Reservoir, ensure_prepared
from nmt.data.cache import CacheError, open_prepared
from nmt.data.corpus import DataError, clean_pairs, read_parallel
from nmt.data.datasets import prepare_data
from nmt.data.splits import filter_by_length
from nmt.data.synthetic import count_pairs, write_numbered_copies
from nmt.data.tokenizer import TokenizerPair, train_tokenizers
from nmt.train.command import train

from .helpers import REPO, compose_config, tiny_run_overrides, write_subset

FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# lines that the cleaning and the length filter drop (max_len 100, max_len_ratio 3)
ODD_PAIRS = [
    ("", "An empty source."),
    ("Ein leeres Ziel.", "   \t"),
    (" ".join(["Hund"] * 150), " ".join(["dog"] * 150)),
    ("Ja.", "Yes, and then a great many more words than the short source could ever justify."),
]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def real_corpus(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 real Multi30k training pairs plus a few that cleaning or filtering drops."""
    prefix = write_subset(multi30k, tmp_path_factory.mktemp("real"), "train", 3000)
    for lang, k in (("de", 0), ("en", 1)):
        with open(f"{prefix}.{lang}", "a", encoding="utf-8") as f:
            f.write("".join(pair[k] + "\n" for pair in ODD_PAIRS))
    return prefix


@pytest.fixture(scope="module")
def tok(real_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> TokenizerPair:
    """A joint 600-piece tokenizer trained on the corpus."""
    src, tgt, _ = clean_pairs(*read_parallel(f"{real_corpus}.de", f"{real_corpus}.en"))
    return train_tokenizers(src, tgt, tmp_path_factory.mktemp("spm"), joint=True, vocab_size=600)


def data_cfg(train: object, root: Path, **overrides: object) -> object:
    """A `parallel` de->en data config training on ``train`` and validating on its first."""
    first = train_corpora(train)[0].prefix
    cfg = DataConfig(
        name="t", corpus="parallel", src_lang="de", tgt_lang="en", root=str(root),
        train="x", valid=first, test=[], vocab_size=600, num_workers=1,
    )  # fmt: skip
    merged = OmegaConf.merge(OmegaConf.structured(cfg), overrides)
    merged.train = train
    return merged


def in_memory(prefix: Path, tokenizers: TokenizerPair, max_len: int = 100, ratio: float = 3.0):
    """The training split as the in-memory pipeline made it: ids of the kept pairs, stats."""
    src, tgt, stats = clean_pairs(*read_parallel(f"{prefix}.de", f"{prefix}.en"))
    src_ids, tgt_ids = tokenizers.src.encode_batch(src), tokenizers.tgt.encode_batch(tgt)
    lens = [np.array([len(ids) for ids in side]) for side in (src_ids, tgt_ids)]
    keep, drops = filter_by_length(*lens, max_len, ratio)
    stats.update(drops, kept=len(keep))
    return [src_ids[i] for i in keep], [tgt_ids[i] for i in keep], stats


def array_digests(cache_dir: Path) -> dict[str, str]:
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    return {name: info["sha256"] for name, info in manifest["arrays"].items()}


def final_dirs(root: Path) -> list[Path]:
    base = root / "cache" / "prepared"
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))


def flip_byte(path: Path, offset: int) -> None:
    """Change one byte in place (a negative offset counts from the end)."""
    offset = offset if offset >= 0 else path.stat().st_size + offset
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


# --------------------------------------------------------------------------- exact ids


@pytest.mark.parametrize("workers, chunk", [(1, 20_000), (2, 700)])
def test_streaming_preparation_equals_the_in_memory_encoding(
    real_corpus: Path,
    tok: TokenizerPair,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
    chunk: int,
) -> None:
    monkeypatch.setattr(binarize, "CHUNK_PAIRS", chunk)  # 2 workers: 5 chunks in 2 processes
    data = prepare_data(data_cfg(str(real_corpus), tmp_path, num_workers=workers), tok)
    src_ids, tgt_ids, stats = in_memory(real_corpus, tok)
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
    tok: TokenizerPair, tmp_path: Path, case: str, trained: bool
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
        prepare_data(cfg, None if trained else tok)
    assert not (tmp_path / "root").exists()  # nothing left behind


def test_filtering_everything_names_the_limits(real_corpus: Path, tok, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="read 3004, dropped 2 with an empty side, 3002 longer"):
        prepare_data(data_cfg(str(real_corpus), tmp_path / "root", max_len=1), tok)
    assert not (tmp_path / "root").exists()


# --------------------------------------------------------------------------- the cache


def test_second_open_reads_nothing_and_option_changes_give_new_keys(
    real_corpus: Path, tok: TokenizerPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = data_cfg(str(real_corpus), tmp_path)
    first = ensure_prepared(cfg, tok)
    assert final_dirs(tmp_path) == [first.path]

    def no_reading(*args, **kwargs):
        raise AssertionError("read the corpus again")

    with monkeypatch.context() as m:
        m.setattr(binarize, "iter_parallel_blocks", no_reading)
        m.setattr(cache, "sha256_file", no_reading)  # inputs known by their stat
        assert ensure_prepared(cfg, tok).path == first.path
    shorter = ensure_prepared(data_cfg(str(real_corpus), tmp_path, max_len=20), tok)
    assert shorter.path != first.path and shorter.pairs < first.pairs
    # an edited input (same size, other bytes) is a new key
    src = Path(f"{real_corpus}.de")
    copy = tmp_path / "copy"
    shutil.copy(src, f"{copy}.de")
    shutil.copy(f"{real_corpus}.en", f"{copy}.en")
    same = ensure_prepared(data_cfg(str(copy), tmp_path), tok)
    assert same.path == first.path  # the key is the content, not the path
    text = Path(f"{copy}.de").read_text().replace("Hund", "Hand", 1)
    Path(f"{copy}.de").write_text(text)
    assert ensure_prepared(data_cfg(str(copy), tmp_path), tok).path != first.path


def test_resumed_run_reuses_the_preparation_of_its_own_tokenizer(
    real_corpus: Path, tmp_path: Path
) -> None:
    cfg = data_cfg(str(real_corpus), tmp_path)
    trained = prepare_data(cfg)
    again = prepare_data(
        cfg, tokenizers=TokenizerPair.from_state_dict(trained.tokenizers.state_dict())
    )
    assert again.cache_dir == trained.cache_dir and len(final_dirs(tmp_path)) == 1


def test_memory_mapped_batches_equal_in_memory_ones(real_corpus: Path, tok, tmp_path) -> None:
    data = prepare_data(data_cfg(str(real_corpus), tmp_path), tok)
    src_ids, tgt_ids, _ = in_memory(real_corpus, tok)
    plain = TokenDataset(src_ids, tgt_ids)
    assert not data.train._src.flat.flags.writeable  # read-only memory map
    sampler = TokenBatchSampler(data.train.src_lens, data.train.tgt_lens, 800, seed=3)
    reference = TokenBatchSampler(plain.src_lens, plain.tgt_lens, 800, seed=3)
    assert sampler.batches(0) == reference.batches(0)
    compact = sampler.batches(0)  # a BatchList: padding counted with array operations
    assert isinstance(compact, BatchList)
    assert padding_share(data.train, compact) == pytest.approx(
        padding_share(plain, [list(b) for b in compact]), abs=1e-12
    )
    assert padding_share(data.train, compact[3:9]) == pytest.approx(
        padding_share(plain, list(compact[3:9])), abs=1e-12
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's warning about non-writable arrays
        for idx in sampler.batches(0)[:20]:
            a, b = make_batch(data.train, idx), make_batch(plain, idx)
            for name in ("src", "src_lens", "tgt_in", "tgt_out", "index", "tgt_positions"):
                assert getattr(a, name).equal(getattr(b, name)), name


def test_reading_a_large_mapped_side_keeps_its_pages_unmapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a whole epoch of batches, a memory-mapped side larger than RELEASE_ABOVE adds no
    mapped pages to the process (they would add the whole file without the release)."""
    rng = np.random.default_rng(0)
    lens = rng.integers(5, 40, 400_000).astype(np.int32)  # (N,)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = rng.integers(4, 8000, int(offsets[-1])).astype(np.uint16)  # about 18 MB
    for name, arr in (("tokens", tokens), ("offsets", offsets), ("lengths", lens)):
        np.save(tmp_path / f"{name}.npy", arr)
        (tmp_path / f"{name}.npy").read_bytes()  # in the page cache, as after a preparation

    def side() -> tuple[np.ndarray, ...]:
        return tuple(
            np.load(tmp_path / f"{n}.npy", mmap_mode="r") for n in ("tokens", "offsets", "lengths")
        )

    batches = TokenBatchSampler(lens, lens, 4096, seed=0).batches(0)
    growth = {}
    for bound in (1 << 40, 16 << 20):  # never release, then release (the files exceed 16 MB)
        monkeypatch.setattr(batching, "RELEASE_ABOVE", bound)
        ds = TokenDataset.from_arrays(side(), side())
        before = pss_parts(os.getpid())[2]
        for idx in batches:
            make_batch(ds, idx)
        growth[bound] = pss_parts(os.getpid())[2] - before
        del ds
    assert growth[1 << 40] > 20 << 20  # the whole of both sides' files became mapped
    assert growth[16 << 20] < 2 << 20


DAMAGE = {
    "array cut short": (lambda d: truncate(d / "src.tokens.npy", -3), "src.tokens.npy: .* bytes"),
    "array extended": (lambda d: append(d / "tgt.lengths.npy", b"\0\0\0\0"), "tgt.lengths.npy: "),
    "last byte flipped": (lambda d: flip_byte(d / "tgt.tokens.npy", -1), "last bytes do not match"),
    "array missing": (lambda d: (d / "src.offsets.npy").unlink(), r"src\.offsets\.npy: missing"),
    "header edited": (lambda d: edit_header(d / "tgt.offsets.npy"), r"tgt\.offsets\.npy: holds"),
    "manifest not json": (lambda d: truncate(d / "manifest.json", 40), "manifest.json: not valid"),
    "manifest counts": (lambda d: edit_manifest(d, pairs=5), "do not add up"),
    "model flipped": (lambda d: flip_byte(d / "spm.model", 100), r"spm\.model: sha256"),
    "middle byte flipped": (
        lambda d: flip_byte(d / "src.tokens.npy", 200),
        r"src\.tokens\.npy: sha256",
    ),
}


def truncate(path: Path, size: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:size] if size >= 0 else data[: len(data) + size])


def append(path: Path, extra: bytes) -> None:
    with open(path, "ab") as f:
        f.write(extra)


def edit_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(b"'<i8'")
    data[at : at + 5] = b"'<u8'"
    path.write_bytes(bytes(data))


def edit_manifest(cache_dir: Path, **changes: object) -> None:
    path = cache_dir / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_cache_is_reported_and_rebuilt(
    real_corpus: Path,
    tok: TokenizerPair,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damage: str,
) -> None:
    cfg = data_cfg(str(real_corpus), tmp_path)
    good = ensure_prepared(cfg, tok)
    before = array_digests(good.path)
    del good
    harm, message = DAMAGE[damage]
    harm(final_dirs(tmp_path)[0])
    caplog.set_level(logging.INFO, logger="nmt.data")
    full = damage == "middle byte flipped"  # only the checksums see it
    if full:
        damaged = final_dirs(tmp_path)[0]
        assert (damaged / "src.tokens.npy").stat().st_size > cache.TAIL_BYTES + 1000
        with pytest.raises(CacheError, match=message):
            open_prepared(damaged, full=True)
        open_prepared(damaged)  # the quick check at every open does not read the middle
    rebuilt = ensure_prepared(cfg, tok, verify=full)
    assert "rebuilding" in caplog.text
    warning = next(r for r in caplog.records if "rebuilding" in r.getMessage())
    assert warning.levelno == logging.WARNING
    assert re.search(message, warning.getMessage()), warning.getMessage()
    assert array_digests(rebuilt.path) == before
    open_prepared(rebuilt.path, full=True)
    assert final_dirs(tmp_path) == [rebuilt.path]
    leftovers = [p.name for p in (tmp_path / "cache" / "prepared").iterdir()]
    assert sorted(leftovers) == sorted([rebuilt.path.name, "inputs.json"])  # no lock, no temp


def test_nmt_prepare_command(real_corpus: Path, tmp_path: Path) -> None:
    overrides = [
        "data=parallel", "data.src_lang=de", "data.tgt_lang=en", f"data.train={real_corpus}",
        f"data.valid={real_corpus}", f"data.root={tmp_path}", "data.vocab_size=600",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "nmt.data.prepare", *overrides]
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    path = Path(first.stdout.strip())
    assert path.parent == tmp_path / "cache" / "prepared" and (path / "manifest.json").is_file()
    assert "train train0_3000: read 3004, dropped empty 2" in first.stderr
    flip_byte(path / "tgt.tokens.npy", 300)
    check = subprocess.run([*cmd[:3], "--verify", *overrides], cwd=REPO, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert check.returncode == 0, check.stderr[-3000:]
    assert f"{path / 'tgt.tokens.npy'}: sha256 does not match the manifest" in check.stderr
    assert Path(check.stdout.strip()) == path
    open_prepared(path, full=True)
    bad = subprocess.run([*cmd, "data.max_len=0"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "data.max_len=0 must be > 0" in bad.stderr
    probe = "import sys, nmt.data.prepare; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=REPO).stdout.strip() == "False"  # fmt: skip


# --------------------------------------------------------------------------- killed preparations


def wait_for(proc: subprocess.Popen, ready: Callable[[], bool], limit: float = 300) -> bool:
    """Poll ``ready`` until it holds (True) or the process ends (False)."""
    deadline = time.monotonic() + limit
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(0.003)
    return False


@pytest.mark.slow(seconds=15)
def test_preparation_killed_at_random_moments_never_leaves_a_used_cache(
    multi30k: Path, tmp_path: Path
) -> None:
    """SIGKILL (the preparing process and its two workers) at random moments and in each phase:
    sampling and sentencepiece, encoding, between the manifest and the rename. Whatever is under
    a final name verifies fully; the next run cleans up and builds the same arrays."""
    src, tgt = write_numbered_copies(
        multi30k / "train.de.gz", multi30k / "train.en.gz", tmp_path / "big", ("de", "en"), 70_000
    )
    assert count_pairs(src, tgt) == 70_000
    root = tmp_path / "root"
    base = root / "cache" / "prepared"
    overrides = [
        "data=parallel", "data.src_lang=de", "data.tgt_lang=en", f"data.train={tmp_path / 'big'}",
        f"data.valid={tmp_path / 'big'}", f"data.root={root}", "data.vocab_size=600",
        "data.spm_sample=3000", "data.num_workers=2",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "nmt.data.prepare", *overrides]
    log_file = tmp_path / "prepare.log"

    def spawn() -> subprocess.Popen:
        with open(log_file, "a") as out:
            out.write("\n===== start\n")
            return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip

    def log_has(text: str) -> Callable[[], bool]:
        start = log_file.stat().st_size
        return lambda: text in log_file.read_text()[start:]

    def encoding() -> bool:
        return any(p.stat().st_size > 4096 for p in base.glob(".tmp-*/src.tokens.npy"))

    def manifest() -> bool:
        return any(base.glob(".tmp-*/manifest.json"))

    tic = time.monotonic()
    ref = subprocess.run([*cmd, f"data.root={tmp_path / 'reference'}"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    duration = time.monotonic() - tic
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = array_digests(Path(ref.stdout.strip()))

    rng = random.Random(20241201)
    kinds = ["random"] * 4 + ["sentencepiece", "encoding", "manifest"]
    rng.shuffle(kinds)
    killed: dict[str, int] = {}
    report = []
    for kind in kinds:
        for _attempt in range(4):  # a kill aimed at a short phase can come too late
            proc = spawn()
            if kind == "random":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=rng.uniform(0.3, duration))
            else:
                ready = {"sentencepiece": log_has("sentencepiece sample:"),
                         "encoding": encoding, "manifest": manifest}[kind]  # fmt: skip
                if wait_for(proc, ready) and kind != "manifest":
                    time.sleep(rng.uniform(0.0, 0.3))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the preparing process and its workers
            proc.wait(timeout=60)
            on_disk = sorted(p.name[:12] for p in base.iterdir()) if base.is_dir() else []
            report.append(f"{kind}: exit {proc.returncode}, then {on_disk}")
            for final in final_dirs(root) if base.is_dir() else []:
                # anything under a final name is complete and verifies; rebuild it next time
                assert array_digests(open_prepared(final, full=True).path) == expected, report
                shutil.rmtree(final)
                shutil.rmtree(root / "cache" / "spm", ignore_errors=True)
            if proc.returncode == -signal.SIGKILL:
                killed[kind] = killed.get(kind, 0) + 1
                break
    assert set(killed) == set(kinds) and sum(killed.values()) >= 6, report
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert array_digests(Path(done.stdout.strip())) == expected
    left = [p.name for p in base.iterdir() if p.name.startswith(".")]
    assert left == [], (left, report)  # temporary directories and locks of the kills swept
