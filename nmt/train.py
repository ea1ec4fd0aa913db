"""Training: ``nmt-train`` / ``make train``.

One explicit loop for every model. ``train(cfg, run_dir)`` is :func:`setup` (data and model,
or a checkpoint's to resume, or, to fine-tune, a new run from a checkpoint's weights and
tokenizers), :func:`build_trainer` (the optimizer, schedule and the other parts the
:class:`Trainer` is handed), :func:`run_training` (the trainer repeats ``train_step`` over token
batches, validates every ``trainer.val_every`` updates and writes checkpoints) and
:func:`finish`. Everything a run writes goes into its run directory; its events go to
``metrics.jsonl`` (:mod:`nmt.runlog`), from which ``summary.json`` is derived.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from nmt import checkpoint as ckpt
from nmt.atomic import atomic_write_bytes
from nmt.average import average_checkpoints
from nmt.cli import exit_on_error
from nmt.config import ConfigError, check_train_config, register_configs, to_container
from nmt.data.batching import Batch, TokenBatchSampler, eval_batches, make_batch, padding_share
from nmt.data.corpus import sha256_file
from nmt.data.prepare import EvalSet, PreparedData, prepare_data
from nmt.data.tokenizer import TokenizerPair
from nmt.explorer import TrainingExplorer, model_info
from nmt.metrics import bleu, chrf
from nmt.models.base import Seq2Seq
from nmt.optim import build_optimizer, build_scheduler
from nmt.precision import (
    Measurement,
    SpeedProbe,
    probe_model,
    resolve_precision,
    validation_decode_precision,
)
from nmt.runlog import RunLog, write_summary
from nmt.runtime import (
    DistInfo,
    autocast,
    config_dir,
    device_name,
    held_warnings,
    init_distributed,
    pick_device,
    resolve_run_dir,
    seed_everything,
    setup_logging,
    update_latest_link,
    write_to_log_file,
)
from nmt.search import DecodeOptions, translate_dataset
from nmt.trained import (
    build_model,
    checkpoint_path,
    checkpoint_run_dir,
    load_checked_checkpoint,
)
from nmt.visualize import log_hparams, log_validation_views

log = logging.getLogger("nmt.train")
register_configs()

MAX_BAD_STEPS = 5  # consecutive non-finite updates before the run is stopped


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
"""(model, batch, label smoothing) -> the summed loss of the batch, as :func:`loss_sum`."""


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
            with autocast(str(t.precision), device):
                loss = loss_fn(model, batch, t.label_smoothing)
            scaled = loss * scale
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_total += loss.detach()
    if scaler is not None:
        scaler.unscale_(optimizer)
    max_norm = t.clip_grad_norm if t.clip_grad_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    finite = bool(torch.isfinite(grad_norm) & torch.isfinite(loss_total))
    if scaler is not None:
        scaler.step(optimizer)  # skips the update itself when fp16 gradients overflowed
        scaler.update()
        finite = True  # the scaler handles overflow by lowering its scale
    elif finite:
        optimizer.step()
    return StepResult(loss_total, tokens, grad_norm, finite)


# --------------------------------------------------------------------------- validation


@torch.inference_mode()
def evaluate_loss(model: Seq2Seq, ds: EvalSet, cfg: DictConfig, device: torch.device) -> float:
    """Per-token cross-entropy (no label smoothing) of an evaluation set."""
    model.eval()
    total, tokens = 0.0, 0
    for idx in eval_batches(ds.data.src_lens, cfg.data.eval_max_tokens, ds.data.tgt_lens):
        batch = make_batch(ds.data, idx).to(device)
        with autocast(str(cfg.trainer.precision), device):
            total += float(loss_sum(model, batch, 0.0))
        tokens += batch.n_tgt_tokens
    return total / max(tokens, 1)


def validation_options(cfg: DictConfig) -> DecodeOptions:
    """How validation decodes: greedy search with the run's output caps (``decode``), in
    batches of ``data.eval_max_tokens``, in :func:`validation_decode_precision`."""
    return DecodeOptions(
        beam=1,
        max_output_len_a=cfg.decode.max_output_len_a,
        max_output_len_b=cfg.decode.max_output_len_b,
        max_tokens=cfg.data.eval_max_tokens,
        precision=validation_decode_precision(str(cfg.trainer.precision)),
    )


def validation_scores(
    model: Seq2Seq,
    data: PreparedData,
    cfg: DictConfig,
    device: torch.device,
    translate: Callable[..., list[str]] = translate_dataset,
) -> dict[str, float]:
    """Validation loss, perplexity, and greedy BLEU / chrF on the validation split.

    ``translate`` decodes the split (:func:`nmt.search.translate_dataset`; a test passes a spy).
    """
    start = time.perf_counter()
    val_loss = evaluate_loss(model, data.valid, cfg, device)
    opts = validation_options(cfg)
    hyps = translate(
        model, data.valid.data, data.tokenizers.tgt, opts, device, cfg.trainer.val_sentences
    )
    refs = data.valid.ref_text[: len(hyps)]
    return {
        "loss": val_loss,
        "ppl": math.exp(min(val_loss, 50.0)),
        "bleu": bleu(hyps, refs).score,
        "chrf": chrf(hyps, refs).score,
        "seconds": time.perf_counter() - start,
    }


# --------------------------------------------------------------------------- checkpoints


class Checkpointer:
    """Writes ``step_N.pt`` at every save (keeping the last K), ``last.pt`` and ``best.pt``.

    ``last.pt`` and ``best.pt`` are hard links to a step file (copies where links fail),
    swapped in atomically. The step file is complete before ``last.pt`` moves to it, so a crash
    at any moment leaves ``last.pt`` naming a whole checkpoint. Temporary files left by an
    interrupted write are removed at the first save.
    """

    def __init__(self, directory: Path, keep_last: int):
        self.dir = directory
        self.keep_last = keep_last
        self._swept = False

    def save(self, payload: dict[str, Any], is_best: bool) -> Path:
        """Write the step file, point ``last.pt`` (and ``best.pt``) at it, drop old step files."""
        if not self._swept:
            for stale in ckpt.remove_temporaries(self.dir):
                log.info("removed %s, left by an interrupted checkpoint write", stale)
            self._swept = True
        step_file = self.dir / f"step_{payload['state']['step']:08d}.pt"
        ckpt.save_checkpoint(payload, step_file)
        self._link(step_file, self.dir / "last.pt")
        if is_best:
            self._link(step_file, self.dir / "best.pt")
        for old in ckpt.step_checkpoints(self.dir)[: -self.keep_last]:
            old.unlink(missing_ok=True)
        return step_file

    @staticmethod
    def _link(src: Path, dst: Path) -> None:
        tmp = dst.with_name(f".{dst.name}{ckpt.TEMP_SUFFIX}")
        try:
            tmp.unlink(missing_ok=True)
            try:
                tmp.hardlink_to(src)
            except OSError:
                shutil.copyfile(src, tmp)
            tmp.replace(dst)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise ckpt.CheckpointError(
                f"could not update {dst} to {src.name}: {e.strerror or e}; {src} is complete"
            ) from e


def _usable_checkpoint(last: Path) -> Path:
    """``last`` if it verifies, else the newest ``step_N.pt`` beside it that does.

    A fallback is logged as a warning naming the unusable file(s) and the one used. Raises
    CheckpointError when no checkpoint in the directory verifies.
    """
    tried: list[Path] = []
    problems: list[str] = []
    candidates = [last] if last.is_file() else []
    candidates += reversed(ckpt.step_checkpoints(last.parent))
    for path in candidates:
        twin = next((bad for bad in tried if path.samefile(bad)), None)
        if twin is not None:  # a hard link to a file that already failed
            problems.append(f"{path} is the same file as {twin.name}")
            continue
        try:
            ckpt.verify_checkpoint(path)
        except ckpt.CheckpointError as e:
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
    raise ckpt.CheckpointError(f"no usable checkpoint in {last.parent}: {detail}")


def find_resume_checkpoint(resume: str, outputs: Path) -> Path | None:
    """A verified checkpoint file from ``trainer.resume``: a file, a run dir, or ``auto``.

    ``auto`` means the newest run (``<outputs>/latest``; None when it has no checkpoint). For a
    run dir or ``auto``, a ``last.pt`` that is missing, truncated or corrupted is replaced by
    the newest ``step_N.pt`` that verifies, with a warning. A file named explicitly (other than
    ``last.pt``) is used only if it verifies.
    """
    if resume == "auto":
        ckpt_dir = outputs / "latest" / "checkpoints"
        last = ckpt_dir / "last.pt"
        if not (last.is_file() or ckpt.step_checkpoints(ckpt_dir)):
            return None
        return _usable_checkpoint(last)
    path = Path(resume)
    if path.is_dir():
        last = path / "checkpoints" / "last.pt"
        if not (last.is_file() or ckpt.step_checkpoints(last.parent)):
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


def find_init_checkpoint(init_from: str) -> Path:
    """The checkpoint file named by ``trainer.init_from``: a file as it is; for a run directory
    (or ``outputs/latest``) the checkpoint that ``nmt-eval`` of the run would load (its
    ``decode.checkpoint``, by default ``best.pt``; else ``best.pt``, else ``last.pt``)."""
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
    except ckpt.CheckpointError as e:
        raise ckpt.CheckpointError(f"trainer.init_from={init_from!r}: {e}") from None


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
    """Set the tokenizer options of ``data`` to the checkpoint's; the overridden ones, named."""
    changed = [
        f"data.{key}={data[key]} replaced by {source[key]}"
        for key in TOKENIZER_DATA_KEYS
        if data[key] != source[key]
    ]
    for key in TOKENIZER_DATA_KEYS:
        data[key] = source[key]
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
        raise ckpt.CheckpointError(
            f"checkpoint {path}: its weights do not fit the model its config describes: {detail}"
        ) from None
    return model


