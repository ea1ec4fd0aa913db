"""Optimisers and learning-rate schedules.

Every schedule is a function of the optimizer-update count (not micro-batches) that returns
a multiplier of the peak learning rate ``optim.lr``; it is wrapped in a ``LambdaLR``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from nmt.train.step import TrainState


def _warmup(step: int, warmup: int) -> float:
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def inverse_sqrt(step: int, warmup: int) -> float:
    """Linear warmup to 1, then decay with sqrt(warmup / step)."""
    step += 1
    if warmup > 0 and step < warmup:
        return step / warmup
    return math.sqrt(max(warmup, 1) / step)


def noam(step: int, warmup: int) -> float:
    """Vaswani et al.: min(step^-0.5, step * warmup^-1.5), normalised to peak at 1.

    The paper's factor d_model^-0.5 only sets the peak; here ``optim.lr`` is the peak.
    """
    step += 1
    warmup = max(warmup, 1)
    return min(step**-0.5, step * warmup**-1.5) * math.sqrt(warmup)


DecayProgress = Callable[[int], float]
"""Share of the decay phase done after ``step`` updates, in [0, 1]; called after warmup only."""


def step_progress(total: int, warmup: int) -> DecayProgress:
    """Decay measured in updates: from the end of warmup to update ``total``."""
    return lambda step: (step - warmup) / max(1, total - warmup)


def time_progress(state: TrainState, time_limit: float, step: int) -> float:
    """Decay measured in training time (``optim.decay_over=time``): the share of the time from
    ``state.decay_start`` (set by :func:`start_time_decay`) to ``time_limit`` spent."""
    return (state.train_time - state.decay_start) / max(time_limit - state.decay_start, 1e-9)


DECAYING = ("cosine", "linear")  # the schedules that consult a DecayProgress after warmup


def start_time_decay(state: TrainState, cfg: DictConfig, step: int) -> None:
    """With ``optim.decay_over=time``, record where the decay starts: ``state.decay_start`` is
    the training time when the schedule is first evaluated past warmup (at update ``step``).

    Called before every evaluation of the schedule (when the scheduler is built, at update 0,
    and before each of its steps); later calls, and a resumed run's, keep the recorded start.
    """
    if cfg.decay_over != "time" or state.decay_start >= 0:
        return
    if cfg.schedule in DECAYING and step >= cfg.warmup_steps:
        state.decay_start = state.train_time


def cosine(step: int, warmup: int, progress: DecayProgress, floor: float) -> float:
    """Linear warmup, then a half cosine from 1 down to ``floor`` at the end of the decay."""
    if step < warmup:
        return _warmup(step, warmup)
    done = min(1.0, max(0.0, progress(step)))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))


def linear(step: int, warmup: int, progress: DecayProgress, floor: float) -> float:
    """Linear warmup, then a straight line from 1 down to ``floor`` at the end of the decay."""
    if step < warmup:
        return _warmup(step, warmup)
    done = min(1.0, max(0.0, progress(step)))
    return 1 - (1 - floor) * done


def constant(step: int, warmup: int) -> float:
    """Linear warmup, then constant."""
    return _warmup(step, warmup)


def schedule_fn(
    cfg: DictConfig, max_steps: int, progress: DecayProgress | None = None
) -> Callable[[int], float]:
    """The multiplier function for ``cfg.schedule`` (validated in nmt.config).

    ``progress`` drives the cosine/linear decay; by default it runs over updates, from the
    end of warmup to ``max_steps``. The trainer passes a clock-based one for
    ``optim.decay_over=time``, so that a run with a time budget ends its decay on time
    whatever the speed of the machine.
    """
    floor = cfg.min_lr / cfg.lr
    warmup = cfg.warmup_steps
    progress = progress or step_progress(max_steps, warmup)
    fns: dict[str, Callable[[int], float]] = {
        "inverse_sqrt": partial(inverse_sqrt, warmup=warmup),
        "noam": partial(noam, warmup=warmup),
        "constant": partial(constant, warmup=warmup),
        "cosine": partial(cosine, warmup=warmup, progress=progress, floor=floor),
        "linear": partial(linear, warmup=warmup, progress=progress, floor=floor),
    }
    return fns[cfg.schedule]


FUSED_DEVICES = ("cpu", "cuda")  # where torch has a fused Adam/AdamW kernel


def build_optimizer(
    model: nn.Module, cfg: DictConfig, fused: bool | None = None
) -> torch.optim.Optimizer:
    """Adam or AdamW over the model's parameters.

    Weight decay (AdamW) is not applied to biases, norms and embeddings' 1-d parameters.
    ``fused`` (default: where the parameters' device has it, CPU and CUDA) updates all
    parameters in one kernel; on a CPU that is about six times faster than torch's default
    loop over the parameters, and it computes the same update up to float rounding. Its state
    is the default's, so a checkpoint of either loads into the other.
    """
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if fused is None:
        fused = all(p.device.type in FUSED_DEVICES for p in decay + no_decay)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[cfg.name]
    kwargs = {"fused": True} if fused else {}
    return cls(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, **kwargs)


IMPLEMENTATION_KEYS = ("fused", "foreach")  # how an update runs, not what it computes


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a checkpoint's optimizer state but keep the kernel this optimizer was built with:
    ``load_state_dict`` would also restore the checkpoint's ``fused``/``foreach`` flags, so a
    checkpoint from a run with the default loop (or from a device without a fused kernel) would
    turn the fused update off, and a fused one could turn it on where it does not exist."""
    chosen = [{k: g.get(k) for k in IMPLEMENTATION_KEYS} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, keys in zip(optimizer.param_groups, chosen, strict=True):
        group.update(keys)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    cfg: DictConfig,
    max_steps: int,
    progress: DecayProgress | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_fn(cfg, max_steps, progress))
