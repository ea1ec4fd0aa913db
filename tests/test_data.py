"""Data pipeline: tokenization, batching, preparation."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from nmt.config import DataConfig
from nmt.data.batching import (
    TokenBatchSampler,
    TokenDataset,
    eval_batches,
    make_batch,
    padding_share,
)
from nmt.data.corpus import (
    DataError,
    clean_pairs,
    read_lines,
    read_parallel,
)
from nmt.data.datasets import PreparedData, load_eval_set, load_test_sets, prepare_data
from nmt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    TokenizerPair,
    train_tokenizer,
    train_tokenizers,
)

from .helpers import write_file as write

FAST = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def prepared(multi30k_root: Path) -> PreparedData:
    """The multi30k_de_en data config, prepared end to end (trains the 8k tokenizer once)."""
    cfg = OmegaConf.structured(DataConfig(name="multi30k_de_en", root=str(multi30k_root)))
    return prepare_data(cfg)


@pytest.fixture(scope="module")
def small_tok(tmp_path_factory: pytest.TempPathFactory, multi30k_root: Path) -> Tokenizer:
    """A 500-piece tokenizer trained on 2,000 English training lines."""
    lines = read_lines(multi30k_root / "multi30k" / "train.en.gz")[:2000]
    return train_tokenizer(lines, tmp_path_factory.mktemp("spm"), vocab_size=500)


# --------------------------------------------------------------------------- tokenizer


def test_round_trip_every_test_line(prepared: PreparedData, multi30k_root: Path) -> None:
    base = multi30k_root / "multi30k"
    for lang, tok in (("de", prepared.tokenizers.src), ("en", prepared.tokenizers.tgt)):
        lines = [x.strip() for x in read_lines(base / f"test_2016_flickr.{lang}.gz")]
        ids = tok.encode_batch(lines)
        assert ids[:5] == [tok.encode(x) for x in lines[:5]]
        bad = [x for x, i in zip(lines, ids, strict=True) if tok.decode(i) != x]
        assert bad == []


def test_unseen_characters_byte_fallback(prepared: PreparedData) -> None:
    tok = prepared.tokenizers.src
    text = "Ein Schneemann ☃ sagt 你好  zweimal\tsehr\u2028laut"
    ids = tok.encode(text)
    assert UNK_ID not in ids
    assert tok.decode(ids) == text
    assert tok.decode([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == text
    assert tok.decode(torch.tensor(ids)) == text


def test_a_decoded_text_is_one_line(prepared: PreparedData) -> None:
    """Byte pieces can spell a line feed or a carriage return (a sampled output can hold
    them); they decode to spaces, so a file of outputs keeps one line per input."""
    tok = prepared.tokenizers.src
    lf, cr, ff = (tok._sp.PieceToId(f"<0x{b:02X}>") for b in (0x0A, 0x0D, 0x0C))
    assert UNK_ID not in (lf, cr, ff)
    ids = [*tok.encode("Ein Hund"), lf, *tok.encode("läuft"), cr, lf, ff]
    assert tok.decode(ids) == "Ein Hund  läuft  \x0c"  # "▁läuft" brings its own space
    assert len(tok.decode(ids).split("\n")) == 1


def test_special_ids(prepared: PreparedData) -> None:
    tok = prepared.tokenizers.src
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tok.pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tok.vocab_size == 8000
    assert tok.encode("") == [] and tok.decode([]) == ""
    assert all(isinstance(p, str) and p for p in tok.pieces(tok.encode("Ein Hund läuft.")))


def test_joint_pair_and_state_dict(prepared: PreparedData, small_tok: Tokenizer) -> None:
    pair = prepared.tokenizers
    assert pair.joint and pair.src is pair.tgt
    restored = TokenizerPair.from_state_dict(pair.state_dict())
    assert restored.joint and restored.src is restored.tgt
    assert restored.src.proto == pair.src.proto
    separate = TokenizerPair(src=pair.src, tgt=small_tok, joint=False)
    restored = TokenizerPair.from_state_dict(separate.state_dict())
    assert restored.tgt.vocab_size == 500 and restored.src.vocab_size == 8000


def test_save_load_from_proto(small_tok: Tokenizer, tmp_path: Path) -> None:
    small_tok.save(tmp_path / "a" / "m.model")
    loaded = Tokenizer.load(tmp_path / "a" / "m.model")
    assert loaded.proto == small_tok.proto
    assert Tokenizer.from_proto(small_tok.proto).encode("A dog.") == small_tok.encode("A dog.")
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["m.model"]
    with pytest.raises(DataError, match="not a valid SentencePiece model"):
        Tokenizer.from_proto(b"garbage")
    with pytest.raises(DataError, match="missing.model"):
        Tokenizer.load(tmp_path / "missing.model")


def test_cache_is_reused(
    prepared: PreparedData,
    multi30k_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = multi30k_root / "multi30k"
    src, tgt, _ = clean_pairs(*read_parallel(base / "train.de.gz", base / "train.en.gz"))

    def fail(*args, **kwargs):
        raise AssertionError("retrained instead of reusing the cache")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", fail)
    caplog.set_level(logging.INFO, logger="nmt.data")
    pair = train_tokenizers(src, tgt, multi30k_root / "cache" / "spm", joint=True, vocab_size=8000)
    assert pair.src.proto == prepared.tokenizers.src.proto
    assert "reusing" in caplog.text
    models = list((multi30k_root / "cache" / "spm").glob("*/spm.model"))
    assert len(models) == 1 and str(models[0]) in caplog.text


def test_small_training_and_cache_layout(tmp_path: Path, multi30k_root: Path) -> None:
    lines = read_lines(multi30k_root / "multi30k" / "val.de.gz")[:300]
    tok = train_tokenizer(lines, tmp_path, vocab_size=400, model_type="bpe")
    assert tok.vocab_size == 400
    (entry,) = tmp_path.iterdir()
    assert len(entry.name) == 64 and [p.name for p in entry.iterdir()] == ["spm.model"]
    assert all(tok.decode(tok.encode(x.strip())) == x.strip() for x in lines)


def test_vocab_too_large(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="smaller data.vocab_size"):
        train_tokenizer(["ein kleiner Hund", "a small dog"] * 5, tmp_path, vocab_size=5000)
    assert list(tmp_path.glob("*/spm.model")) == []


# --------------------------------------------------------------------------- batching


def test_token_dataset_and_make_batch() -> None:
    src = [[5, 6, 7], [8], []]
    tgt = [[9, 10], [11, 12, 13, 14], [15]]
    ds = TokenDataset(src, tgt)
    assert len(ds) == 3
    assert ds.src(0).tolist() == [5, 6, 7] and ds.tgt(1).tolist() == [11, 12, 13, 14]
    assert ds.src(0).dtype == torch.int32
    assert ds.src_lens.tolist() == [3, 1, 0] and ds.tgt_lens.tolist() == [2, 4, 1]
    b = make_batch(ds, [2, 0, 1])
    assert b.src.tolist() == [[EOS_ID, 0, 0, 0], [5, 6, 7, EOS_ID], [8, EOS_ID, 0, 0]]
    assert b.src_lens.tolist() == [1, 4, 2]
    assert b.tgt_in.tolist() == [
        [BOS_ID, 15, 0, 0, 0],
        [BOS_ID, 9, 10, 0, 0],
        [BOS_ID, 11, 12, 13, 14],
    ]
    assert b.tgt_out.tolist() == [
        [15, EOS_ID, 0, 0, 0],
        [9, 10, EOS_ID, 0, 0],
        [11, 12, 13, 14, EOS_ID],
    ]
    assert b.index.tolist() == [2, 0, 1] and b.n_tgt_tokens == 10
    assert b.tgt_positions.tolist() == [0, 1, 5, 6, 7, 10, 11, 12, 13, 14]  # non-PAD, row-major
    assert all(
        t.dtype == torch.long
        for t in (b.src, b.src_lens, b.tgt_in, b.tgt_out, b.index, b.tgt_positions)
    )
    assert len(b) == 3 and b.to("cpu").src.equal(b.src)
    sub = ds.subset([1, 2, 0, 1])
    assert [sub.src(i).tolist() for i in range(4)] == [[8], [], [5, 6, 7], [8]]
    assert [sub.tgt(i).tolist() for i in range(4)] == [
        [11, 12, 13, 14],
        [15],
        [9, 10],
        [11, 12, 13, 14],
    ]
    assert len(ds.subset([])) == 0


def check_budget(sampler: TokenBatchSampler, batches: list[list[int]]) -> None:
    for batch in batches:
        longest = max(max(sampler.src_lens[i], sampler.tgt_lens[i]) + 1 for i in batch)
        assert len(batch) * longest <= sampler.max_tokens


def test_sampler_on_real_data(prepared: PreparedData) -> None:
    ds = prepared.train
    sampler = TokenBatchSampler(ds.src_lens, ds.tgt_lens, max_tokens=4096, seed=1)
    epoch0 = sampler.batches(0)
    check_budget(sampler, epoch0)
    assert sorted(i for b in epoch0 for i in b) == list(range(len(ds)))
    share = padding_share(ds, epoch0)
    print(f"padding share on Multi30k train, max_tokens=4096: {share:.2%}")
    assert share < 0.15
    batch = make_batch(ds, epoch0[0])
    assert batch.src.numel() <= 4096 and batch.tgt_out.numel() <= 4096


def test_sampler_determinism() -> None:
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 60, 3000), rng.integers(1, 60, 3000)
    a = TokenBatchSampler(src, tgt, 1000, seed=3)
    b = TokenBatchSampler(src, tgt, 1000, seed=3)
    assert a.batches(0) == b.batches(0) and a.batches(5) == b.batches(5)
    assert a.batches(0) != a.batches(1)
    assert a.batches(0) != TokenBatchSampler(src, tgt, 1000, seed=4).batches(0)
    assert a.batches(2) == b.batches(2)
    fixed = TokenBatchSampler(src, tgt, 1000, shuffle=False)
    order = [i for batch in fixed.batches(0) for i in batch]
    assert fixed.batches(0) == fixed.batches(7)
    assert np.all(np.diff(src[order]) >= 0)


def test_sampler_two_ranks() -> None:
    rng = np.random.default_rng(1)
    src, tgt = rng.integers(1, 50, 2000), rng.integers(1, 50, 2000)
    ranks = [TokenBatchSampler(src, tgt, 800, seed=7, num_replicas=2, rank=r) for r in (0, 1)]
    for epoch in (0, 1):
        shares = [r.batches(epoch) for r in ranks]
        assert len(shares[0]) == len(shares[1]) > 0
        seen = [i for share in shares for batch in share for i in batch]
        assert len(seen) == len(set(seen))
        everything = ranks[0].global_batches(epoch)
        assert len(everything) - 2 * len(shares[0]) <= 1
        assert len(seen) >= 2000 - max(len(b) for b in everything)


@FAST
@given(
    lens=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=200),
    max_tokens=st.integers(41, 600),
    epoch=st.integers(0, 3),
)
def test_sampler_properties(lens: list[tuple[int, int]], max_tokens: int, epoch: int) -> None:
    src, tgt = np.array(lens).T
    sampler = TokenBatchSampler(src, tgt, max_tokens, seed=epoch)
    batches = sampler.batches(epoch)
    check_budget(sampler, batches)
    assert sorted(i for b in batches for i in b) == list(range(len(lens)))


def test_example_too_long() -> None:
    with pytest.raises(DataError, match=r"example 1 \(source 3 tokens, target 99 tokens"):
        TokenBatchSampler([1, 3, 2], [1, 99, 2], max_tokens=50)


def test_eval_batches() -> None:
    src = np.array([5, 30, 1, 12, 200, 7])
    batches = eval_batches(src, max_tokens=64)
    order = [i for b in batches for i in b]
    assert sorted(order) == list(range(6))
    assert list(src[order]) == sorted(src, reverse=True)
    assert batches[0] == [4]  # over the budget on its own, but never dropped
    for b in batches[1:]:
        assert len(b) * (max(src[b]) + 1) <= 64


# --------------------------------------------------------------------------- prepare_data


def test_prepare_multi30k(prepared: PreparedData, multi30k_root: Path) -> None:
    stats = prepared.stats["train"]
    assert stats["read"] == 29_000
    assert stats["kept"] == len(prepared.train) > 28_900
    assert stats["kept"] == (
        stats["read"] - stats["dropped_empty"] - stats["dropped_too_long"] - stats["dropped_ratio"]
    )
    assert max(prepared.train.src_lens.max(), prepared.train.tgt_lens.max()) <= 100
    assert prepared.stats["valid"] == {"val": 1014}
    assert prepared.stats["vocab"] == {"src": 8000, "tgt": 8000, "joint": True}
    base = multi30k_root / "multi30k"
    assert prepared.valid.name == "val"
    assert prepared.valid.ref_text == [x.strip() for x in read_lines(base / "val.en.gz")]
    assert prepared.valid.src_text == [x.strip() for x in read_lines(base / "val.de.gz")]
    cfg = OmegaConf.structured(DataConfig(name="multi30k_de_en", root=str(multi30k_root)))
    (test,) = load_test_sets(cfg, prepared.tokenizers)  # as nmt-eval reads them
    assert test.name == "test_2016_flickr" and len(test.data) == len(test.ref_text) == 1000
    tok = prepared.tokenizers.tgt
    assert test.data.tgt(3).tolist() == tok.encode(test.ref_text[3])


def parallel_cfg(tmp_path: Path, **overrides) -> object:
    cfg = DataConfig(
        name="toy",
        corpus="parallel",
        root=str(tmp_path / "root"),
        train=str(tmp_path / "tr"),
        valid=str(tmp_path / "va"),
        test=[],
    )
    return OmegaConf.merge(OmegaConf.structured(cfg), overrides)


def test_nothing_left_after_filtering(tmp_path: Path, prepared: PreparedData) -> None:
    write(tmp_path / "tr.de", "Ein Hund läuft.\nZwei Katzen.\n".encode())
    write(tmp_path / "tr.en", b"A dog runs.\nTwo cats.\n")
    write(tmp_path / "va.de", b"Hallo\n")
    write(tmp_path / "va.en", b"Hello\n")
    cfg = parallel_cfg(tmp_path, max_len=1)
    with pytest.raises(DataError, match="read 2, dropped 0 with an empty side, 2 longer than"):
        prepare_data(cfg, tokenizers=prepared.tokenizers)
    write(tmp_path / "tr.en", b"  \n\t\n")
    with pytest.raises(DataError, match="read 2, dropped 2 with an empty side"):
        prepare_data(parallel_cfg(tmp_path), tokenizers=prepared.tokenizers)
    assert not (tmp_path / "root").exists()


def test_training_data_leaves_the_test_splits_unread(
    tmp_path: Path, prepared: PreparedData
) -> None:
    """prepare_data locates the test files (a missing one fails before training) but never
    reads them: here the test file is not UTF-8, which only nmt-eval's reading reports."""
    write(tmp_path / "tr.de", "Ein Hund läuft.\nZwei Katzen.\n".encode())
    write(tmp_path / "tr.en", b"A dog runs.\nTwo cats.\n")
    write(tmp_path / "va.de", b"Hallo\n")
    write(tmp_path / "va.en", b"Hello\n")
    write(tmp_path / "te.de", b"\xff\xfe broken\n")
    write(tmp_path / "te.en", b"broken\n")
    cfg = parallel_cfg(tmp_path, test=[str(tmp_path / "te")])
    data = prepare_data(cfg, tokenizers=prepared.tokenizers)
    assert data.valid.src_text == ["Hallo"]
    assert data.stats["files"]["te"] == [str(tmp_path / "te.de"), str(tmp_path / "te.en")]
    with pytest.raises(DataError, match="te.de"):
        load_test_sets(cfg, data.tokenizers)
    missing = parallel_cfg(tmp_path, test=[str(tmp_path / "nowhere")])
    with pytest.raises(DataError, match="nowhere"):
        prepare_data(missing, tokenizers=prepared.tokenizers)


def test_prepare_parallel_keeps_eval_lines(tmp_path: Path, prepared: PreparedData) -> None:
    write(tmp_path / "tr.de", "Ein Hund läuft.\n\nZwei Katzen.\n".encode())
    write(tmp_path / "tr.en", b"A dog runs.\nNothing\nTwo cats.\n")
    write(tmp_path / "va.de.gz", b" Hallo \n\n")
    write(tmp_path / "va.en", b"Hello\n\n")
    data = prepare_data(parallel_cfg(tmp_path), tokenizers=prepared.tokenizers)
    assert data.stats["train"] == {
        "read": 3,
        "dropped_empty": 1,
        "dropped_too_long": 0,
        "dropped_ratio": 0,
        "kept": 2,
    }
    assert data.valid.src_text == ["Hallo", ""] and data.valid.ref_text == ["Hello", ""]
    assert data.valid.name == "va"
    ev = load_eval_set("extra", tmp_path / "va.de.gz", tmp_path / "va.en", data.tokenizers)
    assert len(ev.data) == 2 and ev.data.src_lens[1] == 0