def _checkpoint_step(payload: dict[str, Any]) -> int:
    """The step a checkpoint was saved at (-1 when its state does not say)."""
    state = payload.get("state")
    step = state.get("step") if isinstance(state, dict) else None
    return step if isinstance(step, int) else -1


# --------------------------------------------------------------------------- the loop


class StopSignal:
    """SIGINT/SIGTERM set a flag; the loop finishes its step, saves and exits.

    A second signal stops at once (KeyboardInterrupt); the last checkpoint stays intact.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # signals only work in the main thread
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        log.warning("%s received: finishing this step, then saving a checkpoint", self.received)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


@dataclass
class Window:
    """Training statistics between two log lines, kept on the device until read."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0

    @classmethod
    def new(cls, device: torch.device) -> Window:
        return cls(torch.zeros((), device=device), torch.zeros((), device=device))

    def add(self, res: StepResult, seconds: float) -> None:
        self.loss += res.loss
        self.grad_norm += res.grad_norm.float()
        self.tokens += res.tokens
        self.seconds += seconds
        self.steps += 1


# --------------------------------------------------------------------------- what a run uses

ValidationFn = Callable[[Seq2Seq, PreparedData, DictConfig, torch.device], dict[str, float]]
"""(model, data, config, device) -> loss, ppl, bleu, chrf, seconds, as :func:`validation_scores`."""


