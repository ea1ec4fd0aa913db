"""experiment=rdrop_en_de: R-Drop on the tuned 75-minute preset for a fixed number of updates
composes as its header says, and each of its runs archived in docs/results/ trained it (seed 1234
as the command-line overrides the preset now names)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.config_checks import check_train_config

from .helpers import compose_config, differences_from_preset

RESULTS = Path(__file__).parents[1] / "docs/results"
# each archived run of the preset: <direction>.rdrop_en_de.seed<N>
ARCHIVED = sorted(p.name for p in RESULTS.glob("*.rdrop_en_de.seed*"))
# where a run was written, how it showed progress, and what it resumed from; not the recipe;
# nor where a multilingual run puts its language tag (a bilingual run has none)
NOT_RECIPE = {
    "trainer.threads", "trainer.progress", "trainer.precision", "trainer.resume",
    "data.tag_placement",
}  # fmt: skip


def test_the_preset_is_the_tuned_preset_with_rdrop_for_a_fixed_number_of_updates() -> None:
    tuned = compose_config("train", ["experiment=cpu_long_tuned", "data=multi30k_en_de"])
    rdrop = compose_config("train", ["experiment=rdrop_en_de"])
    check_train_config(rdrop)
    assert (rdrop.data.src_lang, rdrop.data.tgt_lang) == ("en", "de")
    assert (tuned.trainer.rdrop_alpha, rdrop.trainer.rdrop_alpha) == (0.0, 1.0)
    assert (rdrop.trainer.max_steps, rdrop.trainer.max_time) == (5104, 0)
    assert (tuned.optim.decay_over, rdrop.optim.decay_over) == ("time", "steps")
    changed = {
        (section, key)
        for section in ("data", "model", "optim", "trainer", "decode")
        for key in rdrop[section]
        if rdrop[section][key] != tuned[section][key]
    }
    assert changed == {
        ("trainer", "rdrop_alpha"),
        ("trainer", "max_steps"),
        ("trainer", "max_time"),
        ("optim", "decay_over"),
    }
    de_en = compose_config("train", ["experiment=rdrop_en_de", "data=multi30k_de_en"])
    assert (de_en.data.src_lang, de_en.data.tgt_lang) == ("de", "en")


def test_a_run_of_it_is_archived() -> None:
    assert "en-de.rdrop_en_de.seed1234" in ARCHIVED


@pytest.mark.parametrize("folder", ARCHIVED)
def test_each_archived_run_is_the_preset(folder: str) -> None:
    seed = int(folder.rsplit(".seed", 1)[1])
    data = f"multi30k_{folder[:5].replace('-', '_')}"
    overrides = ["experiment=rdrop_en_de", f"data={data}", f"trainer.seed={seed}"]
    assert differences_from_preset(RESULTS / folder, overrides, NOT_RECIPE) == set()
