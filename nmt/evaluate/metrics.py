"""Corpus-level scores with sacreBLEU, on detokenized hypotheses against raw references.

BLEU and chrF come with sacreBLEU's bootstrap 95% confidence interval when asked
(``resamples`` > 0), and :func:`paired_bootstrap` runs sacreBLEU's paired bootstrap
resampling test of several systems against a baseline on the same sentences.

:func:`paper_bleu` is the BLEU of the Multi30k literature (multi-bleu.perl or fairseq's BLEU4
over the official ``*.lc.norm.tok`` files): hypotheses and references lowercased, normalized
and tokenized by Moses' rules for the target language (:func:`moses_tokenize`, sacremoses),
then scored as they are. It is reported beside the sacreBLEU figures, never in their place.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib.metadata import version

import numpy as np
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric
from sacrebleu.significance import PairedTest, _bootstrap_resample, estimate_ci

from nmt.config import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, ConfigError
from nmt.environment import sacrebleu_seed

MIN_RESAMPLES = 100  # fewer cannot place the 2.5th and 97.5th percentiles of the resamples


@dataclass
class Interval:
    """A 95% bootstrap confidence interval of a corpus score, as sacreBLEU estimates it.

    The corpus is resampled ``resamples`` times (sentences drawn with replacement, RNG seeded
    with ``seed``) and rescored; the interval is the mean of those scores ± half the distance
    between their 2.5th and 97.5th percentiles (``low`` = mean - half_width).
    """

    low: float
    high: float
    mean: float
    half_width: float
    resamples: int
    seed: int

    @classmethod
    def around(cls, mean: float, half_width: float, resamples: int, seed: int) -> Interval:
        mean, half_width = float(mean), float(half_width)  # sacreBLEU hands numpy floats
        return cls(mean - half_width, mean + half_width, mean, half_width, resamples, seed)

    def text(self) -> str:
        return f"95% CI [{self.low:.2f}, {self.high:.2f}]"


@dataclass
class Score:
    name: str  # BLEU | chrF2 | TER | BLEU-lc
    score: float
    signature: str
    detail: str  # sacreBLEU's one-line summary (n-gram precisions, brevity penalty, ...)
    length_ratio: float | None = None  # BLEU: hypothesis / reference length (tokens)
    ci: Interval | None = None  # bootstrap 95% confidence interval, when asked for

    def line(self) -> str:
        ci = f"  {self.ci.text()}" if self.ci is not None else ""
        return f"{self.detail}{ci}  [{self.signature}]"

    def as_dict(self) -> dict:
        return asdict(self)


def check_bootstrap(resamples: int, seed: int, resamples_key: str, seed_key: str) -> None:
    """Raise :class:`ConfigError` naming the option when resampling cannot be done as asked."""
    if resamples != 0 and resamples < MIN_RESAMPLES:
        raise ConfigError(
            f"{resamples_key}={resamples}: use 0 (no interval) or at least {MIN_RESAMPLES} "
            "resamples"
        )
    if seed < 1:  # sacreBLEU's paired test takes a seed of 0 for "no seed"
        raise ConfigError(f"{seed_key}={seed} must be a positive integer")


@contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacreBLEU reads its resampling seed from ``SACREBLEU_SEED`` only: set it for one call
    (and keep its progress messages out of our log)."""
    logger = logging.getLogger("sacrebleu")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with sacrebleu_seed(seed):
            yield
    finally:
        logger.setLevel(level)


