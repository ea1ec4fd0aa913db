"""Checkpoints and run directories from someone else: nothing in them chooses code.

A config read from a file is merged into the typed schema before anything uses it; a node that
names a callable (Hydra's ``_target_``), an unknown key, a wrong type or an unregistered model
is refused with a CheckpointError naming the file and the key. Each hostile node here is first
shown to do harm through an unguarded ``hydra.utils.instantiate`` (so these tests can fail), then
shown to be refused, with its marker file untouched, by every loader of the package.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf

from nmt.config import CheckpointChoice, Schedule, to_container
from nmt.data.datasets import prepare_data
from nmt.decode.translate import translate
from nmt.evaluate.scoring import evaluate
from nmt.evaluate.tune_decode import apply_to_run, tune
from nmt.models import registry
from nmt.store.average import average_checkpoints
from nmt.store.checkpoint import load_checkpoint, save_checkpoint
from nmt.store.gate import CheckpointError, checked_train_config, load_run_config
from nmt.store.loading import build_model, load_checked_checkpoint, load_trained
from nmt.store.paths import checkpoint_path, run_decode_defaults
from nmt.train.command import train
from nmt.viz.plot_attention import plot_attention

from .helpers import TINY_TRANSFORMER, compose_config, corpus_overrides

pytestmark = pytest.mark.usefixtures("one_thread")

PRECIOUS = "precious data\n"


def hostile_nodes(marker: Path, other: Path) -> dict[str, dict[str, Any]]:
    """Config nodes that write ``marker`` when instantiated (or try to run a command)."""
    return {
        "open_w": {"_target_": "builtins.open", "file": str(marker), "mode": "w"},
        "copyfile": {"_target_": "shutil.copyfile", "src": str(other), "dst": str(marker)},
        "write_text": {
            "_target_": "pathlib.Path.write_text",
            "_args_": [{"_target_": "pathlib.Path", "_args_": [str(marker)]}, "overwritten"],
        },
        "exec": {"_target_": "builtins.exec", "_args_": [f"open({str(marker)!r}, 'w')"]},
        "os_system": {"_target_": "os.system", "_args_": [f"echo x > {marker}"]},
        "subprocess": {"_target_": "subprocess.run", "args": ["touch", str(marker)]},
    }


NODES = list(hostile_nodes(Path("m"), Path("o")))
FILE_WRITERS = ("open_w", "copyfile", "write_text")  # not blocked by Hydra itself


def place(config: dict[str, Any], node: dict[str, Any], where: str) -> dict[str, Any]:
    """``config`` with ``node`` put at ``where``."""
    config = copy.deepcopy(config)
    if where == "model":  # the model node itself names the callable
        config["model"] = {**node, **{k: v for k, v in config["model"].items() if k != "arch"}}
    elif where == "model_with_arch":
        config["model"] = {**config["model"], "_target_": node["_target_"]}
    elif where == "in_model":
        config["model"]["extra"] = node
    elif where == "nested":
        config["model"]["extra"] = {"deeper": [1, {"inner": node}]}
    elif where == "in_trainer":
        config["trainer"]["resume"] = node
    elif where == "top":
        config["extra"] = node
    else:
        raise AssertionError(where)
    return config


PLACES = ["model", "model_with_arch", "in_model", "nested", "in_trainer", "top"]


@pytest.fixture(scope="module")
def good(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real tiny model's checkpoint payload (config, weights, tokenizers) and its config."""
    root = tmp_path_factory.mktemp("good")
    cfg = compose_config("train", [*corpus_overrides(corpus, root), *TINY_TRANSFORMER])
    tokenizers = prepare_data(cfg.data).tokenizers
    torch.manual_seed(0)
    model = build_model(cfg, tokenizers)
    payload = {
        "model": model.state_dict(),
        "state": {"step": 10},
        "config": to_container(cfg),
        "tokenizers": tokenizers.state_dict(),
    }
    return {"payload": payload, "cfg": cfg, "root": root}


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """A file that a hostile node would empty, overwrite or replace."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "marker.txt").write_text(PRECIOUS)
    (tmp_path / "other.txt").write_text("someone else's bytes\n")
    return victim / "marker.txt"


def untouched(marker: Path) -> bool:
    """The marker still holds its bytes and nothing new appeared beside it."""
    return marker.read_text() == PRECIOUS and [p.name for p in marker.parent.iterdir()] == [
        marker.name
    ]


def hostile_run(good: dict[str, Any], marker: Path, node_name: str, where: str) -> Path:
    """A run directory whose checkpoint and config.yaml both carry the hostile node."""
    node = hostile_nodes(marker, marker.parent.parent / "other.txt")[node_name]
    run = marker.parent.parent / "run"
    config = place(good["payload"]["config"], node, where)
    save_checkpoint({**good["payload"], "config": config}, run / "checkpoints" / "best.pt")
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


# -------------------------------------------------------------------- the danger is real


@pytest.mark.parametrize("name", FILE_WRITERS)
def test_unguarded_instantiate_would_write_the_marker(name: str, marker: Path) -> None:
    node = hostile_nodes(marker, marker.parent.parent / "other.txt")[name]
    result = instantiate(node)
    if hasattr(result, "close"):
        result.close()
    assert not untouched(marker), f"{name} did no harm: the refusal tests prove nothing"


# -------------------------------------------------------------------- every case refused


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("name", NODES)
def test_hostile_checkpoint_is_refused(good, marker: Path, name: str, where: str) -> None:
    run = hostile_run(good, marker, name, where)
    path = run / "checkpoints" / "best.pt"
    with pytest.raises(CheckpointError) as err:
        load_trained(path, torch.device("cpu"))
    assert str(path) in str(err.value)
    expected_key = {"top": "extra", "in_trainer": "trainer.resume"}.get(where, "model")
    assert f"'{expected_key}" in str(err.value)
    assert untouched(marker)


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("name", NODES)
def test_hostile_run_config_is_refused(good, marker: Path, name: str, where: str) -> None:
    run = hostile_run(good, marker, name, where)
    with pytest.raises(CheckpointError, match="config.yaml") as err:
        load_run_config(run)
    assert str(run / "config.yaml") in str(err.value)
    assert untouched(marker)


def test_every_command_refuses_a_hostile_checkpoint(good, marker: Path, tmp_path: Path) -> None:
    """eval, translate, attention, average, tune-decode, resume and fine-tuning share the one
    gate."""
    run = hostile_run(good, marker, "open_w", "nested")
    path = run / "checkpoints" / "best.pt"
    (run / "config.yaml").unlink()  # only the checkpoint is hostile here
    commands = {
        "eval": lambda: evaluate(compose_config("eval", [f"ckpt={path}", f"out={tmp_path}"])),
        "translate": lambda: translate(
            compose_config("translate", [f"ckpt={path}", f"input={tmp_path / 'none.txt'}"])
        ),
        "attention": lambda: plot_attention(
            compose_config("attention", [f"ckpt={path}", "sentence=Ein Hund."])
        ),
        "average": lambda: average_checkpoints([path]),
        "tune-decode": lambda: tune(run, str(path), [1], [1.0], "cpu"),
        "resume": lambda: train(
            compose_config("train", [f"trainer.resume={path}", f"outputs={tmp_path / 'out'}"]),
            tmp_path / "fresh_run",
        ),
        "fine-tune": lambda: train(
            compose_config("train", [f"trainer.init_from={path}", f"outputs={tmp_path / 'out'}"]),
            tmp_path / "fine_tuned_run",
        ),
        "load": lambda: load_checked_checkpoint(path),
    }
    (tmp_path / "none.txt").write_text("Ein Hund.\n")
    for name, command in commands.items():
        with pytest.raises(CheckpointError, match="model.extra") as err:
            command()
        assert str(path) in str(err.value), name
        assert untouched(marker), name


def test_every_reader_of_config_yaml_refuses_a_hostile_one(good, marker: Path) -> None:
    """The decode defaults, the checkpoint choice and tune-decode --apply read config.yaml."""
    run = hostile_run(good, marker, "copyfile", "in_model")
    good_ckpt = run / "checkpoints" / "best.pt"
    save_checkpoint(good["payload"], good_ckpt)  # only config.yaml is hostile here
    readers = {
        "decode defaults": lambda: run_decode_defaults(run),
        "checkpoint choice": lambda: checkpoint_path(run),
        "apply": lambda: apply_to_run(run, 5, 1.0),
        "eval": lambda: evaluate(compose_config("eval", [f"run={run}"])),
    }
    before = (run / "config.yaml").read_bytes()
    for name, reader in readers.items():
        with pytest.raises(CheckpointError, match="model.extra"):
            reader()
        assert untouched(marker), name
    assert (run / "config.yaml").read_bytes() == before


def test_nmt_eval_command_refuses_with_exit_code_2(good, marker: Path) -> None:
    run = hostile_run(good, marker, "open_w", "in_model")
    path = run / "checkpoints" / "best.pt"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-m", "nmt.evaluate", f"ckpt={path}", f"out={run / 'eval'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert str(path) in done.stderr and "model.extra" in done.stderr
    assert "Traceback" not in done.stderr
    assert untouched(marker)


# -------------------------------------------------------------------- the typed schema


def test_stored_config_must_fit_the_schema(good) -> None:
    config = good["payload"]["config"]
    cases = {
        "model.d_modell": place_value(config, "model", "d_modell", 4),
        "model.d_model": place_value(config, "model", "d_model", "wide"),
        "trainer.seed": place_value(config, "trainer", "seed", [1]),
        "model.arch": place_value(config, "model", "arch", "lstm"),
        "data.name": place_value(config, "data", "name", "${oc.env:HOME}"),
        "model.dropout": place_value(config, "model", "dropout", 1.5),
        "optim.schedule": place_value(config, "optim", "schedule", "cosin"),
        "decode.checkpoint": place_value(config, "decode", "checkpoint", "newest"),
    }
    for key, bad in cases.items():
        with pytest.raises(CheckpointError) as err:
            checked_train_config(bad, "some/file.pt")
        assert "some/file.pt" in str(err.value) and key in str(err.value), str(err.value)


def place_value(config: dict[str, Any], section: str, key: str, value: Any) -> dict[str, Any]:
    config = copy.deepcopy(config)
    config[section][key] = value
    return config


def test_checked_config_is_typed_and_closed(good) -> None:
    cfg = checked_train_config(good["payload"]["config"], "x.pt")
    assert cfg == good["cfg"]
    with pytest.raises(Exception, match="extra"):
        cfg.model.extra = 1  # struct mode: nothing can be added after the check


def test_each_checked_config_is_its_own(good) -> None:
    """The schema a config is checked against is built once: no checked config, nor a change
    made to one, reaches the next."""
    config = good["payload"]["config"]
    first = checked_train_config(place_value(config, "model", "dropout", 0.5), "a.pt")
    first.trainer.seed = 99  # an existing key: allowed in struct mode
    second = checked_train_config(config, "b.pt")
    assert first.model.dropout == 0.5 and second.model.dropout == config["model"]["dropout"]
    assert second.trainer.seed == config["trainer"]["seed"] != 99
    assert second == good["cfg"]


def test_stored_choices_are_plain_strings_and_load_as_choices(good, tmp_path: Path) -> None:
    """Checkpoints and config.yaml hold choices as plain strings (weights_only loading refuses
    Enum objects); the gate turns them back into the schema's choices."""
    stored = good["payload"]["config"]["optim"]["schedule"]
    assert type(stored) is str and stored == "inverse_sqrt"
    path = tmp_path / "c.pt"
    save_checkpoint(good["payload"], path)
    cfg = checked_train_config(load_checkpoint(path)["config"], path)
    assert isinstance(cfg.optim.schedule, Schedule) and cfg.optim.schedule == "inverse_sqrt"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))  # as nmt-train does
    assert yaml.safe_load((run / "config.yaml").read_text())["decode"]["checkpoint"] == "best"
    assert load_run_config(run) == cfg
    with_enum = {**good["payload"], "choice": CheckpointChoice.best}
    save_checkpoint(with_enum, tmp_path / "enum.pt")
    with pytest.raises(CheckpointError, match="could not be loaded safely"):
        load_checkpoint(tmp_path / "enum.pt")


