"""The paired bootstrap test of a mean: two models compared on several test sets at once (a
multilingual model against the bilingual models it replaces, direction by direction, or two
multilingual models), by the mean over the sets of the system's BLEU minus the baseline's.

One set's BLEU difference is what sacreBLEU's paired bootstrap tests
(:func:`~nmt.evaluate.metrics.paired_bootstrap`). Several sets are not one corpus: their
languages differ, so their sentences are not pooled into one BLEU. Each resample instead draws
every set's sentences with replacement, independently of the other sets, rescores both sides
of each set on its drawn sentences, and takes the mean over the sets of the differences. The
p-value is computed as sacreBLEU's (Koehn 2004, as the Moses script does it): how often the
resampled absolute mean difference, centred on its own mean, exceeds the observed one (for a
difference clearly away from 0, one tail of the resampled differences: see
:func:`~nmt.evaluate.metrics.paired_bootstrap`); two sides with the same hypotheses
everywhere get p = 1, as one set's test gives them. With a single set the draws, the scores
and the p-value are sacreBLEU's own, resample for resample. The 95% interval of the mean
difference is the 2.5th and 97.5th percentile of its resampled values, the rule sacreBLEU uses
for one score's interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics import BLEU

from nmt.evaluate.metrics import _paper_metric, moses_tokenize


@dataclass(frozen=True)
class SetPair:
    """One set as both sides decoded it: the references, and each side's hypotheses, line by
    line; ``paper_lang`` scores it on the papers' metric in that target language."""

    baseline: Sequence[str]
    system: Sequence[str]
    references: Sequence[str]
    paper_lang: str | None = None

    def __post_init__(self) -> None:
        if not len(self.baseline) == len(self.system) == len(self.references):
            raise ValueError(
                f"{len(self.baseline)} baseline and {len(self.system)} system hypotheses for "
                f"{len(self.references)} references"
            )
        if not self.references:
            raise ValueError("a set without sentences has no score")


@dataclass(frozen=True)
class MeanDifference:
    """The mean over the sets of the system's score minus the baseline's, its 95% bootstrap
    interval and the p-value of the paired test."""

    difference: float
    low: float
    high: float
    p_value: float
    sets: int


def _stats(pair: SetPair) -> tuple[BLEU, np.ndarray, np.ndarray]:
    """The metric of a set and both sides' sentence statistics, as sacreBLEU keeps them."""
    base, system, refs = pair.baseline, pair.system, pair.references
    metric = BLEU()
    if pair.paper_lang is not None:
        lang, metric = pair.paper_lang, _paper_metric()
        base, system, refs = (moses_tokenize(x, lang) for x in (base, system, refs))
    sides = [
        np.array(metric._extract_corpus_statistics(list(x), [list(refs)]), dtype="float32")
        for x in (base, system)
    ]
    return metric, sides[0], sides[1]


def mean_difference(pairs: Sequence[SetPair], resamples: int, seed: int) -> MeanDifference:
    """The paired bootstrap test of the mean BLEU difference over ``pairs`` (see the module
    docstring): ``resamples`` resampled versions of every set, the generator seeded by ``seed``
    and drawing the sets' sentences in the order of ``pairs``."""
    if not pairs:
        raise ValueError("no sets to compare")
    if resamples < 1:
        raise ValueError(f"resamples={resamples}: at least 1 needed")
    if all(list(p.baseline) == list(p.system) for p in pairs):  # as paired_bootstrap says
        return MeanDifference(0.0, 0.0, 0.0, 1.0, len(pairs))
    rng = np.random.default_rng(seed)
    observed, resampled = [], []
    for pair in pairs:
        metric, base, system = _stats(pair)
        score = metric._compute_score_from_stats
        observed.append(score(system.sum(0)).score - score(base.sum(0)).score)
        draws = rng.choice(len(base), size=(resamples, len(base)), replace=True)
        resampled.append(
            np.array([score(s.sum(0)).score for s in system[draws]])
            - np.array([score(b.sum(0)).score for b in base[draws]])
        )
    difference = float(np.mean(observed))
    means = np.mean(resampled, axis=0)
    spread = np.abs(means)
    centred = spread - spread.mean()
    p_value = (int(np.sum(centred > abs(difference))) + 1) / (resamples + 1)
    low, high = np.sort(means)[[resamples // 40, resamples - resamples // 40 - 1]]
    return MeanDifference(difference, float(low), float(high), p_value, len(pairs))
