"""The multilingual presets' archived runs in docs/results/ trained the presets as they are now
(multilingual_cpu.tag_<placement>, multilingual_all_cpu.tag_<placement>: the preset with that
tag placement), so the figures of docs/results.md are what `make train ARGS="experiment=..."`
gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import differences_from_preset

RESULTS = Path(__file__).parents[1] / "docs/results"
ARCHIVED = sorted(p.name for p in RESULTS.glob("multilingual_*.tag_*"))
# where a run was written, how it showed progress, and what it resumed from; not the recipe
NOT_RECIPE = {"trainer.threads", "trainer.progress", "trainer.precision", "trainer.resume"}


def test_both_placements_of_the_english_centred_preset_are_archived() -> None:
    assert {"multilingual_cpu.tag_source", "multilingual_cpu.tag_target"} <= set(ARCHIVED)


@pytest.mark.parametrize("folder", ARCHIVED)
def test_each_archived_run_is_its_preset(folder: str) -> None:
    preset, placement = folder.split(".tag_")
    overrides = [f"experiment={preset}", f"data.tag_placement={placement}"]
    assert differences_from_preset(RESULTS / folder, overrides, NOT_RECIPE) == set()
