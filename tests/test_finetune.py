"""Fine-tuning (``trainer.init_from``): a new run from a checkpoint's weights and tokenizers.

A tiny Transformer is trained on one half of a small real corpus, then fine-tuned on the other
half. The fine-tuned run must start from the source weights (its loss far below a fresh
model's), lower the loss on its own validation set from the first validation, reuse the source
tokenizers byte for byte, start its optimizer, schedule and step count afresh, record where it
came from, and leave the source run directory as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from nmt.config import ConfigError, to_container
from nmt.config_checks import check_train_config
from nmt.data.datasets import prepare_data
from nmt.data.tokenizer import TokenizerPair
from nmt.store.checkpoint import load_checkpoint, save_checkpoint
from nmt.store.gate import CheckpointError
from nmt.store.loading import build_model, load_trained
from nmt.train.command import train
from nmt.train.optim import schedule_fn
from nmt.train.start import check_same_architecture
from nmt.train.validation import evaluate_loss

from .helpers import TINY_TRANSFORMER, compose_config, corpus_overrides, tiny_run_overrides

pytestmark = pytest.mark.usefixtures("one_thread")

SOURCE_STEPS = 40
FINE_TUNE_STEPS = 10
COMMON = (
    "trainer.device=cpu",
    "optim.lr=3e-3",
    "optim.warmup_steps=20",  # the fine-tuning run ends inside its warmup
    "model.attn_dropout=0.0",
)
ONE_STEP = "trainer.max_steps=1"


def half(prefix: Path, out: Path, start: int, n: int) -> Path:
    """Lines [start, start+n) of both sides of a corpus written by write_subset."""
    for lang in ("de", "en"):
        lines = Path(f"{prefix}.{lang}").read_text(encoding="utf-8").splitlines()
        Path(f"{out}.{lang}").write_text("\n".join(lines[start : start + n]) + "\n", "utf-8")
    return out


def snapshot(directory: Path) -> dict[str, tuple[str, int, int]]:
    """sha256, size and modification time of every file under ``directory``."""
    return {
        str(p.relative_to(directory)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_size,
            p.stat().st_mtime_ns,
        )
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def fine_tune_overrides(corpus: Path, tmp_path: Path, init_from: Path, *extra: str) -> list[str]:
    return tiny_run_overrides(corpus, tmp_path, *COMMON, f"trainer.init_from={init_from}", *extra)


def refused_overrides(corpus: Path, tmp_path: Path, init_from: Path, *extra: str) -> list[str]:
    """A fine-tuning run that should be refused; if it were not, it would end after one step."""
    return fine_tune_overrides(corpus, tmp_path, init_from, ONE_STEP, *extra)


@pytest.fixture(scope="module")
def runs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A source run on lines 0-60 of the corpus, then a run fine-tuned from it on lines 60-120.

    The source trains without dropout; the fine-tuning run sets model.dropout=0.1 (allowed: a
    dropout rate does not change the architecture) and asks for another vocabulary size, which
    the checkpoint's tokenizers make irrelevant.
    """
    tmp = tmp_path_factory.mktemp("finetune")
    old, new = half(corpus, tmp / "old", 0, 60), half(corpus, tmp / "new", 60, 60)
    source_cfg = compose_config(
        "train",
        tiny_run_overrides(
            old, tmp / "src", *COMMON, "model.dropout=0.0",
            f"trainer.max_steps={SOURCE_STEPS}", f"trainer.val_every={SOURCE_STEPS}",
        ),
    )  # fmt: skip
    source_dir = tmp / "src" / "outputs" / "runs" / "source"
    train(source_cfg, source_dir)
    before = snapshot(source_dir)
    ft_cfg = compose_config(
        "train",
        fine_tune_overrides(
            new, tmp / "ft", source_dir, "model.dropout=0.1", "data.vocab_size=500",
            f"trainer.max_steps={FINE_TUNE_STEPS}", "trainer.val_every=2",
        ),
    )  # fmt: skip
    ft_dir = tmp / "ft" / "outputs" / "runs" / "fine_tuned"
    result = train(ft_cfg, ft_dir)
    return {
        "tmp": tmp,
        "new": new,
        "source_dir": source_dir,
        "before": before,
        "ft_dir": ft_dir,
        "ft_cfg": ft_cfg,
        "result": result,
    }


