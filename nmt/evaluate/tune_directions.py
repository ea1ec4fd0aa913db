"""``nmt-tune-decode`` on a multilingual run: the validation split of each direction, decoded
into its target language, and one choice of beam and length penalty for them all.

A run's ``decode`` section holds one setting, which ``nmt-eval``, ``nmt-translate`` and
``nmt-serve`` use in every direction, so the choice is one setting. It is made on the
directions' validation sets pooled into one corpus (each sentence decoded in its own
direction, the hypotheses and references concatenated): the paired bootstrap test against the
default, with its Bonferroni threshold, needs one corpus whose sentences are resampled, and
the pool is that corpus, each direction weighing by its sentences. The unweighted mean of the
directions' BLEU scores (the run's validation figure) is reported beside each setting, and
each direction's own BLEU per setting and its best setting are recorded, so that a setting
that helps some directions and hurts others shows; no per-direction setting is applied, as
nothing decodes with one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nmt.config import ConfigError
from nmt.config_checks import Direction, parse_directions
from nmt.data.batching import TokenDataset
from nmt.data.corpus import DataError, read_parallel, strip_lines
from nmt.data.multilingual import directions_of
from nmt.data.multiprep import resolve_direction_splits
from nmt.decode.languages import Target, choose_target, target_dataset
from nmt.environment import multi30k_source
from nmt.evaluate.metrics import bleu, chrf
from nmt.store.loading import Trained


@dataclass
class DirectionSet:
    """One direction's validation sentences, tagged for its target language."""

    direction: Direction
    target: Target
    src: list[str]
    refs: list[str]
    data: TokenDataset


def direction_sets(trained: Trained, names: Sequence[str] = ()) -> list[DirectionSet]:
    """The validation split of each trained direction (or of the trained ones in ``names``;
    an untrained one is refused naming them)."""
    data_cfg = trained.cfg.data
    trained_dirs = directions_of(data_cfg)
    chosen = trained_dirs
    if names:
        chosen = parse_directions(list(names), "--directions")
        for d in chosen:
            if d not in trained_dirs:
                raise ConfigError(
                    f"--directions: {d} is not a trained direction of this model "
                    f"({', '.join(map(str, trained_dirs))})"
                )
    sets = []
    for d in chosen:
        (split,) = resolve_direction_splits(data_cfg, [data_cfg.valid], [d], multi30k_source())
        src, refs = (strip_lines(x) for x in read_parallel(split.src_path, split.tgt_path))
        if not src:
            raise DataError(f"validation set {split.src_path} has no sentences")
        target = choose_target(trained.cfg, trained.tokenizers, d.tgt, d.src)
        sets.append(
            DirectionSet(d, target, src, refs, target_dataset(trained.tokenizers, src, target))
        )
    return sets


def pooled(sets: Sequence[DirectionSet]) -> tuple[str, list[str]]:
    """The pool's name and its references, direction after direction."""
    name = f"validation of {', '.join(str(s.direction) for s in sets)} (pooled)"
    return name, [r for s in sets for r in s.refs]


def direction_scores(
    sets: Sequence[DirectionSet], outputs: Sequence[list[str]]
) -> dict[str, dict[str, float]]:
    """Each direction's BLEU and chrF2 of one setting's outputs (one list per direction)."""
    return {
        str(s.direction): {"BLEU": bleu(out, s.refs).score, "chrF2": chrf(out, s.refs).score}
        for s, out in zip(sets, outputs, strict=True)
    }


def direction_report(
    sets: Sequence[DirectionSet], per_setting: dict[Any, dict[str, dict[str, float]]]
) -> dict[str, Any]:
    """Per direction: its sentences, its BLEU and chrF2 under each setting and its best setting
    (by BLEU)."""
    report = {}
    for s in sets:
        name = str(s.direction)
        rows = [{**setting.as_dict(), **scores[name]} for setting, scores in per_setting.items()]
        best = max(rows, key=lambda r: r["BLEU"])
        report[name] = {"sentences": len(s.src), "rows": rows, "best": best}
    return report
