"""Every config composes, builds its model, and bad values fail at start-up naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from nmt.config import (
    ConfigError,
    GRUBahdanauConfig,
    TrainerConfig,
    TransformerConfig,
    register_configs,
    validate,
)
from nmt.data.tokenizer import PAD_ID
from nmt.models.registry import build_model
from nmt.runtime import CONFIG_DIR

from .helpers import compose_config

register_configs()

MODELS = sorted(p.stem for p in (Path(CONFIG_DIR) / "model").glob("*.yaml"))
DATA = sorted(p.stem for p in (Path(CONFIG_DIR) / "data").glob("*.yaml"))
OPTIMS = sorted(p.stem for p in (Path(CONFIG_DIR) / "optim").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_builds(model):

    cfg = compose_config("train", [f"model={model}"])
    validate(cfg)
    net = build_model(
        cfg.model, src_vocab_size=300, tgt_vocab_size=300, pad_id=PAD_ID, shared_vocab=True
    )
    assert net.num_parameters() > 0


@pytest.mark.parametrize("optim", OPTIMS)
@pytest.mark.parametrize("data", [d for d in DATA if d != "parallel"])
def test_data_and_optim_configs_compose(data, optim):
    cfg = compose_config("train", [f"data={data}", f"optim={optim}", "trainer.max_steps=1000"])
    validate(cfg)
    assert cfg.optim.schedule in ("noam", "inverse_sqrt", "cosine", "linear", "constant")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_presets_compose(experiment):
    validate(compose_config("train", [f"experiment={experiment}"]))


def test_parallel_config_needs_its_files():
    cfg = compose_config(
        "train",
        ["data=parallel", "data.src_lang=fr", "data.tgt_lang=en", "data.train=a", "data.valid=b"],
    )
    validate(cfg)
    assert cfg.data.corpus == "parallel"


def test_eval_and_translate_configs_compose():
    assert compose_config("eval", ["beam=5"]).beam == 5
    assert compose_config("translate", ["beam=2"]).beam == 2


def test_typo_in_key_fails_naming_it():
    with pytest.raises((ConfigCompositionException, ConfigKeyError)) as err:
        compose_config("train", ["model.d_modle=512"])
    assert "d_modle" in str(err.value)


def test_wrong_type_fails_naming_key():
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        compose_config("train", ["optim.lr=fast"])
    assert "lr" in str(err.value)


def test_unknown_model_lists_choices():
    with pytest.raises(ConfigCompositionException) as err:
        compose_config("train", ["model=lstm"])
    for name in MODELS:
        assert name in str(err.value)


@pytest.mark.parametrize(
    "override, key",
    [
        (["model.d_model=250", "model.heads=4"], "model.heads"),
        (["optim.lr=-1"], "optim.lr"),
        (["data.max_tokens=50"], "data.max_tokens"),
        (["trainer.precision=8"], "trainer.precision"),
        (["optim.schedule=cosine"], "trainer.max_steps"),
        (["model=gru_bahdanau", "model.attention=luong"], "model.attention"),
        (["model.dropout=1.5"], "model.dropout"),
        (["data.src_lang=en", "data.tgt_lang=en"], "data.tgt_lang"),
        (["data.src_lang=xx"], "data.src_lang"),
    ],
)
def test_invalid_values_fail_naming_the_key(override, key):
    cfg = compose_config("train", override)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert key in str(err.value)


@pytest.mark.parametrize(
    ("group", "option", "schema"),
    [
        ("trainer", "default", TrainerConfig),
        ("model", "transformer", TransformerConfig),
        ("model", "gru_bahdanau", GRUBahdanauConfig),
    ],
)
def test_default_options_declare_their_values_only_in_the_schema(group, option, schema):
    """Defaults live in one place: these YAML files set no value, so they cannot disagree."""
    values = OmegaConf.load(Path(CONFIG_DIR) / group / f"{option}.yaml")
    assert set(values) == {"defaults"}, f"{group}/{option}.yaml repeats schema values"
    composed = compose_config("train", [f"{group}={option}"])[group]
    assert composed == OmegaConf.structured(schema)