def new_valid_loss(model: torch.nn.Module, tokenizers: TokenizerPair, runs: dict) -> float:
    """Per-token loss of ``model`` on the fine-tuning run's validation set."""
    cfg = runs["ft_cfg"]
    data = prepare_data(cfg.data, tokenizers)
    return evaluate_loss(model, data.valid, cfg, torch.device("cpu"))


# --------------------------------------------------------------------------- the new run


def test_fine_tuning_lowers_the_new_validation_loss_from_the_first_step(runs) -> None:
    source = load_trained(runs["source_dir"] / "checkpoints" / "best.pt", torch.device("cpu"))
    initial = new_valid_loss(source.model, source.tokenizers, runs)
    torch.manual_seed(0)
    fresh_model = build_model(source.cfg, source.tokenizers)
    fresh = new_valid_loss(fresh_model, source.tokenizers, runs)
    history = runs["result"]["state"]["history"]
    # the starting model is validated before the first update: its loss, as computed here
    assert history[0]["step"] == 0 and history[0]["loss"] == pytest.approx(initial, rel=1e-5)
    history = history[1:]
    losses = [h["loss"] for h in history]
    assert [h["step"] for h in history] == list(range(2, FINE_TUNE_STEPS + 1, 2))
    # the source weights were loaded: their loss, and the run's first, are far below a fresh
    # model's (about ln(vocabulary size) per token)
    assert initial < fresh - 1.5, (initial, fresh)
    assert losses[0] < fresh - 1.5, (losses, fresh)
    # and training on the new corpus lowers it from the first validation on
    assert losses[0] < initial, (losses, initial)
    assert all(b < a for a, b in pairwise(losses)), losses
    assert losses[-1] < initial - 0.1, (losses, initial)


def test_tokenizers_are_the_checkpoints_byte_for_byte(runs) -> None:
    source_ckpt = load_checkpoint(runs["source_dir"] / "checkpoints" / "best.pt")
    proto = source_ckpt["tokenizers"]["src"]
    assert source_ckpt["tokenizers"]["joint"]
    ft_dir = runs["ft_dir"]
    assert (ft_dir / "tokenizer" / "spm.model").read_bytes() == proto
    assert (runs["source_dir"] / "tokenizer" / "spm.model").read_bytes() == proto
    ft_tokenizers = load_checkpoint(ft_dir / "checkpoints" / "last.pt")["tokenizers"]
    assert ft_tokenizers == {"joint": True, "src": proto}
    # no sentencepiece model was trained for the new run: its data root has no model cache,
    # and its prepared training data was encoded with the checkpoint's tokenizer
    cache = runs["tmp"] / "ft" / "data" / "cache"
    assert not (cache / "spm").exists()
    (prepared,) = [p for p in (cache / "prepared").iterdir() if p.is_dir()]
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["options"]["tokenizer"]["given"]["src"] == hashlib.sha256(proto).hexdigest()
    assert (prepared / "spm.model").read_bytes() == proto
    # the vocabulary options of the config were replaced by the checkpoint's, and said so
    saved = yaml.safe_load((ft_dir / "config.yaml").read_text())
    assert saved["data"]["vocab_size"] == 600
    log = (ft_dir / "train.log").read_text()
    assert "data.vocab_size=500 replaced by 600" in log
    assert "none is trained" in log


