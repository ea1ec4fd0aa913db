"""Random sampling of translations (``sampling_topk``, ``sampling_topp``,
``sampling_temperature``, ``sampling_seed``): one translation per sentence drawn token by token
from the model's distribution instead of searched for, the output back-translation uses to make
varied synthetic sources (Edunov et al., 2018).

At each step the model's log-probabilities (after the search's own masks: no BOS, no EOS before
``min_output_len``, a forced first token) are divided by the temperature; of those only the
``topk`` most probable tokens are kept (ties with the k-th kept too; 0 keeps all), then, of
these renormalised, the smallest set of the most probable holding at least ``topp`` of the mass
(a token is kept while the tokens before it hold less than ``topp``: the nucleus of Holtzman et
al., 2020). The next token is drawn from what is kept, renormalised. This is the order and the
rule of transformers' temperature, top-k and top-p warpers; ``sampling_topk=1`` is greedy
search, as in CTranslate2.

Each draw is an inverse-CDF draw with a uniform number made from ``(seed, sentence, step)`` by a
counter-based generator (SplitMix64's mixing), where ``sentence`` is the sentence's line in
the input. A sentence's sample therefore depends on the seed and its own line only: not on its
batch mates, the batch size, the order of the batches or the number of threads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nmt.decode.options import DecodeOptions

NEG_INF = float("-inf")

# SplitMix64 (Steele, Lea and Flood, 2014): the increment and the two multipliers of its mixing
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
# odd constants that spread the sentence and the step over the counter
_SENTENCE = np.uint64(0xD6E8FEB86659FD93)
_STEP = np.uint64(0xA0761D6478BD642F)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 values (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, sentences: np.ndarray, step: int) -> np.ndarray:
    """Uniform numbers in [0, 1), float64, one per sentence: a function of ``seed``, each
    sentence's index (``sentences``, (A,) non-negative integers) and ``step`` alone."""
    with np.errstate(over="ignore"):
        key = _mix(np.uint64(seed % 2**64) * _GAMMA + np.ones(1, np.uint64))
        counter = key + sentences.astype(np.uint64) * _SENTENCE + np.uint64(step) * _STEP
        bits = _mix(_mix(counter) + _GAMMA)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53  # 53 random bits


@dataclass(frozen=True)
class Sampling:
    """What a sampled decode draws from: top-k (0: every token), top-p (1: no cut), the
    temperature, and the seed of the draws."""

    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 0

    @classmethod
    def of(cls, opts: DecodeOptions) -> Sampling | None:
        """What ``opts`` draw from, or None when they search (``sampling_topk=1``)."""
        if not opts.samples:
            return None
        topk, topp = int(opts.sampling_topk), float(opts.sampling_topp)
        return cls(topk, topp, float(opts.sampling_temperature), int(opts.sampling_seed))

    def log_probs(self, logp: Tensor) -> Tensor:
        """The log-probabilities (A, V), float32, of the distribution each row draws from:
        tokens cut by top-k or top-p get -inf (see the module docstring)."""
        scaled = logp.float() / self.temperature  # (A, V)
        vocab = scaled.size(-1)
        if 0 < self.topk < vocab:
            kth = scaled.topk(self.topk, dim=-1).values[:, -1:]  # (A, 1)
            scaled = scaled.masked_fill(scaled < kth, NEG_INF)
        scaled = torch.log_softmax(scaled, dim=-1)
        if self.topp < 1.0:
            ordered, order = scaled.sort(dim=-1, descending=True)  # (A, V) each
            probs = ordered.exp()
            before = probs.cumsum(dim=-1) - probs  # (A, V) the mass of the tokens before
            cut = before >= self.topp
            cut[:, 0] = False  # the most probable token is always kept
            scaled = scaled.scatter(1, order, ordered.masked_fill(cut, NEG_INF))
            scaled = torch.log_softmax(scaled, dim=-1)
        return scaled

    def draw(self, logp: Tensor, sentences: Tensor, step: int) -> Tensor:
        """One token per row (A,), drawn from :meth:`log_probs` of ``logp`` (A, V) with the
        uniform numbers of ``sentences`` (A,), each row's line in the input, at ``step``."""
        probs = self.log_probs(logp).double().exp()  # (A, V)
        cdf = probs.cumsum(dim=-1)  # (A, V)
        u = uniforms(self.seed, sentences.cpu().numpy(), step)  # (A,)
        target = torch.from_numpy(u).to(cdf.device)[:, None] * cdf[:, -1:]  # (A, 1)
        # the first token whose cumulative mass exceeds the target (never one of mass 0)
        token = torch.searchsorted(cdf, target, right=True).squeeze(1)  # (A,)
        return token.clamp(max=probs.size(-1) - 1)
