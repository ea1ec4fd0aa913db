"""Optimisers and learning-rate schedules.

Every schedule is a function of the optimizer-update count (not micro-batches) that returns
a multiplier of the peak learning rate ``optim.lr``; it is wrapped in a ``LambdaLR``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from omegaconf import DictConfig
from torch import nn


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


def cosine(step: int, warmup: int, total: int, floor: float) -> float:
    """Linear warmup, then a half cosine from 1 down to ``floor`` at ``total`` steps."""
    if step < warmup:
        return _warmup(step, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def linear(step: int, warmup: int, total: int, floor: float) -> float:
    """Linear warmup, then a straight line from 1 down to ``floor`` at ``total`` steps."""
    if step < warmup:
        return _warmup(step, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 1 - (1 - floor) * progress


def constant(step: int, warmup: int) -> float:
    """Linear warmup, then constant."""
    return _warmup(step, warmup)


def schedule_fn(cfg: DictConfig, max_steps: int) -> Callable[[int], float]:
    """The multiplier function for ``cfg.schedule`` (validated in nmt.config)."""
    floor = cfg.min_lr / cfg.lr
    fns: dict[str, Callable[[int], float]] = {
        "inverse_sqrt": partial(inverse_sqrt, warmup=cfg.warmup_steps),
        "noam": partial(noam, warmup=cfg.warmup_steps),
        "constant": partial(constant, warmup=cfg.warmup_steps),
        "cosine": partial(cosine, warmup=cfg.warmup_steps, total=max_steps, floor=floor),
        "linear": partial(linear, warmup=cfg.warmup_steps, total=max_steps, floor=floor),
    }
    return fns[cfg.schedule]


def build_optimizer(
    model: nn.Module, cfg: DictConfig, fused: bool = False
) -> torch.optim.Optimizer:
    """Adam or AdamW over the model's parameters.

    Weight decay (AdamW) is not applied to biases, norms and embeddings' 1-d parameters.
    """
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[cfg.name]
    kwargs = {"fused": True} if fused else {}
    return cls(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, **kwargs)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: DictConfig, max_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_fn(cfg, max_steps))
