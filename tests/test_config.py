"""Every config composes, builds its model, and bad values fail at start-up naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from nmt.cli import CONFIG_DIR
from nmt.config import (
    AttentionConfig,
    ConfigError,
    EngineSource,
    EnsembleSource,
    EvalConfig,
    GRUBahdanauConfig,
    ModelSource,
    ServeConfig,
    TrainConfig,
    TrainerConfig,
    TransformerConfig,
    TranslateConfig,
    register_configs,
    to_container,
)
from nmt.config_checks import check_train_config
from nmt.data.tokenizer import PAD_ID
from nmt.models.registry import create_model
from nmt.store.package import model_argument

from .helpers import compose_config

register_configs()

MODELS = sorted(p.stem for p in (Path(CONFIG_DIR) / "model").glob("*.yaml"))
DATA = sorted(p.stem for p in (Path(CONFIG_DIR) / "data").glob("*.yaml"))
OPTIMS = sorted(p.stem for p in (Path(CONFIG_DIR) / "optim").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_builds(model):

    cfg = compose_config("train", [f"model={model}"])
    check_train_config(cfg)
    net = create_model(
        cfg.model, src_vocab_size=300, tgt_vocab_size=300, pad_id=PAD_ID, shared_vocab=True
    )
    assert net.num_parameters() > 0


@pytest.mark.parametrize("optim", OPTIMS)
@pytest.mark.parametrize("data", [d for d in DATA if d != "parallel"])
def test_data_and_optim_configs_compose(data, optim):
    cfg = compose_config("train", [f"data={data}", f"optim={optim}", "trainer.max_steps=1000"])
    check_train_config(cfg)
    assert cfg.optim.schedule in ("noam", "inverse_sqrt", "cosine", "linear", "constant")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_presets_compose(experiment):
    # the fine-tuning preset starts from a model, which it asks for by name
    extra = ["trainer.init_from=runs/x"] if experiment == "finetune" else []
    check_train_config(compose_config("train", [f"experiment={experiment}", *extra]))


def test_shared_embeddings_without_one_vocabulary_are_refused_by_name():
    """Two sentencepiece models of their own give unrelated pieces the same ids: only an
    imported model (fine-tuned or resumed) has one id space for two of them."""
    cfg = compose_config("train", ["data.joint_vocab=false", "model.shared_embeddings=true"])
    with pytest.raises(ConfigError, match="model.shared_embeddings=true"):
        check_train_config(cfg)
    check_train_config(cfg, training=False)  # a stored imported run's config, read to decode
    for allowed in ("data.joint_vocab=true", "trainer.init_from=runs/x"):
        check_train_config(compose_config("train", ["model.shared_embeddings=true", allowed]))


def test_parallel_config_needs_its_files():
    cfg = compose_config(
        "train",
        ["data=parallel", "data.src_lang=fr", "data.tgt_lang=en", "data.train=a", "data.valid=b"],
    )
    check_train_config(cfg)
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
        (["model=gru_bahdanau", "model.attention=dot"], "model.attention=general"),
        (["optim.lr=-1"], "optim.lr"),
        (["data.max_tokens=50"], "data.max_tokens"),
        (["trainer.precision=8"], "trainer.precision"),
        (["optim.schedule=cosine"], "trainer.max_steps"),
        (["model.dropout=1.5"], "model.dropout"),
        (["data.src_lang=en", "data.tgt_lang=en"], "data.tgt_lang"),
        (["data.src_lang=xx"], "data.src_lang"),
    ],
)
def test_invalid_values_fail_naming_the_key(override, key):
    cfg = compose_config("train", override)
    with pytest.raises(ConfigError) as err:
        check_train_config(cfg)
    assert key in str(err.value)


# every choice field of the training schema: (override prefix, key, each allowed value)
CHOICES = [
    ([], "data.corpus", ["multi30k", "parallel"]),
    ([], "data.spm_model_type", ["unigram", "bpe"]),
    ([], "optim.name", ["adam", "adamw"]),
    ([], "optim.schedule", ["noam", "inverse_sqrt", "cosine", "linear", "constant"]),
    ([], "optim.decay_over", ["steps", "time"]),
    (["model=gru_bahdanau"], "model.attention", ["additive", "dot", "general", "scaled_dot"]),
    ([], "decode.checkpoint", ["best", "last", "averaged", "auto"]),
]


@pytest.mark.parametrize(("extra", "key", "allowed"), CHOICES)
def test_choices_accept_their_plain_names(extra, key, allowed):
    """Each allowed name composes, compares equal to its string and is stored as a plain str."""
    for value in allowed:
        cfg = compose_config("train", [*extra, f"{key}={value}"])
        group, name = key.split(".")
        chosen = cfg[group][name]
        assert chosen == value and str(chosen) == value and f"{chosen}" == value
        stored = to_container(cfg)[group][name]
        assert type(stored) is str and stored == value
        assert f"{name}: {value}\n" in OmegaConf.to_yaml(cfg[group])


@pytest.mark.parametrize(("extra", "key", "allowed"), CHOICES)
def test_a_bad_choice_fails_at_compose_time_naming_the_key(extra, key, allowed):
    with pytest.raises(ConfigCompositionException) as err:
        compose_config("train", [*extra, f"{key}=nonsense"])
    message = f"{err.value} {err.value.__cause__}"
    assert key in message and "nonsense" in message
    assert all(value in message for value in allowed)


COMMAND_CHOICES = [
    ("eval", "engine", ["auto", "torch", "ctranslate2"]),
    ("translate", "engine", ["auto", "torch", "ctranslate2"]),
    ("serve", "engine", ["auto", "torch", "ctranslate2"]),
    ("attention", "format", ["png", "html"]),
]


@pytest.mark.parametrize(("command", "key", "allowed"), COMMAND_CHOICES)
def test_a_commands_choices_are_checked_at_compose_time(command, key, allowed):
    for value in allowed:
        cfg = compose_config(command, [f"{key}={value}"])
        assert cfg[key] == value and type(to_container(cfg)[key]) is str
    for bad in ("nonsense", value.upper()):
        with pytest.raises(ConfigCompositionException) as err:
            compose_config(command, [f"{key}={bad}"])
        message = f"{err.value} {err.value.__cause__}"
        assert key in message and bad in message
        assert all(v in message for v in allowed)


def test_a_bad_choice_in_a_yaml_file_fails_at_compose_time(tmp_path: Path) -> None:
    """The typed field also checks what a config file sets, not only the command line."""
    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "typo.yaml").write_text(
        "defaults:\n  - optim_schema\n  - _self_\n\nschedule: cosin\n", encoding="utf-8"
    )
    register_configs()
    overrides = [f"hydra.searchpath=[file://{tmp_path}]", "optim=typo"]
    with (
        initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"),
        pytest.raises(ConfigCompositionException) as err,
    ):
        compose("train", overrides)
    message = f"{err.value} {err.value.__cause__}"
    assert "optim.schedule" in message and "cosin" in message


def test_precision_stays_a_checked_string():
    """Hydra parses 32 and 16 as ints, which an Enum field would refuse: the str field takes
    them and check_train_config() checks the value."""
    for value in ("auto", "32", "bf16", "16"):
        cfg = compose_config("train", [f"trainer.precision={value}"])
        check_train_config(cfg)
        assert str(cfg.trainer.precision) == value
    with pytest.raises(ConfigError, match="trainer.precision"):
        check_train_config(compose_config("train", ["trainer.precision=fp8"]))


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


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """The values of a plain nested mapping by dotted key (a list is one value)."""
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def yaml_values(path: Path) -> dict[str, Any]:
    """What a config file sets, by dotted key, besides its defaults list and Hydra settings."""
    raw = OmegaConf.to_container(OmegaConf.load(path), enum_to_str=True)
    return leaves({k: v for k, v in raw.items() if k not in ("defaults", "hydra")})


def assert_only_differences(path: Path, values: dict[str, Any], base: dict[str, Any]) -> None:
    same = {k: v for k, v in values.items() if k in base and base[k] == v}
    assert not same, f"{path} repeats values it would get anyway: {same}"


GROUP_OPTIONS = [
    (group, p.stem) for group in ("data", "model", "optim", "trainer") for p in
    sorted((Path(CONFIG_DIR) / group).glob("*.yaml"))
]  # fmt: skip


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_group_options_set_only_what_differs_from_the_schema(group, option):
    """Defaults live in the schema: a group option sets only the values that make it differ."""
    path = Path(CONFIG_DIR) / group / f"{option}.yaml"
    schema_name = next(d for d in OmegaConf.load(path).defaults if d.endswith("_schema"))
    base = compose_config("train", [f"{group}={schema_name}"])[group]
    assert_only_differences(
        path, yaml_values(path), leaves(OmegaConf.to_container(base, enum_to_str=True))
    )


@pytest.mark.parametrize(
    ("name", "schema"),
    [
        ("train", TrainConfig),
        ("eval", EvalConfig),
        ("translate", TranslateConfig),
        ("attention", AttentionConfig),
        ("serve", ServeConfig),
    ],
)
def test_entry_configs_set_only_what_differs_from_the_schema(name, schema):
    path = Path(CONFIG_DIR) / f"{name}.yaml"
    base = leaves(OmegaConf.to_container(OmegaConf.structured(schema), enum_to_str=True))
    assert_only_differences(path, yaml_values(path), base)


@pytest.mark.parametrize(
    ("name", "schema", "source"),
    [
        ("eval", EvalConfig, EnsembleSource),
        ("translate", TranslateConfig, EnsembleSource),
        ("attention", AttentionConfig, ModelSource),
        ("serve", ServeConfig, EngineSource),
    ],
)
def test_commands_name_their_model_with_one_schema_of_top_level_keys(name, schema, source):
    """Every command that loads a model takes the fields of one shared schema, at the top level
    of its command line (``model=DIR`` read as ``model_dir``); engine and ensemble where its
    schema has them, and no other command accepts them."""
    assert issubclass(schema, source)
    cfg = compose_config(name, model_argument(["run=r", "ckpt=last", "model=pkg", "device=cpu"]))
    assert (cfg.run, cfg.ckpt, cfg.model_dir, cfg.device) == ("r", "last", "pkg", "cpu")
    for key, value, expected, schema_with_it in (
        ("engine", "torch", "torch", EngineSource),
        ("ensemble", "[a,b]", ["a", "b"], EnsembleSource),
    ):
        if issubclass(source, schema_with_it):
            cfg = compose_config(name, [f"{key}={value}"])
            assert to_container(cfg)[key] == expected
        else:
            assert not issubclass(schema, schema_with_it)
            with pytest.raises(ConfigCompositionException):
                compose_config(name, [f"{key}={value}"])


def experiment_base(path: Path) -> list[str]:
    """The overrides that compose what an experiment starts from: its defaults list."""
    overrides = []
    for entry in OmegaConf.to_container(OmegaConf.load(path).defaults):
        if isinstance(entry, str):  # another experiment it extends
            overrides.append(f"experiment={entry}")
        else:
            ((key, option),) = entry.items()
            overrides.append(f"{key.removeprefix('override /')}={option}")
    return overrides


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiments_set_only_what_differs_from_what_they_extend(experiment):
    path = Path(CONFIG_DIR) / "experiment" / f"{experiment}.yaml"
    base = compose_config("train", experiment_base(path))
    assert_only_differences(
        path, yaml_values(path), leaves(OmegaConf.to_container(base, enum_to_str=True))
    )
