"""Corpus-level scores with sacreBLEU, on detokenized hypotheses against raw references."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sacrebleu.metrics import BLEU, CHRF, TER


@dataclass
class Score:
    name: str  # BLEU | chrF2 | TER
    score: float
    signature: str
    detail: str  # sacreBLEU's one-line summary (n-gram precisions, brevity penalty, ...)

    def line(self) -> str:
        return f"{self.detail}  [{self.signature}]"

    def as_dict(self) -> dict:
        return asdict(self)


def _check_lengths(hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(
            f"{len(hyps)} hypotheses but {len(refs)} references: the files must have one line "
            "per sentence"
        )


def bleu(hyps: list[str], refs: list[str], lowercase: bool = False) -> Score:
    """Corpus BLEU on detokenized text with the default 13a tokenizer; cased unless asked.

    The standard figure is cased. ``lowercase=True`` gives the lowercased, 13a-tokenized
    BLEU that is closer to the figures of tutorials scoring lowercased word tokens; it is
    reported as ``BLEU-lc`` and never in place of the cased score.
    """
    _check_lengths(hyps, refs)
    metric = BLEU(lowercase=lowercase)
    result = metric.corpus_score(hyps, [refs])
    name = "BLEU-lc" if lowercase else "BLEU"
    return Score(name, result.score, str(metric.get_signature()), str(result))


def chrf(hyps: list[str], refs: list[str]) -> Score:
    _check_lengths(hyps, refs)
    metric = CHRF()
    result = metric.corpus_score(hyps, [refs])
    return Score("chrF2", result.score, str(metric.get_signature()), str(result))


def ter(hyps: list[str], refs: list[str]) -> Score:
    _check_lengths(hyps, refs)
    metric = TER()
    result = metric.corpus_score(hyps, [refs])
    return Score("TER", result.score, str(metric.get_signature()), str(result))


def all_scores(hyps: list[str], refs: list[str]) -> list[Score]:
    """BLEU, chrF2 and TER, then the lowercased BLEU for comparison with tutorial figures."""
    return [bleu(hyps, refs), chrf(hyps, refs), ter(hyps, refs), bleu(hyps, refs, lowercase=True)]
