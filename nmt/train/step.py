"""One optimizer update: the summed loss of a batch, gradient accumulation over micro-batches,
clipping, the non-finite check, and the training state a checkpoint carries; what the host
reads of an update, and the log window's statistics.

The host waits for the device once per update, in :func:`settle`: an update runs from the
batch's copy to the optimizer step without reading anything back (the non-finite check skips
the step on the device), and the one read brings the update's outcome, the ranks' agreement
on when to stop and save, and the log window's sums when the update ends one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch.profiler import record_function

from nmt.data.batching import Batch
from nmt.models.base import host_to_device
from nmt.runtime.device import autocast
from nmt.runtime.distributed import DistInfo

log = logging.getLogger(__name__)

MAX_BAD_STEPS = 5  # consecutive non-finite updates before the run is stopped
# consecutive fp16 updates skipped for overflowing gradients before the run is stopped: the
# loss scale has then been halved as often, from 2**16 (GradScaler's start) to below 1e-4
MAX_OVERFLOWS = 30
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


@dataclass(frozen=True)
class LossTerms:
    """What a training loss adds up: the label smoothing of the cross-entropy, and the weight
    of R-Drop's consistency term (0: one pass, the plain loss; :mod:`nmt.models.rdrop`)."""

    label_smoothing: float = 0.0
    rdrop_alpha: float = 0.0

    @classmethod
    def of(cls, t: DictConfig) -> LossTerms:
        """The terms of ``trainer``'s config."""
        return cls(float(t.label_smoothing), float(t.rdrop_alpha))


def loss_sum(model: torch.nn.Module, batch: Batch, terms: LossTerms) -> torch.Tensor:
    """Summed (label-smoothed) cross-entropy over the non-pad target tokens of a batch, with
    R-Drop's two passes and their consistency term where ``terms`` ask for it.

    Only the N real target positions are projected onto the vocabulary and scored, a block of
    them at a time (:func:`nmt.models.loss.projected_cross_entropy`).
    """
    targets = batch.tgt_out.flatten().index_select(0, batch.tgt_positions)  # (N,)
    return model(
        batch.src, batch.src_lens, batch.tgt_in, batch.tgt_positions, targets,
        terms.label_smoothing, src_lens_host=batch.src_lens_host, rdrop_alpha=terms.rdrop_alpha,
    )  # fmt: skip


LossFn = Callable[[torch.nn.Module, Batch, LossTerms], torch.Tensor]

LOSS, GRADIENT = 0, 1  # the entries of StepResult.flags


@dataclass
class StepResult:
    loss: torch.Tensor  # summed loss of the update (a device tensor, read at log time)
    tokens: int  # target tokens of the update on this rank
    grad_norm: torch.Tensor
    # (2,) float32 on the device: 1.0 at LOSS where the summed loss was not finite, at
    # GRADIENT where the gradient norm was not (on any rank under DDP); the optimizer step
    # was skipped where either is set
    flags: torch.Tensor


def loss_scale(tokens: int, device: torch.device, dist_info: DistInfo) -> float | torch.Tensor:
    """What a rank's summed loss is multiplied by: 1 / the update's target tokens, so that
    accumulation and data parallelism give the gradient of one big batch. Under DDP (which
    averages the ranks' gradients) world size / the tokens of all ranks, a float32 scalar on
    the device: the ranks' sum is not read back."""
    if not dist_info.enabled:
        return 1 / tokens
    count = host_to_device(torch.tensor(tokens, dtype=torch.float64), device)
    dist.all_reduce(count)
    return (dist_info.world_size / count).float()


def non_finite(loss: torch.Tensor, grad_norm: torch.Tensor, dist_info: DistInfo) -> torch.Tensor:
    """StepResult.flags of an update's summed loss and gradient norm, the same on every rank."""
    flags = torch.stack([loss.isfinite(), grad_norm.isfinite()]).logical_not().float()  # (2,)
    if dist_info.enabled:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return flags