def _check_lengths(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(
            f"{len(hyps)} hypotheses but {len(refs)} references: the files must have one line "
            "per sentence"
        )


def _score(
    metric: Metric, name: str, hyps: Sequence[str], refs: Sequence[str], resamples: int, seed: int
) -> Score:
    """The corpus score with its plain signature, then (``resamples`` > 0) its interval."""
    _check_lengths(hyps, refs)
    result = metric.corpus_score(hyps, [refs])
    score = Score(name, result.score, str(metric.get_signature()), str(result))
    if hasattr(result, "sys_len"):  # BLEU
        score.length_ratio = result.sys_len / result.ref_len if result.ref_len else 0.0
    if resamples:
        score.ci = _bootstrap(metric, hyps, refs, resamples, seed)
    return score


def _bootstrap(
    metric: Metric, hyps: Sequence[str], refs: Sequence[str], resamples: int, seed: int
) -> Interval:
    """sacreBLEU's bootstrap estimate: its resamples of the metric's sentence statistics and
    its percentile interval (:func:`sacrebleu.significance.estimate_ci`), taken on each
    resample's score as a float. ``corpus_score(n_bootstrap=...)`` would average the scores
    as they come and fails ("don't know how to coerce float and float32") when some chrF
    resamples score 0 and others do not, as on a short or poorly translated set."""
    stats = metric._extract_corpus_statistics(list(hyps), [list(refs)])
    with _sacrebleu_seed(seed):
        _, scores = _bootstrap_resample(stats, metric, resamples)
    mean, half_width = estimate_ci(np.array([float(s.score) for s in scores]))
    return Interval.around(mean, half_width, resamples, seed)


def bleu(
    hyps: Sequence[str],
    refs: Sequence[str],
    lowercase: bool = False,
    resamples: int = 0,
    seed: int = BOOTSTRAP_SEED,
) -> Score:
    """Corpus BLEU on detokenized text with the default 13a tokenizer; cased unless asked.

    The standard figure is cased. ``lowercase=True`` gives the lowercased, 13a-tokenized
    BLEU that is closer to the figures of tutorials scoring lowercased word tokens; it is
    reported as ``BLEU-lc`` and never in place of the cased score.
    """
    name = "BLEU-lc" if lowercase else "BLEU"
    return _score(BLEU(lowercase=lowercase), name, hyps, refs, resamples, seed)


def chrf(
    hyps: Sequence[str], refs: Sequence[str], resamples: int = 0, seed: int = BOOTSTRAP_SEED
) -> Score:
    return _score(CHRF(), "chrF2", hyps, refs, resamples, seed)


def ter(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    return _score(TER(), "TER", hyps, refs, 0, BOOTSTRAP_SEED)


def all_scores(
    hyps: Sequence[str],
    refs: Sequence[str],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> list[Score]:
    """BLEU and chrF2 with their bootstrap intervals (none for ``resamples=0``), TER, then the
    lowercased BLEU for comparison with tutorial figures."""
    return [
        bleu(hyps, refs, resamples=resamples, seed=seed),
        chrf(hyps, refs, resamples=resamples, seed=seed),
        ter(hyps, refs),
        bleu(hyps, refs, lowercase=True),
    ]


PAPER_NAME = "BLEU (lowercased, Moses-tokenized)"
PAPER_DESCRIPTION = (
    "the metric of the Multi30k papers (multi-bleu.perl / fairseq BLEU4 on the official "
    "*.lc.norm.tok files), not sacreBLEU's: hypotheses and references lowercased, "
    "Moses-normalized and Moses-tokenized (sacremoses, the target language's rules, escaped "
    "as the official files are), then corpus BLEU on those tokens (sacreBLEU, tokenize=none)"
)


@functools.lru_cache(maxsize=16)
def _moses(lang: str) -> Callable[[str], str]:
    """Moses' preprocessing of one line as the Multi30k ``*.lc.norm.tok`` files were made:
    ``lowercase.perl | normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG``."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)

    def run(line: str) -> str:
        # the Perl script reads each line with its newline, which some of its rules match (a
        # quote after a sentence's final full stop is moved before it in French or German)
        text = normalizer.normalize(line.strip().lower() + "\n")
        return str(tokenizer.tokenize(text, return_str=True, escape=True)).strip()

    return run


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """``lines`` lowercased, punctuation-normalized and tokenized by Moses' rules for ``lang``
    (a language Moses has no rules for gets its defaults), with its HTML escapes (``&apos;``,
    ``&quot;``, ...) as in the official files: tokens joined by single spaces."""
    run = _moses(lang)
    return [run(line) for line in lines]


def _paper_metric() -> BLEU:
    """sacreBLEU's BLEU as the papers' metric scores Moses tokens: lowercased, split on spaces
    only (``force``: the input is tokenized on purpose)."""
    return BLEU(lowercase=True, tokenize="none", force=True)


def paper_bleu(
    hyp_tokens: Sequence[str],
    ref_tokens: Sequence[str],
    lang: str,
    resamples: int = 0,
    seed: int = BOOTSTRAP_SEED,
) -> Score:
    """:data:`PAPER_NAME` of hypotheses and references already put through
    :func:`moses_tokenize` in ``lang`` (the references once per test set): lowercased BLEU on
    the Moses tokens as they are, with its bootstrap interval when ``resamples`` > 0."""
    score = _score(_paper_metric(), PAPER_NAME, hyp_tokens, ref_tokens, resamples, seed)
    score.signature += f"|moses:lc+norm+tok-{lang}|sacremoses:{version('sacremoses')}"
    return score


def paper_entry(
    hyps: Sequence[str],
    ref_tokens: Sequence[str],
    lang: str,
    resamples: int = 0,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """A report's ``bleu_paper`` field: :func:`paper_bleu` of the detokenized ``hyps`` with
    its description and language."""
    score = paper_bleu(moses_tokenize(hyps, lang), ref_tokens, lang, resamples, seed)
    return {**score.as_dict(), "language": lang, "description": PAPER_DESCRIPTION}


def paper_line(entry: dict) -> str:
    """The printed line of a ``bleu_paper`` field."""
    ci = entry["ci"]
    interval = f"  95% CI [{ci['low']:.2f}, {ci['high']:.2f}]" if ci else ""
    return f"{entry['name']} = {entry['score']:.2f}{interval}  (the papers' metric)"


@dataclass
class Paired:
    """One system's BLEU in a paired test: its score, interval and p-value against the
    baseline (None for the baseline itself)."""

    score: float
    ci: Interval
    p_value: float | None


SIGNIFICANCE = 0.05  # the p-value under which a paired difference is reported as significant


def paired_bootstrap(
    baseline: Sequence[str],
    systems: Sequence[Sequence[str]],
    refs: Sequence[str],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    paper_lang: str | None = None,
) -> tuple[Paired, list[Paired]]:
    """sacreBLEU's paired bootstrap resampling test (Koehn 2004, as the Moses script does it)
    of each system's BLEU against the baseline's.

    Every system is rescored on the same ``resamples`` resampled test sets as the baseline.
    The p-value is sacreBLEU's (the Moses script's): how often the resampled absolute
    difference, less its mean, exceeds the observed absolute difference. Where the difference
    is clearly away from 0 this counts one tail of the resampled differences, about half of
    what a two-sided test would give, so a p-value just under 0.05 can come with a 95%
    interval of the difference that just reaches 0: such a result is borderline. A system
    whose hypotheses equal the baseline's gets p = 1 (sacreBLEU's formula would give its
    smallest p-value to a difference of exactly 0).

    With ``paper_lang`` the test is on :data:`PAPER_NAME` instead: every side, references
    included, goes through :func:`moses_tokenize` in that language and is scored as
    :func:`paper_bleu` scores it.
    """
    _check_lengths(baseline, refs)
    for hyps in systems:
        _check_lengths(hyps, refs)
    metric = BLEU()
    if paper_lang is not None:
        baseline, refs = moses_tokenize(baseline, paper_lang), moses_tokenize(refs, paper_lang)
        systems = [moses_tokenize(h, paper_lang) for h in systems]
        metric = _paper_metric()
    named = [("baseline", list(baseline))] + [
        (f"system{i}", list(h)) for i, h in enumerate(systems)
    ]
    with _sacrebleu_seed(seed):
        _, results = PairedTest(
            named, {"BLEU": metric}, [list(refs)], test_type="bs", n_samples=resamples
        )()
    base, *rest = results["BLEU"]
    out = []
    for hyps, r in zip(systems, rest, strict=True):
        p = 1.0 if list(hyps) == list(baseline) else float(r.p_value)
        out.append(Paired(float(r.score), Interval.around(r.mean, r.ci, resamples, seed), p))
    baseline_ci = Interval.around(base.mean, base.ci, resamples, seed)
    return Paired(float(base.score), baseline_ci, None), out