def test_optimizer_schedule_and_step_count_start_afresh(runs) -> None:
    ft = load_checkpoint(runs["ft_dir"] / "checkpoints" / "last.pt")
    source = load_checkpoint(runs["source_dir"] / "checkpoints" / "last.pt")
    assert source["state"]["step"] == SOURCE_STEPS
    assert ft["state"]["step"] == FINE_TUNE_STEPS  # not SOURCE_STEPS + FINE_TUNE_STEPS
    assert ft["state"]["epoch"] < source["state"]["epoch"]  # the epochs count from 0 too
    adam_steps = {float(s["step"]) for s in ft["optimizer"]["state"].values()}
    assert adam_steps == {FINE_TUNE_STEPS}  # moments from zero, not the source's
    assert ft["scheduler"]["last_epoch"] == FINE_TUNE_STEPS
    optim_cfg = runs["ft_cfg"].optim
    lr_at = schedule_fn(optim_cfg, FINE_TUNE_STEPS)
    lr = ft["optimizer"]["param_groups"][0]["lr"]
    assert lr == pytest.approx(optim_cfg.lr * lr_at(FINE_TUNE_STEPS))
    # inverse_sqrt warms up linearly, (updates + 1) / warmup_steps: still warming up
    assert lr == pytest.approx(optim_cfg.lr * (FINE_TUNE_STEPS + 1) / 20)
    log = (runs["ft_dir"] / "train.log").read_text()
    assert "step 5: loss" in log
    assert f"lr {optim_cfg.lr * lr_at(5):.2e}" in log  # the first log line: warmup from 0


def test_the_run_records_where_it_started(runs) -> None:
    best = (runs["source_dir"] / "checkpoints" / "best.pt").resolve()
    expected = {
        "checkpoint": str(best),
        "step": SOURCE_STEPS,
        "sha256": hashlib.sha256(best.read_bytes()).hexdigest(),
    }
    ft_dir = runs["ft_dir"]
    assert json.loads((ft_dir / "summary.json").read_text())["init_from"] == expected
    assert runs["result"]["state"]["init_from"] == expected
    saved = yaml.safe_load((ft_dir / "config.yaml").read_text())
    assert saved["trainer"]["init_from"] == str(best)
    assert saved["trainer"]["resume"] is None
    assert f"fine-tuning from {best}" in (ft_dir / "train.log").read_text()


def test_source_run_is_untouched(runs) -> None:
    after = snapshot(runs["source_dir"])
    assert after == runs["before"]
    assert "checkpoints/best.pt" in after and "config.yaml" in after  # hashed what matters


def test_resumed_fine_tuning_run_keeps_its_origin(runs, tmp_path: Path) -> None:
    copy = tmp_path / "fine_tuned"
    shutil.copytree(runs["ft_dir"], copy)
    cfg = compose_config(
        "train",
        tiny_run_overrides(
            runs["new"], runs["tmp"] / "ft", *COMMON, "model.dropout=0.1",
            f"trainer.max_steps={FINE_TUNE_STEPS + 2}", "trainer.val_every=2",
            f"trainer.resume={copy}",
        ),
    )  # fmt: skip
    result = train(cfg, tmp_path / "unused")
    assert result["run_dir"] == str(copy.resolve())
    assert result["state"]["step"] == FINE_TUNE_STEPS + 2
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["init_from"] == runs["result"]["state"]["init_from"]
    assert "this run was fine-tuned from" in (copy / "train.log").read_text()


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("override", "key", "mine", "theirs"),
    [
        ("model.d_model=32", "model.d_model", "32", "64"),
        ("model.enc_layers=2", "model.enc_layers", "2", "1"),
        ("model.tie_embeddings=false", "model.tie_embeddings", "False", "True"),
    ],
)
def test_mismatching_model_config_is_an_error_naming_the_key(
    runs, tmp_path: Path, override: str, key: str, mine: str, theirs: str
) -> None:
    cfg = compose_config(
        "train", refused_overrides(runs["new"], tmp_path, runs["source_dir"], override)
    )
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        train(cfg, run_dir)
    message = str(err.value)
    assert f"{key}={mine}" in message and f"{key}={theirs}" in message, message
    assert not run_dir.exists()  # refused before anything was written


