"""Subword regularization (data.subword_alpha): a sampled segmentation per epoch, the same
text, reproducible from (seed, epoch), within the length limit, batched like the prepared
pairs, and a run that resumes as if never stopped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nmt.config import ConfigError
from nmt.config_checks import check_train_config
from nmt.data.batching import TokenBatchSampler, TokenDataset
from nmt.data.corpus import clean_pairs, read_parallel
from nmt.data.resegment import Resegmenter, TrainingEpochs, sample_segmentations
from nmt.data.tokenizer import train_tokenizers
from nmt.store.checkpoint import load_checkpoint
from nmt.train.command import train
from nmt.train.runlog import of_kind, read_events

from .helpers import compose_config, tiny_run_overrides

PAIRS = 400


@pytest.fixture(scope="module")
def texts(real_corpus):
    src, tgt, _ = clean_pairs(*read_parallel(f"{real_corpus}.de", f"{real_corpus}.en"))
    return src[:PAIRS], tgt[:PAIRS]


@pytest.fixture(scope="module")
def bpe_tok(real_corpus, tmp_path_factory):
    src, tgt, _ = clean_pairs(*read_parallel(f"{real_corpus}.de", f"{real_corpus}.en"))
    return train_tokenizers(
        src, tgt, tmp_path_factory.mktemp("bpe"), joint=True, vocab_size=600, model_type="bpe"
    )


def best(tokenizers, texts) -> TokenDataset:
    src, tgt = texts
    return TokenDataset(tokenizers.src.encode_batch(src), tokenizers.tgt.encode_batch(tgt))


def sides(ds: TokenDataset) -> list[tuple[list[int], list[int]]]:
    return [(ds.src(i).tolist(), ds.tgt(i).tolist()) for i in range(len(ds))]


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_an_epoch_is_the_same_text_cut_into_other_pieces(kind, joint_tok, bpe_tok, texts):
    tok = joint_tok if kind == "unigram" else bpe_tok
    train = best(tok, texts)
    ds = Resegmenter(train, tok, alpha=0.2, max_len=100, seed=1).epoch(0)
    assert len(ds) == len(train)
    for i in range(len(ds)):
        assert tok.src.decode(ds.src(i)) == texts[0][i]
        assert tok.tgt.decode(ds.tgt(i)) == texts[1][i]
    changed = sum(a != b for a, b in zip(sides(ds), sides(train), strict=True))
    assert changed > len(ds) // 2  # most pairs get another segmentation
    # sampled segmentations are finer than the best one on the whole
    assert ds.src_lens.sum() > train.src_lens.sum() and ds.tgt_lens.sum() > train.tgt_lens.sum()


def test_an_epoch_is_a_function_of_seed_and_epoch(joint_tok, texts):
    train = best(joint_tok, texts)
    first = Resegmenter(train, joint_tok, alpha=0.2, max_len=100, seed=1)
    epoch1 = sides(first.epoch(1))
    assert sides(first.epoch(0)) != epoch1
    assert sides(first.epoch(1)) == epoch1  # again, after another epoch was drawn
    # a new process's view (a resumed run, another rank) starts at epoch 1 directly
    assert sides(Resegmenter(train, joint_tok, 0.2, 100, seed=1).epoch(1)) == epoch1
    assert sides(Resegmenter(train, joint_tok, 0.2, 100, seed=2).epoch(1)) != epoch1


def test_a_sample_over_the_length_limit_keeps_the_prepared_ids(joint_tok, texts):
    train = best(joint_tok, texts)
    limit = int(np.percentile(np.maximum(train.src_lens, train.tgt_lens), 90))
    keep = np.flatnonzero(np.maximum(train.src_lens, train.tgt_lens) <= limit)
    train = train.subset(keep)  # what cleaning with data.max_len=limit leaves
    ds = Resegmenter(train, joint_tok, alpha=0.05, max_len=limit, seed=3).epoch(0)
    src_text = [texts[0][i] for i in keep]
    raw = sample_segmentations(joint_tok.src, src_text, 0.05, seed=3, epoch=0, side=0)
    over = {i for i, ids in enumerate(raw) if len(ids) > limit}
    assert over  # near-uniform sampling cuts some sentences past the limit
    for i, ids in enumerate(raw):
        assert ds.src(i).tolist() == (train.src(i).tolist() if i in over else ids)
    assert ds.src_lens.max() <= limit and ds.tgt_lens.max() <= limit


def test_training_epochs_batch_every_pair_once_under_the_budget(joint_tok, texts):
    train = best(joint_tok, texts)
    sampler = TokenBatchSampler(train.src_lens, train.tgt_lens, 900, seed=5)
    plain = TrainingEpochs(train, sampler, None)
    data, batches = plain(2)
    assert data is train and batches == sampler.batches(2)
    epochs = TrainingEpochs(train, sampler, Resegmenter(train, joint_tok, 0.2, 100, seed=5))
    for epoch in (0, 1):
        data, batches = epochs(epoch)
        assert data is not train
        seen = sorted(i for batch in batches for i in batch)
        assert seen == list(range(len(train)))
        for batch in batches:
            idx = np.asarray(batch)
            width = max(data.src_lens[idx].max(), data.tgt_lens[idx].max()) + 1
            assert len(idx) * width <= 900
        assert epochs(epoch)[0] is data  # one resegmentation per epoch


def test_ranks_cut_the_same_resegmented_epoch(joint_tok, texts):
    train = best(joint_tok, texts)
    shards = []
    for rank in (0, 1):
        sampler = TokenBatchSampler(train.src_lens, train.tgt_lens, 900, 9, True, 2, rank)
        epochs = TrainingEpochs(train, sampler, Resegmenter(train, joint_tok, 0.2, 100, seed=9))
        data, batches = epochs(3)
        shards.append((sides(data), [i for batch in batches for i in batch]))
    assert shards[0][0] == shards[1][0]  # both ranks see one segmentation
    assert not set(shards[0][1]) & set(shards[1][1])  # and split its pairs


def test_bad_subword_alpha_is_refused_by_name():
    def check(*extra):
        check_train_config(compose_config("train", list(extra)))

    check("data.subword_alpha=0.3")
    with pytest.raises(ConfigError, match="data.subword_alpha=-0.1"):
        check("data.subword_alpha=-0.1")
    with pytest.raises(ConfigError, match="data.subword_alpha=1.0 is BPE-dropout"):
        check("data.subword_alpha=1.0", "data.spm_model_type=bpe")
    check("data.subword_alpha=1.5")  # unigram: an exponent, sharper than the model
    with pytest.raises(ConfigError, match="data.subword_alpha: .*data.directions"):
        check("data.subword_alpha=0.1", "data.directions=[de-en,en-de]")


def test_a_resegmenting_run_resumes_as_if_never_stopped(corpus, tmp_path):
    def run(name, *extra):
        common = ("trainer.val_every=6", "trainer.seed=4", "data.subword_alpha=0.3")
        cfg = compose_config("train", tiny_run_overrides(corpus, tmp_path, *common, *extra))
        return train(cfg, tmp_path / "outputs" / "runs" / name)

    full = run("full", "trainer.max_steps=25")
    run("half", "trainer.max_steps=13")
    half_dir = tmp_path / "outputs" / "runs" / "half"
    run("ignored", "trainer.max_steps=25", f"trainer.resume={half_dir}")
    assert full["state"]["epoch"] >= 2  # the run crossed epochs, each resegmented
    plain = run("plain", "trainer.max_steps=25", "data.subword_alpha=0")
    a = load_checkpoint(tmp_path / "outputs" / "runs" / "full" / "checkpoints" / "last.pt")
    b = load_checkpoint(half_dir / "checkpoints" / "last.pt")
    c = load_checkpoint(tmp_path / "outputs" / "runs" / "plain" / "checkpoints" / "last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert not all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])
    assert plain["state"]["step"] == 25
    # the log gives each epoch's resegmentation; the first epoch's batches are of its pairs
    starts = of_kind(read_events(half_dir), "start")
    assert [e["step"] for e in starts] == [0, 13]
