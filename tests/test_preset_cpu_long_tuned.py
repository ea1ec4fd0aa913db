"""experiment=cpu_long_tuned: the 75-minute preset tuned on Multi30k's validation split composes
with the values its header states, and each of its runs archived in docs/results/ trained the
preset's configuration, the en->de one named by the command-line overrides the preset replaced
among them (so that run counts as one seed of the preset). A run archived before the preset
raised its patience counts as the preset's if the patience it had never stopped it: it ran to
the time limit and never went as many validations without a gain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nmt.config_checks import check_train_config
from nmt.train.runlog import of_kind, read_events

from .helpers import compose_config, differences_from_preset

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs/results"
# each archived run of the preset: its folder, its data config and its seed. A run of the preset
# is named <direction>.cpu_long_tuned[.<machine>].seed<N>; a candidate that changes the recipe
# names its change in place of a seed
ARCHIVED = [
    ("en-de.cpu_long.dropout0.3.val_every200", "multi30k_en_de", 1234),
    *((p.name, f"multi30k_{p.name[:5].replace('-', '_')}", int(p.suffix.removeprefix(".seed")))
      for p in sorted(RESULTS.glob("*.cpu_long_tuned.*seed*"))),
]  # fmt: skip
# where a run was written and how it showed progress; not the recipe
NOT_RECIPE = {
    "trainer.threads", "trainer.progress", "trainer.precision", "outputs",
    "trainer.attention_every",  # how often TensorBoard draws attention: no effect on training
    "data.tag_placement",  # where a multilingual run puts its language tag; a bilingual has none
}  # fmt: skip


def test_the_preset_changes_what_its_header_says() -> None:
    base = compose_config("train", ["experiment=cpu_long", "data=multi30k_en_de"])
    cfg = compose_config("train", ["experiment=cpu_long_tuned", "data=multi30k_en_de"])
    check_train_config(cfg)
    assert (base.model.dropout, cfg.model.dropout) == (0.2, 0.3)
    assert (base.trainer.val_every, cfg.trainer.val_every) == (400, 200)
    # the same patience in updates: 10 validations every 400, 20 every 200
    assert (base.trainer.patience, cfg.trainer.patience) == (10, 20)
    changed = {
        (section, key)
        for section in ("data", "model", "optim", "trainer", "decode")
        for key in cfg[section]
        if cfg[section][key] != base[section][key]
    }
    assert changed == {("model", "dropout"), ("trainer", "val_every"), ("trainer", "patience")}
    assert cfg.trainer.max_time == 4500 and cfg.trainer.average_last == 5
    assert cfg.trainer.label_smoothing == 0.1
    assert (cfg.data.vocab_size, cfg.data.spm_model_type) == (8000, "unigram")
    assert (cfg.model.d_model, cfg.model.enc_layers, cfg.model.dec_layers) == (256, 3, 3)
    assert (cfg.decode.beam, cfg.decode.length_penalty, cfg.decode.checkpoint) == (5, 1.0, "auto")


@pytest.mark.parametrize(("folder", "data", "seed"), ARCHIVED, ids=[a[0] for a in ARCHIVED])
def test_each_archived_run_is_the_preset(folder: str, data: str, seed: int) -> None:
    overrides = ["experiment=cpu_long_tuned", f"data={data}", f"trainer.seed={seed}"]
    differ = differences_from_preset(RESULTS / folder, overrides, NOT_RECIPE)
    if differ == {"trainer.patience"} and patience_never_stopped(RESULTS / folder):
        differ = set()
    assert differ == set()


def longest_run_without_gain(run: Path) -> int:
    """The most validations in a row of the run's history that were not a new best."""
    streak, longest = 0, 0
    for event in of_kind(read_events(run), "validation"):
        streak = 0 if event["best"] else streak + 1
        longest = max(longest, streak)
    return longest


def patience_never_stopped(run: Path) -> bool:
    """The archived run ended at its time limit and never reached its own patience."""
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    patience = OmegaConf.load(run / "config.yaml").trainer.patience
    return summary["stop_reason"].startswith("reached the time limit") and (
        longest_run_without_gain(run) < patience
    )


def test_an_early_stopped_run_is_not_counted_as_the_preset() -> None:
    """The de->en seed-3 run that patience 10 stopped at 61 minutes trained another recipe."""
    run = RESULTS / "de-en.cpu_long_tuned_patience10.seed3"
    assert longest_run_without_gain(run) == 10
    assert not patience_never_stopped(run)


def test_every_direction_has_archived_seeds() -> None:
    assert {data for _, data, _ in ARCHIVED} == {"multi30k_en_de", "multi30k_de_en"}
    assert len({seed for _, _, seed in ARCHIVED}) >= 2