def test_another_architecture_is_an_error_naming_model_arch(runs, tmp_path: Path) -> None:
    overrides = [
        *corpus_overrides(runs["new"], tmp_path),
        "model=gru_bahdanau",
        f"trainer.init_from={runs['source_dir']}",
        ONE_STEP,
    ]
    with pytest.raises(ConfigError, match="model.arch='gru_bahdanau'.*model.arch='transformer'"):
        train(compose_config("train", overrides), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_init_from_with_resume_is_a_config_error(runs, tmp_path: Path) -> None:
    cfg = compose_config(
        "train",
        refused_overrides(
            runs["new"], tmp_path, runs["source_dir"], f"trainer.resume={runs['ft_dir']}"
        ),
    )
    with pytest.raises(ConfigError, match="trainer.init_from=.*trainer.resume="):
        check_train_config(cfg)
    with pytest.raises(ConfigError, match="exclude each other"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_missing_source_is_an_error_naming_the_option(runs, tmp_path: Path) -> None:
    cfg = compose_config(
        "train", refused_overrides(runs["new"], tmp_path, tmp_path / "no_such_run")
    )
    with pytest.raises(ConfigError, match="trainer.init_from=.*no_such_run"):
        train(cfg, tmp_path / "run")
    empty = tmp_path / "empty_run"
    empty.mkdir()
    cfg = compose_config("train", refused_overrides(runs["new"], tmp_path, empty))
    with pytest.raises(CheckpointError, match="trainer.init_from=.*no checkpoint"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def _hostile_config(path: Path) -> None:
    payload = load_checkpoint(path)
    marker = path.parent / "marker.txt"
    payload["config"]["model"]["extra"] = {
        "_target_": "builtins.open", "file": str(marker), "mode": "w"
    }  # fmt: skip
    save_checkpoint(payload, path)


def _weights_of_another_model(path: Path) -> None:
    payload = load_checkpoint(path)
    cfg = compose_config("train", [*TINY_TRANSFORMER, "model.d_model=32"])
    tokenizers = TokenizerPair.from_state_dict(payload["tokenizers"])
    payload["model"] = build_model(cfg, tokenizers).state_dict()
    save_checkpoint(payload, path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_flip_byte, "corrupted"),
        (_truncate, "truncated|no valid trailer"),
        (_hostile_config, "'model.extra"),
        (_weights_of_another_model, "weights do not fit"),
    ],
)
def test_damaged_or_hostile_checkpoint_is_refused(
    runs, tmp_path: Path, damage, message: str
) -> None:
    path = tmp_path / "source.pt"
    shutil.copyfile(runs["source_dir"] / "checkpoints" / "best.pt", path)
    damage(path)
    cfg = compose_config("train", refused_overrides(runs["new"], tmp_path, path))
    with pytest.raises(CheckpointError, match=message) as err:
        train(cfg, tmp_path / "run")
    assert str(path.name) in str(err.value)
    assert not (tmp_path / "marker.txt").exists()


def test_dropout_rates_may_differ_other_model_keys_may_not(runs) -> None:
    source = load_trained(runs["source_dir"] / "checkpoints" / "best.pt", torch.device("cpu"))
    model = compose_config("train", [*TINY_TRANSFORMER, *COMMON]).model
    for key in ("dropout", "attn_dropout", "act_dropout"):
        model[key] = 0.3
    check_same_architecture(model, source.cfg.model, Path("x.pt"))
    for key, value in to_container(source.cfg.model).items():
        if key.endswith("dropout") or key == "arch":
            continue
        changed = model.copy()
        if isinstance(value, bool):
            changed[key] = not value
        elif isinstance(value, str):  # a choice: another one
            choices = {"activation": ("relu", "gelu"), "position_style": ("vaswani", "fairseq")}
            changed[key] = next(c for c in choices[key] if c != value)
        else:
            changed[key] = value * 2
        with pytest.raises(ConfigError, match=f"model.{key}="):
            check_same_architecture(changed, source.cfg.model, Path("x.pt"))


# ------------------------------------------------------- the architecture, from the command line

# what a quiet, short fine-tuning run from the command line adds
QUIET = ("trainer.progress=false", "trainer.precision=32", "trainer.val_sentences=4",
         "trainer.attention_sentences=0", "data.max_tokens=600")  # fmt: skip


def command_line(runs: dict, tmp_path: Path, *extra: str) -> list[str]:
    """The overrides of a fine-tuning run from the source run on the new half, as nmt-train
    gets them."""
    return [*corpus_overrides(runs["new"], tmp_path), f"outputs={tmp_path / 'outputs'}",
            f"trainer.init_from={runs['source_dir']}", *extra]  # fmt: skip


def test_from_the_command_line_the_model_config_is_the_checkpoints(runs, tmp_path: Path) -> None:
    """Given the command line's overrides (as nmt-train passes them), a fine-tuning run takes
    its checkpoint's model config whatever the defaults compose to: no model keys to repeat.
    A dropout rate set one by one still applies; the log names what was replaced."""
    overrides = command_line(runs, tmp_path, "model.dropout=0.2", ONE_STEP, *QUIET)
    cfg = compose_config("train", overrides)
    assert cfg.model.d_model != 64  # the default model is not the checkpoint's
    result = train(cfg, tmp_path / "run", overrides)
    assert result["state"]["step"] == 1
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"]
    source = yaml.safe_load((runs["source_dir"] / "config.yaml").read_text())["model"]
    assert saved == source | {"dropout": 0.2}
    log = (tmp_path / "run" / "train.log").read_text()
    assert "the model config is the checkpoint's: model.d_model=" in log


def test_from_the_command_line_a_model_key_set_one_by_one_must_still_match(
    runs, tmp_path: Path
) -> None:
    overrides = command_line(runs, tmp_path, "model.d_model=32", ONE_STEP)
    with pytest.raises(ConfigError, match="model.d_model=32 differs from the checkpoint's"):
        train(compose_config("train", overrides), tmp_path / "run", overrides)
    assert not (tmp_path / "run").exists()


def test_from_the_command_line_a_key_the_checkpoints_model_lacks_is_refused_by_name(
    runs, tmp_path: Path
) -> None:
    overrides = command_line(runs, tmp_path, "+model.hidden_dim=32", ONE_STEP)
    with pytest.raises(ConfigError, match="model.hidden_dim: cannot set it on the checkpoint's"):
        train(compose_config("train", overrides), tmp_path / "run", overrides)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------- the preset


def test_the_finetune_preset_starts_from_the_checkpoint_with_a_small_decaying_lr(
    runs, tmp_path: Path
) -> None:
    """``experiment=finetune``: the checkpoint's model, a small learning rate that warms up and
    decays linearly over trainer.max_steps, validation before the first update."""
    overrides = command_line(runs, tmp_path, "experiment=finetune", "trainer.max_steps=4",
                             "trainer.val_every=4", "optim.warmup_steps=2", "trainer.log_every=1",
                             *QUIET)  # fmt: skip
    cfg = compose_config("train", overrides)
    assert (cfg.optim.lr, cfg.optim.schedule, cfg.optim.min_lr) == (5e-5, "linear", 0)
    result = train(cfg, tmp_path / "run", overrides)
    assert [h["step"] for h in result["state"]["history"]] == [0, 4]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    source = yaml.safe_load((runs["source_dir"] / "config.yaml").read_text())
    assert saved["model"] == source["model"]
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    lrs = [e["lr"] for e in events if e["event"] == "train"]
    assert lrs and max(lrs) <= 5e-5


def test_the_finetune_preset_asks_for_the_model_to_start_from(tmp_path: Path) -> None:
    cfg = compose_config("train", ["experiment=finetune", f"outputs={tmp_path}"])
    with pytest.raises(ConfigError, match="trainer.init_from"):
        check_train_config(cfg)