@dataclass(frozen=True)
class Functions:
    """The functions a run calls for its losses, validation scores, clock and precision probe.

    The defaults are the real ones; a test passes others to count, fake or break them.
    """

    loss: LossFn = loss_sum
    validation: ValidationFn = validation_scores
    clock: Callable[[], float] = time.perf_counter  # times the updates (trainer.max_time)
    probe: Callable[..., Measurement] = probe_model  # measures for trainer.precision=auto


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


@dataclass
class _Loop:
    """What the updates of :meth:`Trainer.fit` share besides the training state."""

    pbar: tqdm
    window: Window
    stop: StopSignal
    bad_in_row: int = 0  # consecutive non-finite updates


@dataclass
class Trainer:
    """The training loop, with everything it uses handed in (see :func:`build_trainer`)."""

    run: Setup
    state: TrainState
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None  # fp16 only
    train_model: torch.nn.Module  # the model as updated: wrapped for DDP / torch.compile
    sampler: TokenBatchSampler
    checkpointer: Checkpointer
    writer: SummaryWriter | None  # TensorBoard (main rank only)
    run_log: RunLog  # metrics.jsonl (writes nothing on other ranks)
    explorer: TrainingExplorer | None = None  # trainer.attention_html (main rank only)
    functions: Functions = field(default_factory=Functions)

    @property
    def t(self) -> DictConfig:
        return self.run.cfg.trainer

    @property
    def model(self) -> Seq2Seq:
        return self.run.model

    @property
    def sync_clock(self) -> bool:
        """Ranks share one clock when the lr follows it (one scalar all-reduce per update)."""
        return self.run.dist.enabled and self.run.cfg.optim.decay_over == "time"

    def _slowest_rank(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.run.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def payload(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "state": asdict(self.state),
            "rng": ckpt.rng_state(),
            "config": to_container(self.run.cfg),
            "tokenizers": self.run.data.tokenizers.state_dict(),
        }

    def save(self, is_best: bool) -> None:
        if self.run.dist.is_main:
            path = self.checkpointer.save(self.payload(), is_best)
            rel = run_path(path, self.run.run_dir)
            self.run_log.write("checkpoint", self.state.step, path=rel, best=is_best)

    # ----------------------------------------------------------------- validation

    def validate(self) -> bool:
        """Validate, log and checkpoint; True when early stopping says stop."""
        s, run = self.state, self.run
        metrics = self.functions.validation(self.model, run.data, run.cfg, run.device)
        self.model.train()
        improved = metrics["bleu"] > s.best_bleu
        if improved:
            s.best_bleu, s.best_step, s.bad_validations = metrics["bleu"], s.step, 0
        else:
            s.bad_validations += 1
        s.history.append({"step": s.step, **metrics})
        log.info(
            "validation at step %d: loss %.3f ppl %.2f BLEU %.2f chrF %.2f (%.1fs)%s",
            s.step, metrics["loss"], metrics["ppl"], metrics["bleu"], metrics["chrf"],
            metrics["seconds"], "  (new best)" if improved else "",
        )  # fmt: skip
        self.run_log.write("validation", s.step, **metrics, best=improved)
        self._show_validation(metrics)
        self.save(is_best=improved)
        return self.t.patience > 0 and s.bad_validations >= self.t.patience

    def _show_validation(self, metrics: dict[str, float]) -> None:
        """A validation's scores and attention views in TensorBoard and the explorer page."""
        t, run, step = self.t, self.run, self.state.step
        opts = validation_options(run.cfg)  # the attention drawn is the validation's decoding
        if self.writer is not None:
            for key in ("loss", "ppl", "bleu", "chrf"):
                self.writer.add_scalar(f"val/{key}", metrics[key], step)
            if t.attention_sentences > 0:
                log_validation_views(
                    self.writer, self.model, run.data.valid, run.data.tokenizers, step,
                    run.device, t.attention_sentences, t.attention_layers,
                    opts=opts,
                )  # fmt: skip
            self.writer.flush()
        if self.explorer is not None:
            self.explorer.add(
                step, self.model, run.data.valid, run.data.tokenizers, run.device,
                t.attention_sentences, f"validation BLEU {metrics['bleu']:.2f}",
                opts=opts,
            )  # fmt: skip

    # ----------------------------------------------------------------- logging

    def log_start(self, **data: Any) -> None:
        """The ``start`` event: hardware, precision, model size, the training data's figures
        (``data``), and the checkpoint the run resumes (``resumed_from``) or was fine-tuned from
        (``init_from``)."""
        run, s = self.run, self.state
        fields: dict[str, Any] = {
            **hardware(run.device, run.dist, str(run.cfg.trainer.precision)),
            "parameters": run.model.num_parameters(),
            "overrides": hydra_overrides(),
            **data,
        }
        if run.resume_file is not None:
            fields["resumed_from"] = run_path(run.resume_file, run.run_dir)
        if s.init_from:
            fields["init_from"] = s.init_from
        self.run_log.write("start", s.step, **fields)

    def log_window(self, w: Window, pbar: tqdm) -> None:
        """One log window's line, progress-bar figures, TensorBoard scalars and ``train`` event."""
        s, world = self.state, self.run.dist.world_size
        loss = float(w.loss) / max(w.tokens, 1)
        tps = w.tokens * world / max(w.seconds, 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = float(w.grad_norm) / w.steps
        pbar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:.0f}")
        log.info(
            "step %d: loss %.3f, lr %.2e, %.0f target tokens/s, grad norm %.2f",
            s.step, loss, lr, tps, grad_norm,
        )  # fmt: skip
        self.run_log.write(
            "train", s.step, epoch=s.epoch, train_time=s.train_time, loss=loss, lr=lr,
            grad_norm=grad_norm, tokens=w.tokens * world, updates=w.steps, seconds=w.seconds,
            tokens_per_s=tps,
        )  # fmt: skip
        if self.writer is None:
            return
        self.writer.add_scalar("train/loss", loss, s.step)
        self.writer.add_scalar("train/lr", lr, s.step)
        self.writer.add_scalar("train/tokens_per_s", tps, s.step)
        self.writer.add_scalar("train/grad_norm", grad_norm, s.step)
        self.writer.add_scalar("train/tokens_per_update", w.tokens / w.steps, s.step)

    # ----------------------------------------------------------------- the loop

    def stop_reason(self, signal_name: str | None) -> str:
        """Why training should stop after the current update ("" to go on)."""
        s, t, limit = self.state, self.t, self.run.time_limit
        reason = ""
        if t.max_steps and s.step >= t.max_steps:
            reason = f"reached trainer.max_steps={t.max_steps}"
        elif limit and s.train_time >= limit:
            reason = f"reached the time limit of {limit:.0f}s"
        elif signal_name:
            reason = f"stopped by {signal_name}"
        if self.run.dist.enabled:  # every rank stops at the same update
            flag = torch.tensor([1.0 if reason else 0.0], device=self.run.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and not reason:
                reason = "stopped by another rank"
        return reason

    def fit(self) -> str:
        """Train until a limit is reached; returns the reason for stopping."""
        s, t = self.state, self.t
        pbar = tqdm(
            total=t.max_steps or None,
            initial=s.step,
            disable=not (t.progress and self.run.dist.is_main),
            unit="step",
            dynamic_ncols=True,
        )
        self.model.train()
        reason = self.stop_reason(None)  # a resumed run may already be at its limit
        with StopSignal() as stop, logging_redirect_tqdm():
            loop = _Loop(pbar, Window.new(self.run.device), stop)
            while not reason:
                if t.max_epochs and s.epoch >= t.max_epochs:
                    reason = f"reached trainer.max_epochs={t.max_epochs}"
                    break
                reason = self._epoch(loop)
            pbar.close()
            self._finish(stop.received)
        return reason

    def _epoch(self, loop: _Loop) -> str:
        """Updates over the rest of this epoch's batches; the reason to stop ("" at its end)."""
        s, t = self.state, self.t
        batches = self.sampler.batches(s.epoch)
        reason = ""
        while not reason and s.batch_in_epoch + t.accumulate <= len(batches):
            group = batches[s.batch_in_epoch : s.batch_in_epoch + t.accumulate]
            reason = self._update(group, loop) or self.stop_reason(loop.stop.received)
        if s.batch_in_epoch + t.accumulate > len(batches):
            s.epoch += 1
            s.batch_in_epoch = 0
            log.info("epoch %d done at step %d", s.epoch, s.step)
        return reason

    def _update(self, group: list[Any], loop: _Loop) -> str:
        """One optimizer update over ``group``'s batches, then its log line and validation
        when due; early stopping's reason, else ""."""
        s, t, run, clock = self.state, self.t, self.run, self.functions.clock
        tic = clock()
        micro = [make_batch(run.data.train, idx).to(run.device, non_blocking=True) for idx in group]
        res = train_step(
            self.train_model, micro, self.optimizer, self.scaler, run.cfg, run.device, run.dist,
            self.functions.loss,
        )  # fmt: skip
        s.batch_in_epoch += len(group)
        seconds = clock() - tic
        s.train_time += seconds  # a skipped update took its time too
        if self.sync_clock:  # same lr on every rank
            s.train_time = self._slowest_rank(s.train_time)
        if not res.finite:
            loop.bad_in_row += 1
            self._non_finite(loop.bad_in_row)
            return ""
        loop.bad_in_row = 0
        self.scheduler.step()
        s.step += 1
        loop.window.add(res, seconds)
        loop.pbar.update(1)
        if s.step % t.log_every == 0:
            self.log_window(loop.window, loop.pbar)
            loop.window = Window.new(run.device)
        if s.step % t.val_every == 0 and self.validate():
            return f"early stopping: no BLEU gain in {t.patience} validations"
        return ""

    def _non_finite(self, bad_in_row: int) -> None:
        log.warning("non-finite loss or gradient at step %d: update skipped", self.state.step)
        if bad_in_row >= MAX_BAD_STEPS:
            raise FloatingPointError(
                f"{bad_in_row} updates in a row had a non-finite loss or gradient; stopping "
                "(the last checkpoint is intact). Try a lower optim.lr or trainer.precision=32."
            )

    def _finish(self, signal_name: str | None) -> None:
        """Validate (or, when stopped by a signal, just save) unless this step already was."""
        s = self.state
        if s.step == 0 or (s.history and s.history[-1]["step"] == s.step):
            return
        if signal_name:
            self.save(is_best=False)
        else:
            self.validate()

    def average_last(self) -> dict[str, float] | None:
        """Average the last ``trainer.average_last`` step checkpoints into ``averaged.pt``.

        The averaged weights are validated like any checkpoint; the scores are logged, kept in
        the checkpoint (``averaged.validation``) and written as the ``averaged`` event. Returns
        them, or None when the run kept fewer than two step checkpoints.
        """
        run, s = self.run, self.state
        paths = ckpt.step_checkpoints(self.checkpointer.dir)[-self.t.average_last :]
        if len(paths) < 2:
            log.warning(
                "trainer.average_last=%d: only %d step checkpoint(s); averaged.pt not written",
                self.t.average_last, len(paths),
            )  # fmt: skip
            return None
        payload = average_checkpoints(paths)
        self.model.load_state_dict(payload["model"])
        metrics = self.functions.validation(self.model, run.data, run.cfg, run.device)
        payload["averaged"]["validation"] = metrics
        target = self.checkpointer.dir / "averaged.pt"
        ckpt.save_checkpoint(payload, target)
        log.info(
            "averaged %s: validation loss %.3f BLEU %.2f chrF %.2f (best single checkpoint: "
            "BLEU %.2f at step %d) -> %s",
            ", ".join(p.stem for p in paths), metrics["loss"], metrics["bleu"], metrics["chrf"],
            s.best_bleu, s.best_step, target,
        )  # fmt: skip
        self.run_log.write(
            "averaged", s.step, checkpoints=[p.stem for p in paths],
            path=run_path(target, run.run_dir), **metrics,
        )  # fmt: skip
        if self.writer is not None:
            self.writer.add_scalar("val/bleu_averaged", metrics["bleu"], s.step)
        return metrics


def run_path(path: Path, run_dir: Path) -> str:
    """``path`` relative to the run directory when it lies inside it, else absolute."""
    path, run_dir = Path(path).resolve(), Path(run_dir).resolve()
    return str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)


def hardware(device: torch.device, dist_info: DistInfo, precision: str) -> dict[str, Any]:
    """What the run trains on (the ``start`` event, and so summary.json's ``hardware``)."""
    return {
        "device": device_name(device),
        "device_type": device.type,
        "world_size": dist_info.world_size,
        "threads": torch.get_num_threads(),
        "precision": precision,
        "torch": torch.__version__,
    }


def hydra_overrides() -> list[str]:
    """The command line's overrides; none when called without Hydra (tests, scripts)."""
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


# --------------------------------------------------------------------------- building the trainer


def time_progress(state: TrainState, time_limit: float, step: int) -> float:
    """Share of the post-warmup training time spent (optim.decay_over=time)."""
    if state.decay_start < 0:
        state.decay_start = state.train_time
    return (state.train_time - state.decay_start) / max(time_limit - state.decay_start, 1e-9)


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
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    if scaler is not None and payload["scaler"] is not None:
        scaler.load_state_dict(payload["scaler"])
    ckpt.set_rng_state(payload["rng"])


def build_train_model(
    model: Seq2Seq, dist_info: DistInfo, device: torch.device, compile_model: bool
) -> torch.nn.Module:
    """The module the updates run: ``model`` wrapped for DDP and torch.compile as configured."""
    wrapped: torch.nn.Module = model
    if dist_info.enabled:
        ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids)
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


