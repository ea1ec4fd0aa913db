"""A resumed run keeps its own config: the checkpoint's, changed only by the command line's
key=value overrides, never by the defaults or group selections composed now
(:func:`nmt.train.start.continued_config`). The end-to-end case, a run killed and resumed
with ``trainer.resume`` alone, is tests/test_crash_resume.py."""

from __future__ import annotations

import logging

import pytest
from omegaconf import OmegaConf

from nmt.config import ConfigError
from nmt.store.gate import checked_train_config
from nmt.train.start import continued_config, log_continued
from tests.helpers import compose_config

STARTED = [
    "experiment=cpu_long_tuned",
    "data=multi30k_en_de",
    "trainer.rdrop_alpha=1",
    "trainer.max_time=0",
    "trainer.max_steps=5104",
    "optim.decay_over=steps",
    "outputs=/somewhere/else",
]


def saved_config(overrides: list[str]):
    """The config a checkpoint stores for a run started with ``overrides``, as read back."""
    composed = compose_config("train", overrides)
    return checked_train_config(OmegaConf.to_container(composed, resolve=True), "ckpt.pt")


def continued(command_line: list[str], started: list[str] = STARTED):
    return continued_config(compose_config("train", command_line), saved_config(started),
                            command_line)  # fmt: skip


def test_resume_alone_continues_the_run_as_it_started():
    c = continued(["trainer.resume=outputs/runs/r"])
    run = saved_config(STARTED)
    for key in (
        "data.src_lang",
        "data.tgt_lang",
        "model.dropout",
        "optim.lr",
        "optim.schedule",
        "trainer.rdrop_alpha",
        "trainer.max_steps",
        "trainer.max_time",
        "outputs",
    ):
        assert OmegaConf.select(c.cfg, key) == OmegaConf.select(run, key), key
    assert c.cfg.data.src_lang == "en" and c.cfg.trainer.rdrop_alpha == 1.0
    assert c.cfg.trainer.resume == "outputs/runs/r"
    assert {"data.src_lang", "trainer.rdrop_alpha", "model.dropout"} <= set(c.differing)
    assert c.changed == {} and c.not_applied == []
    unchanged = OmegaConf.to_container(c.cfg)
    unchanged["trainer"]["resume"] = None
    assert unchanged == OmegaConf.to_container(run)  # nothing else differs from the run


def test_keys_set_one_by_one_change_it_and_are_reported(caplog):
    c = continued(["trainer.resume=r", "trainer.max_steps=8000", "model.dropout=0.2"])
    assert c.cfg.trainer.max_steps == 8000 and c.cfg.model.dropout == 0.2
    assert c.cfg.data.src_lang == "en" and c.cfg.trainer.rdrop_alpha == 1.0
    assert c.changed == {"trainer.max_steps": (5104, 8000), "model.dropout": (0.3, 0.2)}
    assert "trainer.max_steps" not in c.differing
    with caplog.at_level(logging.INFO, logger="nmt.train.start"):
        log_continued(c)
    assert "trainer.max_steps 5104 -> 8000" in caplog.text


def test_a_list_valued_key_is_one_key():
    started = [*STARTED, "data.test=[test_2016_flickr,test_2017_flickr]"]
    c = continued(["trainer.resume=r", "data.test=[test_2017_mscoco]"], started)
    assert list(c.cfg.data.test) == ["test_2017_mscoco"]
    assert c.changed == {"data.test": (["test_2016_flickr", "test_2017_flickr"],
                                       ["test_2017_mscoco"])}  # fmt: skip


def test_group_selections_are_not_applied_and_say_so(caplog):
    c = continued(["trainer.resume=r", "data=multi30k_de_en", "experiment=cpu_quick"])
    assert c.cfg.data.src_lang == "en" and c.cfg.model.dropout == 0.3
    assert c.not_applied == ["data=multi30k_de_en", "experiment=cpu_quick"]
    with caplog.at_level(logging.INFO, logger="nmt.train.start"):
        log_continued(c)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "data=multi30k_de_en experiment=cpu_quick: not applied" in (
        warned[0].getMessage()
    )


def test_a_group_selection_that_changes_nothing_is_not_reported():
    c = continued(["trainer.resume=r", *STARTED])
    assert c.not_applied == [] and c.differing == [] and c.changed == {}


def test_a_key_the_runs_model_lacks_is_refused_by_name():
    gru = ["model=gru_bahdanau", "model.hidden_dim=64"]
    with pytest.raises(ConfigError, match=r"model\.heads"):
        continued(["trainer.resume=r", "model.heads=8"], gru)


def test_resuming_a_fine_tuned_run_does_not_fine_tune_again():
    c = continued(["trainer.resume=r"], [*STARTED, "trainer.init_from=/runs/base/best.pt"])
    assert c.cfg.trainer.init_from is None and c.cfg.trainer.resume == "r"
