"""Everything before the first update: :func:`setup` makes the run directory and its log, the
device, seeds, data and model, and resolves ``trainer.precision``; it returns them as a
:class:`Setup`, from which :func:`nmt.train.build.build_trainer` builds the trainer.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from nmt.atomic import atomic_write_bytes
from nmt.cli import Progress, setup_logging, write_to_log_file
from nmt.config import to_container
from nmt.config_checks import check_train_config
from nmt.data.datasets import PreparedData, prepare_data
from nmt.data.tokenizer import TokenizerPair
from nmt.environment import dist_timeout, launcher_variables, multi30k_source
from nmt.models.base import Seq2Seq
from nmt.runtime.device import pick_device, seed_everything, use_tf32
from nmt.runtime.distributed import DistInfo, init_distributed
from nmt.runtime.precision import SpeedProbe, probe_model, resolve_precision
from nmt.store.loading import build_model
from nmt.store.paths import checkpoint_run_dir, update_latest_link
from nmt.train.elastic import (
    Restart,
    continue_restarted,
    decided_by_rank0,
    submitit_signal,
    torchrun_restart,
    write_record,
)
from nmt.train.freeze import freeze
from nmt.train.start import Origin, continued_config, find_origin, log_continued, log_origin
from nmt.train.step import LossTerms, loss_sum

log = logging.getLogger(__name__)


@dataclass
class Setup:
    """What :func:`setup` made ready: the run's config, place, device, data and model."""

    cfg: DictConfig  # the run's own copy, with trainer.precision resolved
    run_dir: Path
    dist: DistInfo
    device: torch.device
    data: PreparedData
    model: Seq2Seq
    time_limit: float  # seconds of training allowed (0: none)
    resume_file: Path | None = None  # the checkpoint a resumed run continues
    resumed: dict[str, Any] | None = None  # its payload
    init_info: dict[str, Any] = field(default_factory=dict)  # fine-tuning: file, step, sha256
    data_time: float = 0.0  # when the data was ready (Unix seconds)
    restart: Restart = field(default_factory=Restart)  # torchrun's restarts; submitit's signal


# --------------------------------------------------------------------------- setup


def time_limit(cfg: DictConfig, device: torch.device) -> float:
    """Seconds of training allowed (0 = none). On CPU an unbounded run gets a cap."""
    t = cfg.trainer
    if t.max_time > 0:
        return float(t.max_time)
    unbounded = t.max_steps == 0 and t.max_epochs == 0
    if device.type == "cpu" and unbounded and t.cpu_max_time > 0:
        log.warning(
            "no GPU: training stops after %.0f minutes (trainer.cpu_max_time). For a full run "
            "set trainer.cpu_max_time=0 or a limit such as trainer.max_steps=20000.",
            t.cpu_max_time / 60,
        )
        return float(t.cpu_max_time)
    return 0.0


def speed_probe(cfg: DictConfig, model: Seq2Seq, data: PreparedData) -> SpeedProbe:
    """The measurement behind ``trainer.precision=auto`` on a CPU with native bf16.

    Forward and backward of this model on synthetic batches of the training data's median sentence
    lengths under ``data.max_tokens`` (:func:`nmt.runtime.precision.probe_model`); cached under
    ``<data.root>/cache/precision``. The model runs eagerly even where ``trainer.compile`` will
    compile it.
    """
    lengths = (
        max(1, int(np.median(data.train.src_lens))),
        max(1, int(np.median(data.train.tgt_lens))),
    )
    vocab = (data.tokenizers.src.vocab_size, data.tokenizers.tgt.vocab_size)
    terms = LossTerms.of(cfg.trainer)
    shape = {
        "model": to_container(cfg.model),
        "vocab": list(vocab),
        "joint_vocab": data.tokenizers.joint,
        "max_tokens": int(cfg.data.max_tokens),
        "lengths": list(lengths),
    }
    return SpeedProbe(
        measure=lambda: probe_model(
            model, lambda m, b: loss_sum(m, b, terms), int(cfg.data.max_tokens), lengths, vocab
        ),
        shape=shape,
        cache_dir=Path(cfg.data.root) / "cache" / "precision",
    )


def training_precision(
    cfg: DictConfig,
    device: torch.device,
    dist_info: DistInfo,
    resumed: dict[str, Any] | None,
    probe: Callable[[], SpeedProbe],
) -> str:
    """``trainer.precision`` resolved for this run; ``probe`` makes the speed probe of ``auto``
    (:func:`speed_probe`), called only where ``auto`` may need it.

    A resumed run keeps the precision it started with (its checkpoint's config holds the
    resolved value), so ``auto`` never re-decides mid-run. Under DDP on a CPU only rank 0
    resolves (probing at most once, with the other ranks idle rather than competing for the
    same cores) and broadcasts its choice, so every rank trains in the same precision.
    """
    requested = str(cfg.trainer.precision)
    if resumed is not None:
        started = str(resumed.get("config", {}).get("trainer", {}).get("precision", "auto"))
        if requested == "auto" and started != "auto":
            log.info("trainer.precision=auto: %s, as when this run started", started)
            return started
        if started not in ("auto", requested):
            log.warning(
                "trainer.precision=%s, but this run started in %s: the resumed run is not an "
                "exact continuation",
                requested, started,
            )  # fmt: skip
    if not (dist_info.enabled and device.type == "cpu" and requested == "auto"):
        return resolve_precision(requested, device, probe())
    choice: list[str | None] = [None]
    if dist_info.is_main:
        choice = [resolve_precision(requested, device, probe())]
    dist.broadcast_object_list(choice, src=0)
    return str(choice[0])


