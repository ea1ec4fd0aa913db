"""experiment=cpu_long_tuned: the 75-minute preset tuned on Multi30k's validation split composes
with the values its header states, and the en->de run archived in docs/results/ under the
command-line overrides it replaced is the same configuration (so that run counts as one seed of
the preset)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from nmt.config_checks import check_train_config
from nmt.viz.visualize import flatten_config

from .helpers import compose_config

ROOT = Path(__file__).parents[1]
ARCHIVED = ROOT / "docs/results/en-de.cpu_long.dropout0.3.val_every200/config.yaml"
# where a run was written and how it showed progress; not the recipe
NOT_RECIPE = {"trainer.threads", "trainer.progress", "trainer.precision", "outputs"}


def test_the_preset_changes_what_its_header_says() -> None:
    base = compose_config("train", ["experiment=cpu_long", "data=multi30k_en_de"])
    cfg = compose_config("train", ["experiment=cpu_long_tuned", "data=multi30k_en_de"])
    check_train_config(cfg)
    assert (base.model.dropout, cfg.model.dropout) == (0.2, 0.3)
    assert (base.trainer.val_every, cfg.trainer.val_every) == (400, 200)
    changed = {
        (section, key)
        for section in ("data", "model", "optim", "trainer", "decode")
        for key in cfg[section]
        if cfg[section][key] != base[section][key]
    }
    assert changed == {("model", "dropout"), ("trainer", "val_every")}
    assert cfg.trainer.max_time == 4500 and cfg.trainer.average_last == 5
    assert cfg.trainer.label_smoothing == 0.1
    assert (cfg.data.vocab_size, cfg.data.spm_model_type) == (8000, "unigram")
    assert (cfg.model.d_model, cfg.model.enc_layers, cfg.model.dec_layers) == (256, 3, 3)
    assert (cfg.decode.beam, cfg.decode.length_penalty, cfg.decode.checkpoint) == (5, 1.0, "auto")


def test_the_archived_en_de_run_is_the_preset() -> None:
    cfg = compose_config("train", ["experiment=cpu_long_tuned", "data=multi30k_en_de"])
    preset = flatten_config(OmegaConf.to_container(cfg, resolve=True))
    archived = flatten_config(OmegaConf.to_container(OmegaConf.load(ARCHIVED), resolve=True))
    differ = {
        key
        for key in preset.keys() | archived.keys()
        if key not in NOT_RECIPE and preset.get(key) != archived.get(key)
    }
    assert differ == set()