def build_writer(run_dir: Path, step: int) -> SummaryWriter:
    """TensorBoard's writer; a resumed run drops the events logged after its step."""
    return SummaryWriter(str(run_dir / "tb"), purge_step=step or None)


def build_explorer(cfg: DictConfig, run_dir: Path, step: int) -> TrainingExplorer:
    """The explorer page of every validation (``trainer.attention_html``)."""
    return TrainingExplorer(run_dir / "attention", model_info(cfg), step)


def build_trainer(run: Setup, functions: Functions) -> Trainer:
    """The trainer of ``run`` and everything it uses; a resumed run's weights, optimizer,
    schedule, state and random state restored."""
    cfg, t, main = run.cfg, run.cfg.trainer, run.dist.is_main
    state = TrainState(**run.resumed["state"]) if run.resumed else TrainState()
    if run.init_info:
        state.init_from = run.init_info
    optimizer = build_optimizer(run.model, cfg.optim, fused=run.device.type == "cuda")
    scheduler = build_lr_scheduler(optimizer, cfg, state, run.time_limit)
    scaler = build_scaler(str(t.precision), run.device)
    if run.resumed is not None:
        restore(run.resumed, run.model, optimizer, scheduler, scaler)
    return Trainer(
        run, state, optimizer, scheduler, scaler,
        train_model=build_train_model(run.model, run.dist, run.device, t.compile),
        sampler=build_sampler(cfg, run.data, run.dist),
        checkpointer=Checkpointer(run.run_dir / "checkpoints", t.keep_last),
        writer=build_writer(run.run_dir, state.step) if main else None,
        run_log=RunLog(run.run_dir if main else None),
        explorer=(
            build_explorer(cfg, run.run_dir, state.step) if main and t.attention_html else None
        ),
        functions=functions,
    )  # fmt: skip


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


