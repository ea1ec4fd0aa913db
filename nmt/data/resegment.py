"""Subword regularization: every epoch sees the training pairs under a newly sampled segmentation.

With ``data.subword_alpha > 0`` each epoch re-encodes the training text with SentencePiece's
sampling instead of reading the one best segmentation from the prepared cache: a unigram model
samples a segmentation from its lattice, each weighted by its probability to the power
``alpha`` (Kudo, 2018: 0.1-0.5 is usual; smaller is closer to uniform), and a BPE model drops
each merge with probability ``alpha`` (BPE-dropout, Provilkov et al., 2020). The model sees
the same words cut into different pieces from one epoch to the next. Validation, test and
decoding keep the best segmentation.

An epoch's segmentation is a pure function of (seed, epoch): the text is encoded in fixed
chunks, each from its own seed, in this process, so a resumed run and every rank of a
distributed one rebuild the same epoch whatever the number of cores. A sampled side longer
than ``data.max_len`` keeps its prepared ids, so every pair still fits the batch budget.

The cost: the training text is held in memory (decoded once from the prepared ids), and each
epoch re-encodes it with one core at the epoch's start: about 1 s for Multi30k's 29,000 pairs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

from nmt.data.batching import BatchList, TokenBatchSampler, TokenDataset
from nmt.data.tokenizer import Tokenizer, TokenizerPair

log = logging.getLogger(__name__)

CHUNK = 4096  # sentences encoded from one seed


def _chunk_seed(seed: int, epoch: int, side: int, chunk: int) -> int:
    """SentencePiece's generator seed (32 bits) of one chunk of one side of one epoch."""
    return int(np.random.SeedSequence([seed, epoch, side, chunk, 5]).generate_state(1)[0])


def sample_segmentations(
    tokenizer: Tokenizer, texts: Sequence[str], alpha: float, seed: int, epoch: int, side: int
) -> list[list[int]]:
    """Sampled subword ids of ``texts`` (no BOS/EOS), the same for the same arguments."""
    out: list[list[int]] = []
    for k, start in enumerate(range(0, len(texts), CHUNK)):
        spm.set_random_generator_seed(_chunk_seed(seed, epoch, side, k))
        out += tokenizer.sample_batch(texts[start : start + CHUNK], alpha)
    return out


class Resegmenter:
    """The training pairs of ``train`` re-encoded with a sampled segmentation per epoch."""

    def __init__(
        self, train: TokenDataset, tokenizers: TokenizerPair, alpha: float, max_len: int, seed: int
    ) -> None:
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        self.train = train
        self.alpha, self.max_len, self.seed = float(alpha), int(max_len), int(seed)
        tic = time.perf_counter()
        # per side: its tokenizer, its text, and its prepared ids by pair
        self._sides = [
            (tok, [tok.decode(item(i)) for i in range(len(train))], item)
            for tok, item in ((tokenizers.src, train.src), (tokenizers.tgt, train.tgt))
        ]
        log.info(
            "subword sampling (data.subword_alpha=%g): %d training pairs decoded in %.1fs",
            alpha, len(train), time.perf_counter() - tic,
        )  # fmt: skip

    def _side(self, side: int, epoch: int) -> list[list[int]]:
        tok, texts, item = self._sides[side]
        ids = sample_segmentations(tok, texts, self.alpha, self.seed, epoch, side)
        for i, seq in enumerate(ids):
            if len(seq) > self.max_len:  # the prepared ids passed the cleaning's limit
                ids[i] = item(i).tolist()
        return ids

    def epoch(self, epoch: int) -> TokenDataset:
        """The training pairs of ``epoch``, in the order of ``train``."""
        tic = time.perf_counter()
        ds = TokenDataset(self._side(0, epoch), self._side(1, epoch))
        log.info(
            "epoch %d: training pairs resegmented in %.1fs (%d source, %d target pieces; "
            "%d and %d with the best segmentation)",
            epoch, time.perf_counter() - tic, int(ds.src_lens.sum()), int(ds.tgt_lens.sum()),
            int(self.train.src_lens.sum()), int(self.train.tgt_lens.sum()),
        )  # fmt: skip
        return ds


class TrainingEpochs:
    """Each epoch's training pairs and this rank's batches of them.

    Without a :class:`Resegmenter` every epoch reads ``train`` (the prepared cache) and the
    sampler's batches; with one, an epoch's pairs are resegmented and batched by their new
    lengths, under the same seed, budget, ranks and corpus weights.
    """

    def __init__(
        self, train: TokenDataset, sampler: TokenBatchSampler, resegmenter: Resegmenter | None
    ) -> None:
        self.train, self.sampler, self.resegmenter = train, sampler, resegmenter
        self._memo: tuple[int, TokenDataset, BatchList] | None = None

    def __call__(self, epoch: int) -> tuple[TokenDataset, BatchList]:
        if self.resegmenter is None:
            return self.train, self.sampler.batches(epoch)
        if self._memo is None or self._memo[0] != epoch:
            self._memo = None  # the previous epoch's pairs go before the next are built
            ds = self.resegmenter.epoch(epoch)
            sampler = self.sampler.with_lengths(ds.src_lens, ds.tgt_lens)
            self._memo = (epoch, ds, sampler.batches(epoch))
        return self._memo[1], self._memo[2]
