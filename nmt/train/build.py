"""The trainer of a set-up run (:class:`~nmt.train.setup.Setup`) and the parts it is built
from: optimizer, learning-rate schedule, loss scaler, DDP / compile wrapping, each epoch's
batches, TensorBoard's writer and the explorer page; a resumed run's states restored.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter

from nmt.config import ConfigError
from nmt.data.batching import TokenBatchSampler
from nmt.data.datasets import PreparedData
from nmt.data.resegment import Resegmenter, TrainingEpochs
from nmt.models.base import Seq2Seq
from nmt.runtime.distributed import DistInfo
from nmt.store import checkpoint as ckpt
from nmt.train.elastic import rescaled_position
from nmt.train.loop import Checkpointer, Trainer
from nmt.train.optim import (
    build_optimizer,
    build_scheduler,
    load_optimizer_state,
    start_time_decay,
    time_progress,
)
from nmt.train.runlog import RunLog
from nmt.train.setup import Setup
from nmt.train.step import TrainState
from nmt.viz.explorer import TrainingExplorer, model_info


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: DictConfig, state: TrainState, time_limit: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """``optim.schedule``; with ``optim.decay_over=time`` its decay follows ``state``'s
    training time up to ``time_limit``."""
    progress = None
    if cfg.optim.decay_over == "time":
        if time_limit <= 0:
            raise ConfigError(
                "optim.decay_over=time needs a training-time limit: set trainer.max_time"
            )
        start_time_decay(state, cfg.optim, 0)  # LambdaLR evaluates the schedule when built
        progress = partial(time_progress, state, time_limit)
    return build_scheduler(optimizer, cfg.optim, cfg.trainer.max_steps, progress)


def build_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 training's loss scaler (None for other precisions)."""
    return torch.amp.GradScaler(device.type) if precision == "16" else None


def restore(
    payload: dict[str, Any],
    model: Seq2Seq,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
) -> None:
    """Load a checkpoint's weights, optimizer, schedule, loss scale and random state."""
    model.load_state_dict(payload["model"])
    load_optimizer_state(optimizer, payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    if scaler is not None and payload["scaler"] is not None:
        scaler.load_state_dict(payload["scaler"])
    ckpt.set_rng_state(payload["rng"])


def build_train_model(
    model: Seq2Seq, dist_info: DistInfo, device: torch.device, compile_model: bool
) -> torch.nn.Module:
    """The module the updates run: ``model`` wrapped for DDP and torch.compile as configured.

    DDP does not broadcast the model's buffers before each forward: the models' only buffers
    are the sinusoidal position tables, which every rank computes alike and no update changes.
    """
    wrapped: torch.nn.Module = model
    if dist_info.enabled:
        ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
    if compile_model:
        wrapped = torch.compile(wrapped)
    return wrapped


def build_sampler(cfg: DictConfig, data: PreparedData, dist_info: DistInfo) -> TokenBatchSampler:
    """This rank's token batches of the training data, shuffled per epoch from the seed."""
    return TokenBatchSampler(
        data.train.src_lens,
        data.train.tgt_lens,
        cfg.data.max_tokens,
        shuffle=True,
        seed=cfg.trainer.seed,
        num_replicas=dist_info.world_size,
        rank=dist_info.rank,
        corpora=[(c.pairs, c.weight) for c in data.train_corpora] or None,
    )


def build_epochs(cfg: DictConfig, data: PreparedData, dist_info: DistInfo) -> TrainingEpochs:
    """Each epoch's training pairs and this rank's batches: the prepared ones, or with
    ``data.subword_alpha`` a sampled segmentation per epoch (:mod:`nmt.data.resegment`)."""
    alpha, resegmenter = cfg.data.subword_alpha, None
    if alpha > 0:
        resegmenter = Resegmenter(
            data.train, data.tokenizers, alpha, cfg.data.max_len, cfg.trainer.seed
        )
    return TrainingEpochs(data.train, build_sampler(cfg, data, dist_info), resegmenter)


def build_writer(run_dir: Path, step: int) -> SummaryWriter:
    """TensorBoard's writer; a resumed run drops the events logged after its step."""
    return SummaryWriter(str(run_dir / "tb"), purge_step=step or None)


def build_explorer(cfg: DictConfig, run_dir: Path, step: int) -> TrainingExplorer:
    """The explorer page of every validation (``trainer.attention_html``)."""
    return TrainingExplorer(run_dir / "attention", model_info(cfg), step)


def build_trainer(run: Setup) -> Trainer:
    """The trainer of ``run`` and everything it uses; a resumed run's weights, optimizer,
    schedule, state and random state restored."""
    cfg, t, main = run.cfg, run.cfg.trainer, run.dist.is_main
    state = TrainState(**run.resumed["state"]) if run.resumed else TrainState()
    if run.resumed:
        saved_world = run.resumed.get("world_size")
        state.batch_in_epoch = rescaled_position(
            state.batch_in_epoch, saved_world, run.dist.world_size
        )
    if run.init_info:
        state.init_from = run.init_info
    optimizer = build_optimizer(run.model, cfg.optim)
    scheduler = build_lr_scheduler(optimizer, cfg, state, run.time_limit)
    scaler = build_scaler(str(t.precision), run.device)
    if run.resumed is not None:
        restore(run.resumed, run.model, optimizer, scheduler, scaler)
        ranks_rng = run.resumed.get("ranks_rng")  # each rank's, as many as now: its own
        if isinstance(ranks_rng, list) and len(ranks_rng) == run.dist.world_size:
            ckpt.set_rng_state(ranks_rng[run.dist.rank])
    return Trainer(
        run, state, optimizer, scheduler, scaler,
        train_model=build_train_model(run.model, run.dist, run.device, t.compile),
        epochs=build_epochs(cfg, run.data, run.dist),
        checkpointer=Checkpointer(run.run_dir / "checkpoints", t.keep_last),
        writer=build_writer(run.run_dir, state.step) if main else None,
        run_log=RunLog(run.run_dir if main else None),
        explorer=(
            build_explorer(cfg, run.run_dir, state.step) if main and t.attention_html else None
        ),
    )  # fmt: skip
