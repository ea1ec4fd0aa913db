"""One optimizer update: the summed loss of a batch, gradient accumulation over micro-batches,
clipping, the non-finite check, and the training state a checkpoint carries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch.profiler import record_function

from nmt.data.batching import Batch
from nmt.runtime.device import autocast
from nmt.runtime.distributed import DistInfo

MAX_BAD_STEPS = 5  # consecutive non-finite updates before the run is stopped
# the parts of an update are profiler ranges "phase::forward", ... (benchmarks.profiling); a
# range costs a few microseconds when no profiler runs
PHASE_PREFIX = "phase::"


@dataclass
class TrainState:
    """What a checkpoint needs, besides weights and optimiser, to continue a run exactly."""

    step: int = 0  # optimizer updates done
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of `epoch` already consumed (this rank's share)
    best_bleu: float = -1.0
    best_step: int = 0
    bad_validations: int = 0  # validations since the best one (early stopping)
    train_time: float = 0.0  # seconds spent in training steps, summed over resumes
    decay_start: float = -1.0  # train_time when warmup ended (optim.decay_over=time)
    history: list[dict[str, float]] = field(default_factory=list)
    # a fine-tuning run: the checkpoint it started from (file, step, sha256); kept on resume
    init_from: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- one update


def loss_sum(model: torch.nn.Module, batch: Batch, label_smoothing: float) -> torch.Tensor:
    """Summed (label-smoothed) cross-entropy over the non-pad target tokens of a batch.

    Only the N real target positions are projected onto the vocabulary and scored, a block of
    them at a time (:func:`nmt.models.loss.projected_cross_entropy`).
    """
    targets = batch.tgt_out.flatten().index_select(0, batch.tgt_positions)  # (N,)
    return model(
        batch.src, batch.src_lens, batch.tgt_in, batch.tgt_positions, targets, label_smoothing
    )


LossFn = Callable[[torch.nn.Module, Batch, float], torch.Tensor]


@dataclass
class StepResult:
    loss: torch.Tensor  # summed loss of the update (a device tensor, read at log time)
    tokens: int  # target tokens of the update on this rank
    grad_norm: torch.Tensor
    finite: bool


def global_tokens(tokens: int, device: torch.device, dist_info: DistInfo) -> int:
    if not dist_info.enabled:
        return tokens
    count = torch.tensor([tokens], dtype=torch.float64, device=device)
    dist.all_reduce(count)
    return int(count.item())


def train_step(
    model: torch.nn.Module,
    micro_batches: list[Batch],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    cfg: DictConfig,
    device: torch.device,
    dist_info: DistInfo,
    loss_fn: LossFn = loss_sum,
) -> StepResult:
    """One optimizer update over ``micro_batches`` (gradient accumulation).

    The loss is normalised by the target tokens of the whole update across all ranks, so
    accumulation and data parallelism give the gradient of one big batch. ``loss_fn`` gives
    the summed loss of a micro-batch (:func:`loss_sum`; a test passes one that fails).
    """
    t = cfg.trainer
    tokens = sum(b.n_tgt_tokens for b in micro_batches)
    scale = dist_info.world_size / global_tokens(tokens, device, dist_info)  # DDP averages
    optimizer.zero_grad(set_to_none=True)
    loss_total = torch.zeros((), device=device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        sync = contextlib.nullcontext() if last or not dist_info.enabled else model.no_sync()
        with sync:
            with record_function(PHASE_PREFIX + "forward"), autocast(str(t.precision), device):
                loss = loss_fn(model, batch, t.label_smoothing)
            scaled = loss * scale
            with record_function(PHASE_PREFIX + "backward"):
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_total += loss.detach()
    if scaler is not None:
        scaler.unscale_(optimizer)
    max_norm = t.clip_grad_norm if t.clip_grad_norm > 0 else float("inf")
    with record_function(PHASE_PREFIX + "clip"):
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        finite = bool(torch.isfinite(grad_norm) & torch.isfinite(loss_total))
    with record_function(PHASE_PREFIX + "optimizer"):
        if scaler is not None:
            scaler.step(optimizer)  # skips the update itself when fp16 gradients overflowed
            scaler.update()
            finite = True  # the scaler handles overflow by lowering its scale
        elif finite:
            optimizer.step()
    return StepResult(loss_total, tokens, grad_norm, finite)