def speed_probe(
    cfg: DictConfig,
    model: Seq2Seq,
    data: PreparedData,
    probe: Callable[..., Measurement] = probe_model,
) -> SpeedProbe:
    """The measurement behind ``trainer.precision=auto`` on a CPU with native bf16.

    Forward and backward of this model on synthetic batches of the training data's median
    sentence lengths under ``data.max_tokens`` (``probe``: :func:`nmt.precision.probe_model`);
    cached under ``<data.root>/cache/precision``. The model runs eagerly even where
    ``trainer.compile`` will compile it.
    """
    lengths = (
        max(1, int(np.median(data.train.src_lens))),
        max(1, int(np.median(data.train.tgt_lens))),
    )
    vocab = (data.tokenizers.src.vocab_size, data.tokenizers.tgt.vocab_size)
    smoothing = float(cfg.trainer.label_smoothing)
    shape = {
        "model": to_container(cfg.model),
        "vocab": list(vocab),
        "joint_vocab": data.tokenizers.joint,
        "max_tokens": int(cfg.data.max_tokens),
        "lengths": list(lengths),
    }
    return SpeedProbe(
        measure=lambda: probe(
            model, lambda m, b: loss_sum(m, b, smoothing), int(cfg.data.max_tokens), lengths, vocab
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


def find_origin(cfg: DictConfig) -> Origin:
    """The checkpoint named by ``trainer.resume`` or ``trainer.init_from``, if any; for
    fine-tuning, ``cfg`` takes the checkpoint's tokenizer options and names its file."""
    t = cfg.trainer
    with held_warnings() as early:  # e.g. a damaged last.pt: the run's log gets them too
        resume_file = find_resume_checkpoint(t.resume, Path(cfg.outputs)) if t.resume else None
        resumed = load_checked_checkpoint(resume_file) if resume_file else None
        init_file = find_init_checkpoint(t.init_from) if t.init_from else None
        source = load_checked_checkpoint(init_file) if init_file else None
    origin = Origin(early, resume_file, resumed, resumed["tokenizers"] if resumed else None)
    if init_file is not None:
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


def log_origin(origin: Origin) -> None:
    """The run log's lines on where a resumed or fine-tuning run comes from."""
    if origin.resumed is not None:
        log.info("resuming from %s at step %d", origin.resume_file, origin.resumed["state"]["step"])
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
    """The device of this rank (its own GPU under DDP); sets ``trainer.threads``."""
    device = pick_device(t.device)
    if dist_info.enabled and device.type == "cuda":
        device = torch.device("cuda", dist_info.local_rank)
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
    data = prepare_data(cfg.data, TokenizerPair.from_state_dict(state) if state else None)
    data_time = time.time()
    if dist_info.is_main:
        save_tokenizers(data.tokenizers, run_dir / "tokenizer")
    model = origin.start_model
    return data, data_time, model if model is not None else build_model(cfg, data.tokenizers)


def setup(cfg: DictConfig, run_dir: Path, functions: Functions) -> Setup:
    """Everything before the first update, in the order that keeps runs reproducible.

    Checks the config, finds the checkpoint to resume or fine-tune (before anything is written),
    opens the run directory and its log, seeds, prepares data and model, resolves
    ``trainer.precision``, and only then writes config.yaml, so that it holds the precision the
    run trains in. The caller's ``cfg`` is left as it is.
    """
    check_train_config(cfg)
    cfg = copy.deepcopy(cfg)
    dist_info = init_distributed(cfg.trainer.device)
    origin = find_origin(cfg)
    if origin.resume_file is not None:  # continue in place (outside a run: in this new one)
        run_dir = checkpoint_run_dir(origin.resume_file) or run_dir
    open_run_dir(run_dir, Path(cfg.outputs), dist_info, origin.warnings)
    log_origin(origin)
    device = training_device(cfg.trainer, dist_info)
    seed_everything(cfg.trainer.seed)
    data, data_time, model = data_and_model(cfg, origin, run_dir, dist_info)
    model.to(device)
    probe = partial(speed_probe, cfg, model, data, functions.probe)
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
        origin.resume_file, origin.resumed, origin.init_info, data_time,
    )  # fmt: skip


# --------------------------------------------------------------------------- entry points


def run_training(trainer: Trainer) -> str:
    """Log the run's start and its training data, train, and log the outcome; returns why
    training stopped."""
    s, data = trainer.state, trainer.run.data
    first = trainer.sampler.batches(s.epoch)
    padding = padding_share(data.train, first)
    log.info(
        "training data: %d pairs, %d batches per epoch per rank, padding share %.1f%%",
        len(data.train), len(first), 100 * padding,
    )  # fmt: skip
    trainer.log_start(
        train_pairs=len(data.train), batches_per_epoch=len(first), padding_share=padding,
        data_time=round(trainer.run.data_time, 3),
    )  # fmt: skip
    reason = trainer.fit()
    if s.history:
        log.info("%s; best validation BLEU %.2f at step %d", reason, s.best_bleu, s.best_step)
    else:
        log.info("%s at step %d (no validation yet)", reason, s.step)
    return reason


def finish(trainer: Trainer, reason: str) -> dict[str, Any]:
    """After training: the averaged checkpoint, TensorBoard's hparams, the ``end`` event and
    summary.json (derived from metrics.jsonl); returns the run's result."""
    run, s = trainer.run, trainer.state
    stopped = reason.startswith("stopped by")
    averaged = None
    if run.cfg.trainer.average_last > 0 and run.dist.is_main and not stopped:
        averaged = trainer.average_last()
    if trainer.writer is not None:
        final = {"best_bleu": s.best_bleu, "best_step": s.best_step}
        log_hparams(trainer.writer, to_container(run.cfg), final, step=s.step)
        trainer.writer.close()
    if stopped:
        log.warning('to continue this run: make train ARGS="trainer.resume=%s"', run.run_dir)
    log.info("run directory: %s", run.run_dir)
    trainer.run_log.write(
        "end", s.step, epoch=s.epoch, train_time=s.train_time, stop_reason=reason,
        best_bleu=s.best_bleu, best_step=s.best_step,
    )  # fmt: skip
    if run.dist.is_main:
        write_summary(run.run_dir)
    result = {"state": asdict(s), "stop_reason": reason, "run_dir": str(run.run_dir)}
    if averaged is not None:
        result["averaged"] = averaged
    return result


def train(cfg: DictConfig, run_dir: Path, functions: Functions | None = None) -> dict[str, Any]:
    """Train a model as configured; returns the final training state and stop reason.

    ``functions`` replaces the loss, validation, clock or precision probe (tests).
    """
    functions = functions or Functions()
    trainer = build_trainer(setup(cfg, run_dir, functions), functions)
    return finish(trainer, run_training(trainer))


def _drop_if_unused(hydra_dir: Path) -> None:
    """Remove Hydra's fresh output dir when the run went elsewhere (a resumed run)."""
    if hydra_dir.is_dir() and {p.name for p in hydra_dir.iterdir()} <= {".hydra"}:
        shutil.rmtree(hydra_dir, ignore_errors=True)


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def _main(cfg: DictConfig) -> float:
    setup_logging()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        with exit_on_error(log):
            result = train(cfg, run_dir)
    finally:
        _drop_if_unused(run_dir)
    return result["state"]["best_bleu"]


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