def step_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """``optimizer.step()`` unless ``skip``, a float32 scalar on the device (1.0: skip).

    A fused Adam/AdamW takes the flag on the device, as it takes a GradScaler's ``found_inf``:
    where it is set the kernel leaves weights, moments and step counts as they were, and the
    host does not wait for it. Another optimizer needs the flag on the host first.
    """
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = skip  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
    elif not bool(skip):
        optimizer.step()


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

    The loss is normalised by the target tokens of the whole update across all ranks
    (:func:`loss_scale`). ``loss_fn`` gives the summed loss of a micro-batch (:func:`loss_sum`;
    a test passes one that fails). An update whose loss or gradient is not finite is not
    applied (:func:`step_unless`); with fp16's ``scaler``, overflowing gradients also lower the
    loss scale. Nothing is read back from the device here.
    """
    t = cfg.trainer
    terms = LossTerms.of(t)
    tokens = sum(b.n_tgt_tokens for b in micro_batches)
    scale = loss_scale(tokens, device, dist_info)
    optimizer.zero_grad(set_to_none=True)
    loss_total = torch.zeros((), device=device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        sync = contextlib.nullcontext() if last or not dist_info.enabled else model.no_sync()
        with sync:
            with record_function(PHASE_PREFIX + "forward"), autocast(str(t.precision), device):
                loss = loss_fn(model, batch, terms)
            scaled = loss * scale
            with record_function(PHASE_PREFIX + "backward"):
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_total += loss.detach()
    if scaler is not None:
        scaler.unscale_(optimizer)
    max_norm = t.clip_grad_norm if t.clip_grad_norm > 0 else float("inf")
    with record_function(PHASE_PREFIX + "clip"):
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        flags = non_finite(loss_total, grad_norm, dist_info)
    with record_function(PHASE_PREFIX + "optimizer"):
        step_unless(optimizer, flags.amax())
        if scaler is not None:
            scaler.update()  # halves the scale after overflowing gradients, else may grow it
    return StepResult(loss_total, tokens, grad_norm, flags)


# --------------------------------------------------------------------------- reading an update


@dataclass
class Outcome:
    """What the host learns of an update in :func:`settle`."""

    loss_finite: bool
    applied: bool  # loss and gradient finite (on every rank): the optimizer stepped
    agreed: list[float]  # the host values given to settle, the ranks' largest under DDP
    read: list[float]  # the device scalars asked for, in their order


def settle(
    res: StepResult,
    shared: Sequence[float],
    scalars: Sequence[torch.Tensor],
    device: torch.device,
    dist_info: DistInfo,
) -> Outcome:
    """The outcome of update ``res``, in one read from the device: the host's one wait for it
    per update.

    ``shared``: host values the ranks must agree on; under DDP they are all-reduced (MAX) and
    read with the flags, in one process they are taken as they are. ``scalars``: this rank's
    device scalars to read along.
    """
    parts = [res.flags.double()]
    if dist_info.enabled and shared:
        agreed = host_to_device(torch.tensor(list(shared), dtype=torch.float64), device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        parts.append(agreed)
    parts += [x.detach().double().reshape(1) for x in scalars]
    values = torch.cat(parts).tolist()  # the read
    flags, values = values[: len(res.flags)], values[len(res.flags) :]
    if dist_info.enabled:
        shared, values = values[: len(shared)], values[len(shared) :]
    return Outcome(flags[LOSS] == 0, max(flags) == 0, list(shared), values)


@dataclass
class Window:
    """Training statistics between two log lines: the sums of the updates applied, kept on the
    device until read, and the count of those skipped, whose loss is not in the sums."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    skipped: int = 0

    @classmethod
    def new(cls, device: torch.device) -> Window:
        return cls(torch.zeros((), device=device), torch.zeros((), device=device))

    def sums(self, res: StepResult) -> list[torch.Tensor]:
        """The loss and gradient-norm sums with update ``res`` added: read with its outcome
        when the update would end the window."""
        return [self.loss + res.loss, self.grad_norm + res.grad_norm.float()]

    def add(self, res: StepResult, seconds: float) -> None:
        """Add an applied update."""
        self.loss += res.loss
        self.grad_norm += res.grad_norm.float()
        self.tokens += res.tokens
        self.seconds += seconds
        self.steps += 1


@dataclass
class Skips:
    """Updates skipped in a row (none applied since); too many stop the run."""

    bad: int = 0  # for a non-finite loss, or gradient without fp16's loss scaler
    overflows: int = 0  # for overflowing fp16 gradients of a finite loss

    def count(self, out: Outcome, scaled: bool, step: int) -> None:
        """Count skipped update ``out`` after ``step`` updates; ``scaled``: fp16's loss scaler
        runs, which handles overflowing gradients by lowering its scale."""
        if scaled and out.loss_finite:
            self.overflows += 1
            log.info("step %d: fp16 gradients overflowed: update skipped, loss scale lowered", step)
            if self.overflows >= MAX_OVERFLOWS:
                raise FloatingPointError(
                    f"{self.overflows} updates in a row overflowed in fp16, however low the loss "
                    "scale; stopping (the last checkpoint is intact). Try a lower optim.lr or "
                    "trainer.precision=bf16 or 32."
                )
            return
        self.bad += 1
        log.warning("non-finite loss or gradient at step %d: update skipped", step)
        if self.bad >= MAX_BAD_STEPS:
            raise FloatingPointError(
                f"{self.bad} updates in a row had a non-finite loss or gradient; stopping "
                "(the last checkpoint is intact). Try a lower optim.lr or trainer.precision=32."
            )
