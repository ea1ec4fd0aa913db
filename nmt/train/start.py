"""Where a run starts from: the checkpoint ``trainer.resume`` continues (a damaged ``last.pt``
replaced by the newest step file that verifies) or ``trainer.init_from`` fine-tunes (same
architecture, the checkpoint's tokenizers), found, loaded and checked before anything is
written.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.atomic import sha256_file
from nmt.cli import held_warnings
from nmt.config import ConfigError
from nmt.data.multilingual import directions_of
from nmt.data.tokenizer import TokenizerPair
from nmt.models.base import Seq2Seq
from nmt.store import checkpoint as ckpt
from nmt.store.gate import CheckpointError
from nmt.store.loading import build_model, load_checked_checkpoint
from nmt.store.paths import checkpoint_path, resolve_run_dir

log = logging.getLogger(__name__)


def _usable_checkpoint(last: Path) -> Path:
    """``last`` if it verifies, else the newest numbered checkpoint beside it that does.

    A fallback is logged as a warning naming the unusable file(s) and the one used. Raises
    CheckpointError when no checkpoint in the directory verifies.
    """
    tried: list[Path] = []
    problems: list[str] = []
    candidates = [last] if last.is_file() else []
    candidates += reversed(ckpt.all_checkpoints(last.parent))
    for path in candidates:
        twin = next((bad for bad in tried if path.samefile(bad)), None)
        if twin is not None:  # a hard link to a file that already failed
            problems.append(f"{path} is the same file as {twin.name}")
            continue
        try:
            ckpt.verify_checkpoint(path)
        except CheckpointError as e:
            log.warning("%s", e)
            tried.append(path)
            problems.append(str(e))
            continue
        if path != last:
            unusable = ", ".join(map(str, tried)) if tried else f"{last} (missing)"
            log.warning(
                "cannot resume from %s; falling back to %s, the newest checkpoint that verifies",
                unusable, path,
            )  # fmt: skip
        return path
    detail = "; ".join(problems) if problems else "no checkpoint files"
    raise CheckpointError(f"no usable checkpoint in {last.parent}: {detail}")


def find_resume_checkpoint(resume: str, outputs: Path) -> Path | None:
    """A verified checkpoint file from ``trainer.resume``: a file, a run dir, or ``auto``.

    ``auto`` means the newest run (``<outputs>/latest``; None when it has no checkpoint). For a
    run dir or ``auto``, a ``last.pt`` that is missing, truncated or corrupted is replaced by
    the newest ``step_N.pt`` or ``resume_N.pt`` that verifies, with a warning. A file named
    explicitly (other than ``last.pt``) is used only if it verifies.
    """
    if resume == "auto":
        ckpt_dir = outputs / "latest" / "checkpoints"
        last = ckpt_dir / "last.pt"
        if not (last.is_file() or ckpt.all_checkpoints(ckpt_dir)):
            return None
        return _usable_checkpoint(last)
    path = Path(resume)
    if path.is_dir():
        last = path / "checkpoints" / "last.pt"
        if not (last.is_file() or ckpt.all_checkpoints(last.parent)):
            raise ConfigError(f"trainer.resume={resume!r}: no checkpoint at {last}")
        return _usable_checkpoint(last)
    if not path.is_file():
        raise ConfigError(f"trainer.resume={resume!r}: no checkpoint at {path}")
    if path.name == "last.pt":
        return _usable_checkpoint(path)
    ckpt.verify_checkpoint(path)
    return path


# --------------------------------------------------------------------------- fine-tuning

# Data options that only shape the tokenizers: a fine-tuning run takes its tokenizers from the
# checkpoint, so these are replaced by the checkpoint's values.
TOKENIZER_DATA_KEYS = ("joint_vocab", "vocab_size", "spm_model_type", "character_coverage")


HF_PREFIX = "hf:"  # trainer.init_from=hf:SOURCE: a transformers model, imported first


def find_init_checkpoint(init_from: str, outputs: Path = Path("outputs")) -> Path:
    """The checkpoint file named by ``trainer.init_from``: a file as it is; for a run directory
    (or ``outputs/latest``) the checkpoint that ``nmt-eval`` of the run would load (its
    ``decode.checkpoint``, by default ``best.pt``; else ``best.pt``, else ``last.pt``); for
    ``hf:SOURCE`` (a transformers folder or Hub id) that of its import under
    ``<outputs>/imported/`` (:func:`nmt.store.hf_run.imported_run`)."""
    if init_from.startswith(HF_PREFIX):
        from nmt.store.hf_run import imported_run

        return checkpoint_path(imported_run(init_from[len(HF_PREFIX) :], outputs))
    path = Path(init_from)
    if path.is_file():
        return path
    run_dir = resolve_run_dir(path)
    if not run_dir.is_dir():
        raise ConfigError(
            f"trainer.init_from={init_from!r}: no checkpoint file or run directory at {path}"
        )
    try:
        return checkpoint_path(run_dir)
    except CheckpointError as e:
        raise CheckpointError(f"trainer.init_from={init_from!r}: {e}") from None


def check_same_architecture(model: DictConfig, source: DictConfig, path: Path) -> None:
    """Raise ConfigError naming the first model key whose value differs from the checkpoint's.

    Dropout rates (the keys ending in ``dropout``) may differ: they shape training, not the
    weights. Every other key of a model config decides the shapes or the computation.
    """
    hint = "a fine-tuning run keeps the architecture of the checkpoint it starts from"
    if model.arch != source.arch:
        raise ConfigError(
            f"model.arch={model.arch!r} differs from the checkpoint's model.arch="
            f"{source.arch!r} ({path}): {hint}; choose the model config (model=..., "
            "experiment=...) the checkpoint was trained with"
        )
    for key, theirs in source.items():
        mine = model.get(key)
        if not key.endswith("dropout") and mine != theirs:
            raise ConfigError(
                f"model.{key}={mine!r} differs from the checkpoint's model.{key}={theirs!r} "
                f"({path}): {hint}; set model.{key}={theirs} or use the model config the "
                "checkpoint was trained with"
            )


def _take_tokenizer_settings(data: DictConfig, source: DictConfig) -> list[str]:
    """Set the tokenizer options of ``data`` to the checkpoint's, and, from a multilingual
    checkpoint, where its language tags go (``data.tag_placement``: the model learned to read
    them there); the overridden ones, named."""
    keys = list(TOKENIZER_DATA_KEYS)
    if directions_of(source):
        keys.append("tag_placement")
    changed = [f"data.{key}={data[key]} replaced by {source[key]}" for key in keys
               if data[key] != source[key]]  # fmt: skip
    for key in keys:
        data[key] = source[key]
    if directions_of(data) and not data.joint_vocab:
        raise ConfigError(
            "trainer.init_from: the checkpoint has a sentencepiece model per side (an imported "
            "multi-target OPUS-MT model), which a multilingual run cannot train on yet"
        )
    return changed


def load_start_model(cfg: DictConfig, payload: dict[str, Any], path: Path) -> Seq2Seq:
    """The model of ``cfg`` with a checkpoint's weights (a fine-tuning run's start).

    Raises CheckpointError when the weights do not fit the model the checkpoint's config
    describes (a damaged or hand-made file that passed its checksum).
    """
    tokenizers = TokenizerPair.from_state_dict(payload["tokenizers"])
    model = build_model(cfg, tokenizers)
    try:
        model.load_state_dict(payload["model"])
    except (RuntimeError, TypeError, AttributeError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"checkpoint {path}: its weights do not fit the model its config describes: {detail}"
        ) from None
    return model


def _checkpoint_step(payload: dict[str, Any]) -> int:
    """The step a checkpoint was saved at (-1 when its state does not say)."""
    state = payload.get("state")
    step = state.get("step") if isinstance(state, dict) else None
    return step if isinstance(step, int) else -1


@dataclass
class Origin:
    """The checkpoint a run resumes (``trainer.resume``) or fine-tunes (``trainer.init_from``),
    found, loaded and checked before anything is written."""

    warnings: list[logging.LogRecord]  # logged while looking; the run's log gets them too
    resume_file: Path | None = None
    resumed: dict[str, Any] | None = None  # the payload of resume_file
    tokenizers: dict[str, Any] | None = None  # the checkpoint's tokenizers (state dict)
    start_model: Seq2Seq | None = None  # fine-tuning: the model with the checkpoint's weights
    init_info: dict[str, Any] = field(default_factory=dict)  # fine-tuning: file, step, sha256
    data_time: float = 0.0  # when the data was ready (Unix seconds)
    replaced: list[str] = field(default_factory=list)  # fine-tuning: data options replaced
    adopted: list[str] = field(default_factory=list)  # fine-tuning: model options replaced


def find_origin(
    cfg: DictConfig,
    agree: Callable[[Callable[[], Any]], Any] | None = None,
    overrides: list[str] | None = None,
) -> Origin:
    """The checkpoint named by ``trainer.resume`` or ``trainer.init_from``, if any; for
    fine-tuning, ``cfg`` takes the checkpoint's tokenizer options and names its file, and,
    given the command line's ``overrides``, the checkpoint's model config
    (:func:`adopt_architecture`).

    ``agree`` runs the search for the checkpoint to resume (under DDP: on rank 0, whose choice
    every rank then loads; :func:`nmt.train.elastic.decided_by_rank0`).
    """
    t = cfg.trainer
    agree = agree or (lambda decide: decide())
    with held_warnings() as early:  # e.g. a damaged last.pt: the run's log gets them too
        resume_file = None
        if t.resume:
            resume_file = agree(lambda: find_resume_checkpoint(t.resume, Path(cfg.outputs)))
        resumed = load_checked_checkpoint(resume_file) if resume_file else None
        init_file = find_init_checkpoint(t.init_from, Path(cfg.outputs)) if t.init_from else None
        source = load_checked_checkpoint(init_file) if init_file else None
    origin = Origin(early, resume_file, resumed, resumed["tokenizers"] if resumed else None)
    if init_file is not None:
        if overrides is not None:
            origin.adopted = adopt_architecture(cfg, source["checked_config"].model, overrides)
        check_same_architecture(cfg.model, source["checked_config"].model, init_file)
        origin.replaced = _take_tokenizer_settings(cfg.data, source["checked_config"].data)
        init_file = init_file.resolve()
        origin.start_model = load_start_model(cfg, source, init_file)
        origin.tokenizers = source["tokenizers"]  # nothing else of the source's payload is kept
        origin.init_info = {
            "checkpoint": str(init_file),
            "step": _checkpoint_step(source),
            "sha256": sha256_file(init_file),
        }
        t.init_from = str(init_file)  # config.yaml names the file, not a link that moves
    return origin


def _step_file_of(last: Path) -> Path | None:
    """The numbered file ``last.pt`` is a link to (the same file), if any."""
    for path in reversed(ckpt.all_checkpoints(last.parent)):
        try:
            if path.samefile(last):
                return path
        except OSError:
            continue
    return None


def log_origin(origin: Origin) -> None:
    """The run log's lines on where a resumed or fine-tuning run comes from."""
    if origin.resumed is not None:
        path, step = origin.resume_file, origin.resumed["state"]["step"]
        twin = _step_file_of(path) if path is not None and path.name == "last.pt" else None
        shown = f"{path} ({twin.name})" if twin is not None else str(path)
        log.info("resuming from %s at step %d", shown, step)
        started = origin.resumed["state"].get("init_from")
        if started:
            log.info("this run was fine-tuned from %s (step %s)", started["checkpoint"],
                     started["step"])  # fmt: skip
    info = origin.init_info
    if info:
        log.info(
            "fine-tuning from %s (step %d, sha256 %s): a new run with its weights and tokenizers, "
            "a fresh optimizer and learning-rate schedule, from step 0",
            info["checkpoint"], info["step"], info["sha256"][:16],
        )  # fmt: skip
        log.info(
            "the tokenizers come from the checkpoint, none is trained: %s are taken from it "
            "(%s)",
            ", ".join(f"data.{key}" for key in TOKENIZER_DATA_KEYS),
            ", ".join(origin.replaced) if origin.replaced else "the config's values equal them",
        )  # fmt: skip
        if origin.adopted:
            log.info("the model config is the checkpoint's: %s", ", ".join(origin.adopted))


