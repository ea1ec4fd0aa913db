"""What a served model translates: the directions it was trained for and, for a multilingual
model (:mod:`nmt.data.multilingual`), where the target language's tag goes.

A request names its target language (``target``; our API may leave it out when the model has
one) and may name its source (``source``, or ``auto``). A bilingual model has one direction and
no tag. A multilingual one reads the target's tag first in the source, or is made to begin its
output with it (``data.tag_placement``); its source language needs no tag, so ``auto`` serves
any source, except where the source also starts with its own language's tag (placement
``both``, NLLB's and M2M100's convention): a request then names its source. A pair the
model was not trained for (a zero-shot direction, de-fr of a model of de-en and en-fr) is
refused unless the server was started with ``allow_zero_shot=true``.

The default target, the tag on the sources and the forced first token are those of
:mod:`nmt.decode.languages`, as for every command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nmt.decode.languages import Target, named_target
from nmt.serve.native import BadRequest

AUTO = "auto"


@dataclass(frozen=True)
class Languages:
    directions: tuple[tuple[str, str], ...]  # (source, target) pairs, as trained
    placement: str | None = None  # source | target | both for a multilingual model; None: no tag
    tags: Mapping[str, int] = field(default_factory=dict)  # language -> its tag's id
    zero_shot: bool = False  # any source into a trained target (a pair not trained included)

    @classmethod
    def of(cls, data_cfg: Any, tags: Mapping[str, int], zero_shot: bool = False) -> Languages:
        """The languages of a run's data config (``data.directions``, ``data.tag_placement``;
        ``src_lang``/``tgt_lang`` for a bilingual run) with the tokenizer's tag ids."""
        from nmt.data.multilingual import directions_of, placement_of

        directions = directions_of(data_cfg)
        if not directions:
            src = str(data_cfg.get("src_lang", "src")) if data_cfg else "src"
            tgt = str(data_cfg.get("tgt_lang", "tgt")) if data_cfg else "tgt"
            return cls(((src, tgt),))
        pairs = tuple((d.src, d.tgt) for d in directions)
        return cls(pairs, placement_of(data_cfg), dict(tags), zero_shot)

    @property
    def multilingual(self) -> bool:
        return self.placement is not None

    @property
    def sources(self) -> list[str]:
        return sorted({s for s, _ in self.directions})

    @property
    def targets(self) -> list[str]:
        return sorted({t for _, t in self.directions})

    @property
    def source_choices(self) -> list[str]:
        """The languages a request may name as its source (``auto`` aside)."""
        if self.zero_shot and self.multilingual:
            return sorted({lang for pair in self.directions for lang in pair})
        return self.sources

    def targets_of(self, source: str) -> list[str]:
        """The languages a request from ``source`` may ask for."""
        if self.zero_shot and self.multilingual:
            return [t for t in self.targets if t != source]
        return sorted({t for s, t in self.directions if s == source})

    def info(self) -> dict[str, Any]:
        """What /health says of them: for a bilingual model its ``source`` and ``target``; for
        every model its directions, target languages and the tag's placement."""
        out: dict[str, Any] = {}
        if not self.multilingual:
            out["source"], out["target"] = self.directions[0]
        out.update(
            directions=[f"{s}-{t}" for s, t in self.directions],
            sources=self.source_choices,
            targets=self.targets,
            tag_placement=self.placement,
            zero_shot=self.zero_shot and self.multilingual,
        )
        return out

    def names(self) -> str:
        return ", ".join(f"{s}-{t}" for s, t in self.directions)

    def check(self, source: str | None, target: str | None) -> tuple[str, str]:
        """The (source, target) of a request, ``source`` ``auto`` when not named; a
        :class:`BadRequest` (400) naming what the model has otherwise."""
        targets = self.targets
        target = named_target(targets, target)
        if target is None:
            raise BadRequest(
                400, f"'target' is missing: this model translates into {', '.join(targets)}"
            )
        if target not in targets:
            raise BadRequest(
                400,
                f"target language {target[:40]!r} is not one this model translates into "
                f"({', '.join(targets)})",
            )
        source = source or AUTO
        if source == AUTO:
            if not self.multilingual:
                source = self.directions[0][0]
            elif self.placement == "both":
                if len(self.sources) > 1:
                    raise BadRequest(
                        400,
                        "'source' is missing: this model reads "
                        f"{', '.join(self.sources)} and must be told which",
                    )
                source = self.sources[0]
            return source, target
        if source not in self.source_choices:
            raise BadRequest(
                400,
                f"source language {source[:40]!r} is not one this model translates from "
                f"({', '.join(self.source_choices)})",
            )
        if target not in self.targets_of(source):
            hint = "; allow_zero_shot=true serves the other pairs" if self.multilingual else ""
            raise BadRequest(
                400,
                f"{source[:40]}-{target} is not a direction of this model ({self.names()}){hint}",
            )
        return source, target

    def target(self, lang: str, source: str = AUTO) -> Target:
        """The direction from ``source`` into ``lang`` (a pair :meth:`check` let through),
        whose tags :mod:`nmt.decode.languages` puts on the sources: the tag's id and placement
        for a multilingual model (and the source's tag at ``both``), no tag for a bilingual
        one."""
        if not self.multilingual:
            return Target(lang, None, "source")
        src_tag = self.tags.get(source) if self.placement == "both" else None
        return Target(lang, self.tags[lang], str(self.placement), None, src_tag)