def save_tokenizers(t: TokenizerPair, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if t.joint:
        t.src.save(directory / "spm.model")
    else:
        t.src.save(directory / "src.model")
        t.tgt.save(directory / "tgt.model")


def open_run_dir(run_dir: Path, outputs: Path, dist_info: DistInfo, early: list) -> None:
    """Start the run's log (with the warnings held until now); on the main rank make the run
    directory and point ``<outputs>/latest`` at it."""
    setup_logging(run_dir / "train.log", dist_info.rank)
    write_to_log_file(early)
    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        update_latest_link(outputs, run_dir)
    log.info("run directory: %s", run_dir)


def training_device(t: DictConfig, dist_info: DistInfo) -> torch.device:
    """The device of this rank (its own GPU under DDP), with TF32 as ``trainer.tf32`` says; sets
    ``trainer.threads``. A GPU becomes the process's current CUDA device, the one whose random
    state checkpoints record and a resume restores (:func:`nmt.store.checkpoint.rng_state`)."""
    device = pick_device(t.device)
    if dist_info.enabled and device.type == "cuda":
        device = torch.device("cuda", dist_info.gpu)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    use_tf32(device, t.tf32)
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    return device


def data_and_model(
    cfg: DictConfig, origin: Origin, run_dir: Path, dist_info: DistInfo
) -> tuple[PreparedData, float, Seq2Seq]:
    """The run's data (with the checkpoint's tokenizers, if any, else newly trained ones, saved
    in the run directory), the time (Unix seconds) it was ready, and the run's model
    (fine-tuning's start, else a new one)."""
    state = origin.tokenizers
    tokenizers = TokenizerPair.from_state_dict(state) if state else None
    progress = Progress(cfg.trainer.progress and dist_info.is_main)
    data = prepare_data(cfg.data, tokenizers, multi30k_source(), progress)
    data_time = time.time()
    if dist_info.is_main:
        save_tokenizers(data.tokenizers, run_dir / "tokenizer")
    model = origin.start_model
    return data, data_time, model if model is not None else build_model(cfg, data.tokenizers)


def setup(cfg: DictConfig, run_dir: Path, overrides: list[str] | None = None) -> Setup:
    """Everything before the first update, in the order that keeps runs reproducible.

    Checks the config, finds the checkpoint to resume or fine-tune (before anything is written),
    opens the run directory and its log, seeds, prepares data and model, resolves
    ``trainer.precision``, and only then writes config.yaml, so that it holds the precision the
    run trains in. The caller's ``cfg`` is left as it is.

    ``overrides`` are the command line's: a resumed run then trains with its own config (from
    its checkpoint) changed only by the key=value ones among them
    (:func:`~nmt.train.start.continued_config`), and a fine-tuning run with its checkpoint's
    model config (:func:`~nmt.train.start.adopt_architecture`). Without them (a config built in
    code) ``cfg`` is used as it is.
    """
    check_train_config(cfg)
    cfg = copy.deepcopy(cfg)
    launcher = launcher_variables()
    dist_info = init_distributed(cfg.trainer.device, launcher, dist_timeout())
    restart = torchrun_restart(Path(cfg.outputs), launcher, dist_info)
    restart.stop_signal = submitit_signal(launcher)
    restarted = continue_restarted(cfg.trainer, restart, run_dir, launcher)
    origin = find_origin(cfg, partial(decided_by_rank0, dist_info), overrides)
    continued = None
    if origin.resumed is not None and overrides is not None:
        continued = continued_config(cfg, origin.resumed["checked_config"], overrides)
        cfg = continued.cfg
        check_train_config(cfg)
    # a resumed run continues in place (from a file outside a run: in this new one, or in the
    # one a restarted job began); a job restarted before its first checkpoint, in its own
    run_dir = restart.run_dir or run_dir
    if origin.resume_file is not None:
        run_dir = checkpoint_run_dir(origin.resume_file) or run_dir
    if dist_info.is_main:
        write_record(restart, run_dir)
    open_run_dir(run_dir, Path(cfg.outputs), dist_info, origin.warnings)
    if restarted:
        log.info("%s", restarted)
    log_origin(origin)
    if continued is not None:
        log_continued(continued)
    device = training_device(cfg.trainer, dist_info)
    seed_everything(cfg.trainer.seed)
    data, data_time, model = data_and_model(cfg, origin, run_dir, dist_info)
    freeze(model, cfg.trainer.freeze)
    model.to(device)
    probe = partial(speed_probe, cfg, model, data)
    precision = training_precision(cfg, device, dist_info, origin.resumed, probe)
    if precision != str(cfg.trainer.precision):
        log.info("trainer.precision=%s: using %s on %s", cfg.trainer.precision, precision, device)
        cfg.trainer.precision = precision
    if dist_info.is_main:
        atomic_write_bytes(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True).encode())
    log.info("model %s: %s parameters on %s", type(model).__name__,
             f"{model.num_parameters():,}", device)  # fmt: skip
    return Setup(
        cfg, run_dir, dist_info, device, data, model, time_limit(cfg, device),
        origin.resume_file, origin.resumed, origin.init_info, data_time, restart,
    )  # fmt: skip