# --------------------------------------------------------------------------- a resumed config

# keys a resumed run takes from the command line, not from the run: which run it continues (a
# fine-tuned run's start is in its state, and resuming is not fine-tuning again)
_NOT_CONTINUED = ("trainer.resume", "trainer.init_from")


def _leaves(cfg: DictConfig, prefix: str = "") -> dict[str, Any]:
    """Every leaf of ``cfg`` by its dotted key (lists are leaves)."""
    out: dict[str, Any] = {}
    for key in cfg:
        value = cfg[key]
        name = f"{prefix}{key}"
        if isinstance(value, DictConfig):
            out |= _leaves(value, f"{name}.")
        else:
            out[name] = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
    return out


def split_overrides(cfg: DictConfig, overrides: list[str]) -> tuple[list[str], list[str]]:
    """The command line's ``overrides`` of the composed ``cfg``: the keys set one by one
    (``trainer.max_steps``), and the group selections as written (``data=multi30k_en_de``);
    Hydra's own are left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(f"cannot read the command line's overrides: {e}") from None
    explicit, groups = [], []
    for override in parsed:
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if "." not in key and (key not in cfg or isinstance(cfg[key], DictConfig)):
            groups.append(override.input_line or key)  # a config group: data=..., experiment=...
            continue
        explicit.append(key)
    return explicit, groups


def _set_from(
    target: DictConfig, cfg: DictConfig, keys: list[str], prefix: str, what: str
) -> dict[str, tuple[Any, Any]]:
    """Set each of ``keys`` (dotted keys of the composed ``cfg``) on ``target``, a saved config
    or (``prefix="model."``) its section; each key whose value changed, with (before, after).
    ConfigError naming a key the saved config does not have."""
    changed: dict[str, tuple[Any, Any]] = {}
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        inner = key[len(prefix) :]
        before = _plain(OmegaConf.select(target, inner, default=None))  # a list changes in place
        try:
            OmegaConf.update(target, inner, value, merge=False)
        except OmegaConfBaseException as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"{key}: cannot set it on {what}: {reason}") from None
        if before != _plain(value):
            changed[key] = (before, _plain(value))
    return changed


def adopt_architecture(cfg: DictConfig, source: DictConfig, overrides: list[str]) -> list[str]:
    """Give a fine-tuning run (``cfg``) the model config of its checkpoint (``source``), with
    the model keys the command line sets one by one on top (dropout rates may differ; any other
    key that does is then refused by :func:`check_same_architecture`); the keys whose composed
    value was replaced, named."""
    explicit = [k for k in split_overrides(cfg, overrides)[0] if k.startswith("model.")]
    mine, model = cfg.model, copy.deepcopy(source)
    OmegaConf.set_struct(model, True)
    _set_from(model, cfg, explicit, "model.", "the checkpoint's model config")
    replaced = [
        f"model.{key}={mine.get(key)!r} replaced by {model[key]!r}"
        for key in model
        if key != "arch" and mine.get(key) != model[key] and f"model.{key}" not in explicit
    ]
    if mine.arch != model.arch:
        replaced.insert(0, f"model.arch={mine.arch!r} replaced by {model.arch!r}")
    cfg.model = model
    return replaced


@dataclass
class ContinuedConfig:
    """The config a resumed run trains with, and how the command line changed it."""

    cfg: DictConfig
    changed: dict[str, tuple[Any, Any]]  # key -> (the run's value, the command line's)
    not_applied: list[str]  # the command line's group selections (``data=...``)
    differing: list[str]  # keys where the composed config differs from the run's


def continued_config(cfg: DictConfig, saved: DictConfig, overrides: list[str]) -> ContinuedConfig:
    """The run's own config (``saved``, from the checkpoint) with the command line's key=value
    ``overrides`` applied; ``cfg`` is the config the command line composed.

    A run that resumes continues what it started: its data, model, optimizer and trainer
    options come from its checkpoint, whatever the defaults or the command line's group
    selections (``data=...``, ``experiment=...``) compose to now. Only keys set one by one
    (``trainer.max_steps=8000``) change it. Raises ConfigError naming an override that does not
    fit the run's config.
    """
    explicit, groups = split_overrides(cfg, overrides)
    new = copy.deepcopy(saved)
    OmegaConf.set_struct(new, True)
    what = "the resumed run's config"
    _set_from(new, cfg, list(_NOT_CONTINUED), "", what)
    changed = _set_from(new, cfg, [k for k in explicit if k not in _NOT_CONTINUED], "", what)
    composed, kept = _leaves(cfg), _leaves(new)
    differing = [
        key for key, value in kept.items()
        if key in composed and composed[key] != value and key not in _NOT_CONTINUED
        and not any(key == e or key.startswith(f"{e}.") for e in explicit)
    ]  # fmt: skip
    return ContinuedConfig(new, changed, groups if differing else [], differing)


def _plain(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def log_continued(c: ContinuedConfig) -> None:
    """The run log's lines on how a resumed run's config came about."""
    if c.differing:
        shown = ", ".join(c.differing[:8]) + (", ..." if len(c.differing) > 8 else "")
        log.info(
            "resuming with the run's own config, which differs from the composed one in %d "
            "key(s): %s", len(c.differing), shown,
        )  # fmt: skip
    if c.not_applied:
        log.warning(
            "%s: not applied; a resumed run keeps its own config, and only key=value overrides "
            "change it (or start a new run from its weights with trainer.init_from)",
            " ".join(c.not_applied),
        )  # fmt: skip
    if c.changed:
        log.info(
            "the command line changes the resumed run's config: %s",
            ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in c.changed.items()),
        )  # fmt: skip
