"""One model for several directions (Johnson et al. 2017): directions, language tags, the
sampling of directions by temperature, and tagged token data.

A multilingual run names its directions in ``data.directions`` (``[de-en, en-fr]``, or ``all``:
every ordered pair of ``data.languages``). One joint
sentencepiece model covers every language, with one tag per language (``<2fr>``) as a
user-defined piece (ids 4, 5, ... in sorted order of the languages). The tag of the target
language goes where ``data.tag_placement`` says:

* ``source``: the source's first token (``<2fr> Ein Mann ...``);
* ``target``: the target's first token; decoding forces it as the first output token.

The directions and the placement live in the run's config (``data.directions``,
``data.tag_placement``), which every checkpoint holds; :func:`nmt.data.tagged.tagged_dataset`
builds a model's input for any direction from them, and :func:`target_tag` refuses a target
language the model has no tag for. Nothing here imports torch (``nmt-prepare`` uses it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from nmt.config_checks import Direction, parse_directions
from nmt.data.corpus import DataError
from nmt.data.tokenizer import Tokenizer, language_tag


def directions_of(cfg: Any) -> list[Direction]:
    """The directions of a data config (none for a bilingual one, or one from before them)."""
    if not hasattr(cfg, "get"):
        return []
    return parse_directions(cfg.get("directions"), languages=cfg.get("languages"))


def placement_of(cfg: Any) -> str:
    """``data.tag_placement`` (source for configs from before it)."""
    return str(cfg.get("tag_placement", "source") or "source")


def first_source_token(placement: str, tag: int, src_tag: int | None) -> int | None:
    """The token a source starts with: the target's tag at source placement, the source
    language's own tag at ``both``, none at target placement."""
    return {"source": tag, "both": src_tag}.get(placement)


def languages(directions: Sequence[Direction]) -> list[str]:
    """Every language of the directions, sorted (the order of their tags' ids)."""
    return sorted({lang for d in directions for lang in (d.src, d.tgt)})


def tags_for(directions: Sequence[Direction]) -> list[str]:
    """The tag pieces of a multilingual sentencepiece model, in id order."""
    return [language_tag(lang) for lang in languages(directions)]


def target_languages(cfg: Any) -> list[str]:
    """The languages a run was trained to translate into, sorted."""
    return sorted({d.tgt for d in directions_of(cfg)})


def target_tag(tokenizer: Tokenizer, lang: str, trained_targets: Sequence[str]) -> int:
    """The id of ``lang``'s tag; DataError naming the languages the model has otherwise."""
    if lang not in trained_targets or lang not in tokenizer.tags:
        raise DataError(
            f"target language {lang!r} was not trained: this model translates into "
            f"{', '.join(trained_targets) or 'no tagged language'}"
        )
    return tokenizer.tags[lang]


# --------------------------------------------------------------------------- sampling


def temperature_shares(sizes: Sequence[float], temperature: float) -> list[float]:
    """Each direction's share of an epoch: ``size ** (1 / T)``, normalised (T = inf: equal)."""
    if not sizes:
        return []
    power = 0.0 if math.isinf(temperature) else 1.0 / temperature
    # relative to the largest size, so no power overflows
    top = max(sizes)
    raw = [(s / top) ** power if s > 0 else 0.0 for s in sizes]
    total = sum(raw)
    return [r / total for r in raw]


def temperature_factors(sizes: Sequence[float], temperature: float) -> list[float]:
    """The factor on each direction's corpus weights so that an epoch (as many pairs as
    before) gives each direction its :func:`temperature_shares` share (1 at T = 1)."""
    total = sum(sizes)
    shares = temperature_shares(sizes, temperature)
    return [share * total / s for share, s in zip(shares, sizes, strict=True)]


def check_no_tags(ids: np.ndarray, lens: np.ndarray, tokenizer: Tokenizer, where: str,
                  first_line: int) -> None:  # fmt: skip
    """Refuse text in which a language tag occurs as a piece (it would read as a request for
    that language): ``ids`` are the flat ids of lines ``first_line``, ... with lengths
    ``lens``; DataError names the file, line and tag."""
    if not tokenizer.tags:
        return
    lo, hi = min(tokenizer.tags.values()), max(tokenizer.tags.values())
    hits = np.flatnonzero((ids >= lo) & (ids <= hi))
    if len(hits):
        pos = int(hits[0])
        line = first_line + int(np.searchsorted(np.cumsum(lens), pos, side="right"))
        piece = tokenizer.pieces([int(ids[pos])])[0]
        raise DataError(
            f"{where}:{line}: the text contains {piece!r}, a language tag of this multilingual "
            "model; remove it from the corpus (a tag must never be ordinary text)"
        )
