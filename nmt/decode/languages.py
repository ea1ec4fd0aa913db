"""Decoding into a named target language: the choice of a multilingual model's target
(``tgt_lang=``) and its tag on the sentences, for every command and both engines.

A multilingual model (``data.directions``, :mod:`nmt.data.multilingual`) translates into the
language whose tag it is given: at source placement the tag is the source's first token, at
target placement it is forced as the first output token and dropped from the output, and at
``both`` (NLLB's and M2M100's convention) the source also starts with its own language's tag,
so the source language must be known. A model
with one target language may be used without naming it; one with several must be told
(:func:`choose_target`). A bilingual model has no tag: ``tgt_lang`` may only name its own
target.

:func:`decode_ids_into` decodes token ids into a language on any engine (our search or
CTranslate2): the function a server calls with sentences it has encoded itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nmt.cli import Advance, no_progress
from nmt.data.corpus import DataError
from nmt.data.multilingual import (
    directions_of,
    first_source_token,
    languages,
    placement_of,
    target_languages,
    target_tag,
)
from nmt.data.tokenizer import TokenizerPair
from nmt.decode.options import DecodeOptions

if TYPE_CHECKING:  # CTranslate2 decoding needs no PyTorch
    from nmt.data.batching import TokenDataset

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """A direction to decode: the target language, its tag id (None for a bilingual model)
    and where the tag goes (``source`` | ``target`` | ``both``, where the source starts with
    its own language's tag, ``src_tag``)."""

    lang: str
    tag: int | None
    placement: str
    src_lang: str | None = None
    src_tag: int | None = None

    @property
    def label(self) -> str:
        """``de-fr`` (``->fr`` when the source language was not named)."""
        return f"{self.src_lang}-{self.lang}" if self.src_lang else f"->{self.lang}"


def choose_target(
    cfg: Any, tokenizers: TokenizerPair, tgt_lang: str | None, src_lang: str | None = None
) -> Target:
    """The target of a command for the model of training config ``cfg``. DataError (one line)
    for a multilingual model with several target languages and no ``tgt_lang``, a language
    it was not trained to produce or read, or a bilingual model asked for another language."""
    data = cfg.data
    directions = directions_of(data)
    if not directions:
        own_src, own_tgt = str(data.src_lang), str(data.tgt_lang)
        for key, asked, own in (("tgt_lang", tgt_lang, own_tgt), ("src_lang", src_lang, own_src)):
            if asked not in (None, own):
                raise DataError(
                    f"{key}={asked!r}: this model is bilingual and translates "
                    f"{own_src}->{own_tgt} only"
                )
        return Target(own_tgt, None, "source", own_src)
    targets = target_languages(data)
    tgt_lang = named_target(targets, tgt_lang)
    if tgt_lang is None:
        raise DataError(
            f"this multilingual model translates into {', '.join(targets)}: name the "
            "target language with tgt_lang=LANG"
        )
    tag = target_tag(tokenizers.tgt, str(tgt_lang), targets)
    placement = placement_of(data)
    if src_lang is None and placement == "both":
        sources = sorted({d.src for d in directions})
        if len(sources) > 1:
            raise DataError(
                f"this model reads {', '.join(sources)} and its sources start with their "
                "language's tag: name the source language with src_lang=LANG"
            )
        src_lang = sources[0]
    if src_lang is not None:
        known = languages(directions)
        if src_lang not in known:
            raise DataError(
                f"source language {src_lang!r} was not trained: this model reads {', '.join(known)}"
            )
        if not any(d.src == src_lang and d.tgt == tgt_lang for d in directions):
            log.warning("%s-%s was not trained: a zero-shot direction", src_lang, tgt_lang)
    src_tag = tokenizers.src.tags.get(src_lang) if placement == "both" and src_lang else None
    return Target(str(tgt_lang), tag, placement, src_lang, src_tag)


def named_target(targets: Sequence[str], tgt_lang: str | None) -> str | None:
    """The language to translate into: ``tgt_lang``, else the model's only target language;
    None when the model has several and none is named (the caller words that error)."""
    if tgt_lang is None and len(targets) == 1:
        return targets[0]
    return tgt_lang


def tagged_sources(sources: Sequence[Sequence[int]], target: Target) -> list[list[int]]:
    """Source ids (without EOS) as the model reads them: the tag first at source placement,
    the source language's tag first at ``both``."""
    if target.tag is None:
        return [list(s) for s in sources]
    first = first_source_token(target.placement, target.tag, target.src_tag)
    if first is None:
        return [list(s) for s in sources]
    return [[first, *s] if len(s) else [] for s in sources]


def forced_tokens(n: int, target: Target) -> np.ndarray | None:
    """(n,) first output tokens to force (the tag at target or both placement), else None."""
    if target.tag is None or target.placement == "source":
        return None
    return np.full(n, target.tag, dtype=np.int64)


def target_dataset(
    tokenizers: TokenizerPair, texts: Sequence[str], target: Target, refs: Sequence[str] = ()
) -> TokenDataset:
    """The sentences ``texts`` (and references, default empty) for ``target``. An empty
    source stays empty (nothing is decoded for it)."""
    from nmt.data.batching import TokenDataset

    refs = list(refs) or [""] * len(texts)
    src = tagged_sources(tokenizers.src.encode_batch(list(texts)), target)
    ds = TokenDataset(src, tokenizers.tgt.encode_batch(refs))
    ds.forced = forced_tokens(len(src), target)
    return ds


def without_tag(hyp: Any, target: Target) -> Any:
    """A hypothesis with the forced tag (target or both placement) taken off its tokens, its
    n-best and its attention rows (in place; returned)."""
    tag = target.tag
    if tag is None or target.placement == "source":
        return hyp

    def strip(tokens: list[int]) -> list[int]:
        return list(tokens[1:]) if len(tokens) and int(tokens[0]) == tag else list(tokens)

    had = len(hyp.tokens) > 0 and int(hyp.tokens[0]) == tag
    hyp.tokens = strip(hyp.tokens)
    hyp.nbest = [(strip(t), s) for t, s in hyp.nbest]
    if had and hyp.attention is not None:
        hyp.attention = hyp.attention[1:]
    return hyp


def decode_ids_into(
    engine: Any,
    sources: Sequence[Sequence[int]],
    target: Target,
    opts: DecodeOptions,
    keep_attention: bool = False,
    advance: Advance = no_progress,
) -> list[Any]:
    """Hypotheses of source ids (without tag or EOS) translated into ``target`` by ``engine``
    (:class:`~nmt.decode.engines.TorchEngine` or
    :class:`~nmt.decode.ct2.CTranslate2Engine`), in order, with no tag in their tokens. An
    empty source gives an empty hypothesis."""
    src = tagged_sources(sources, target)
    forced = forced_tokens(len(src), target)
    if hasattr(engine, "decode_ids"):  # CTranslate2: no PyTorch needed
        first = None if forced is None else forced.tolist()
        hyps = engine.decode_ids(src, opts, keep_attention, advance=advance, forced=first)
    else:
        from nmt.data.batching import TokenDataset

        data = TokenDataset(src, [[] for _ in src])
        data.forced = forced
        hyps = engine.hypotheses(data, opts, keep_attention=keep_attention, advance=advance)
    return [without_tag(h, target) for h in hyps]