def test_legacy_target_of_a_registered_model_still_loads(good, tmp_path: Path) -> None:
    """Checkpoints written before ``arch`` named the class path of a registered model."""
    config = copy.deepcopy(good["payload"]["config"])
    del config["model"]["arch"]
    config["model"]["_target_"] = "nmt.models.transformer.Transformer"
    path = tmp_path / "old.pt"
    save_checkpoint({**good["payload"], "config": config}, path)
    trained = load_trained(path, torch.device("cpu"))
    assert trained.cfg.model.arch == "transformer"
    assert "_target_" not in trained.cfg.model
    expected = good["payload"]["model"]
    assert all(torch.equal(v, expected[k]) for k, v in trained.model.state_dict().items())


def test_old_output_cap_keys_load_at_their_new_place(good, tmp_path: Path) -> None:
    """Runs, checkpoints and packages written when the validation output cap was
    trainer.max_output_len_a/b: the gate reads it as decode.max_output_len_a/b."""
    config = copy.deepcopy(good["payload"]["config"])
    for key in ("max_output_len_a", "max_output_len_b"):
        del config["decode"][key]
    config["trainer"] |= {"max_output_len_a": 0.5, "max_output_len_b": 7}
    path = tmp_path / "run" / "checkpoints" / "old.pt"
    path.parent.mkdir(parents=True)
    save_checkpoint({**good["payload"], "config": config}, path)
    trained = load_trained(path, torch.device("cpu"))
    assert (trained.cfg.decode.max_output_len_a, trained.cfg.decode.max_output_len_b) == (0.5, 7)
    assert "max_output_len_a" not in trained.cfg.trainer
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(config))
    cfg = load_run_config(tmp_path / "run")
    assert (cfg.decode.max_output_len_a, cfg.decode.max_output_len_b) == (0.5, 7)
    assert config["trainer"]["max_output_len_a"] == 0.5  # the caller's data is not changed
    both = copy.deepcopy(config)
    both["decode"]["max_output_len_a"] = 1.5
    with pytest.raises(CheckpointError, match="'trainer.max_output_len_a'=0.5 and"):
        checked_train_config(both, "both.yaml")
    both["decode"]["max_output_len_a"] = 0.5  # the same value twice is no conflict
    assert checked_train_config(both, "both.yaml").decode.max_output_len_a == 0.5


def test_registry_and_schemas_name_the_same_models() -> None:
    from nmt.config import MODEL_SCHEMAS

    assert registry.MODELS.keys() == MODEL_SCHEMAS.keys()
    for arch, schema in MODEL_SCHEMAS.items():
        assert OmegaConf.structured(schema).arch == arch
