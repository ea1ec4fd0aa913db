"""The training loop: :class:`Trainer` (updates, log windows, validation, checkpoints, early
stopping, signals, the averaged checkpoint) and the :class:`Checkpointer` it writes with.

The trainer times its updates with :func:`time.perf_counter` (``trainer.max_time``) and the
checkpoints of ``trainer.save_every_minutes`` with :func:`time.monotonic`, its losses with
:func:`~nmt.train.step.loss_sum` and validates with
:func:`~nmt.train.validation.validation_scores` (under DDP on rank 0, whose scores every rank
takes).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import monotonic, perf_counter
from typing import Any

import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch.utils.tensorboard import SummaryWriter
from tqdm.contrib.logging import logging_redirect_tqdm

from nmt.atomic import TEMP_SUFFIX
from nmt.config import to_container
from nmt.data.batching import TokenDataset, make_batch
from nmt.data.datasets import EvalSet
from nmt.data.resegment import TrainingEpochs
from nmt.models.base import Seq2Seq
from nmt.runtime.device import device_name
from nmt.runtime.distributed import DistInfo
from nmt.store import checkpoint as ckpt
from nmt.store.average import average_checkpoints
from nmt.store.gate import CheckpointError
from nmt.train.elastic import decided_by_rank0
from nmt.train.optim import start_time_decay
from nmt.train.progress import Limits, Position, ProgressBar
from nmt.train.runlog import RunLog
from nmt.train.setup import Setup
from nmt.train.step import (
    Outcome,
    Skips,
    StepResult,
    TrainState,
    Window,
    loss_sum,
    settle,
    train_step,
)
from nmt.train.validation import direction_set, drawing_due, validation_options, validation_scores
from nmt.viz.explorer import TrainingExplorer
from nmt.viz.visualize import log_validation_views

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- checkpoints


class Checkpointer:
    """Writes checkpoints: ``step_N.pt`` after a validation (the last ``keep_last`` kept, and
    the ones ``trainer.average_last`` averages), ``resume_N.pt`` when the clock
    (``trainer.save_every_minutes``) or a stop saves between validations, and ``last.pt`` and
    ``best.pt``.

    A ``resume_N.pt`` only serves to continue the run: it is deleted as soon as a newer
    checkpoint of either kind is complete, and never counts among the kept or averaged ones,
    so which weights are averaged does not depend on the machine's speed or on interruptions.
    ``last.pt`` and ``best.pt`` are hard links to a numbered file (copies where links fail),
    swapped in atomically. The numbered file is complete before ``last.pt`` moves to it, so a
    crash at any moment leaves ``last.pt`` naming a whole checkpoint. Temporary files left by
    an interrupted write are removed at the first save.
    """

    def __init__(self, directory: Path, keep_last: int):
        self.dir = directory
        self.keep_last = keep_last
        self._swept = False

    def save(self, payload: dict[str, Any], is_best: bool, validated: bool = True) -> Path:
        """Write the numbered file (``step_N.pt`` if ``validated``, else ``resume_N.pt``), point
        ``last.pt`` (and ``best.pt``) at it, drop older resume files and old step files."""
        if not self._swept:
            for stale in ckpt.remove_temporaries(self.dir):
                log.info("removed %s, left by an interrupted checkpoint write", stale)
            self._swept = True
        path = self.dir / ckpt.numbered_name(payload["state"]["step"], validated)
        ckpt.save_checkpoint(payload, path)
        self._link(path, self.dir / "last.pt")
        if is_best:
            self._link(path, self.dir / "best.pt")
        for old in ckpt.resume_checkpoints(self.dir):
            if old != path:
                old.unlink(missing_ok=True)
        for old in ckpt.step_checkpoints(self.dir)[: -self.keep_last]:
            old.unlink(missing_ok=True)
        return path

    @staticmethod
    def _link(src: Path, dst: Path) -> None:
        tmp = dst.with_name(f".{dst.name}{TEMP_SUFFIX}")
        try:
            tmp.unlink(missing_ok=True)
            try:
                tmp.hardlink_to(src)
            except OSError:
                shutil.copyfile(src, tmp)
            tmp.replace(dst)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise CheckpointError(
                f"could not update {dst} to {src.name}: {e.strerror or e}; {src} is complete"
            ) from e


# --------------------------------------------------------------------------- the loop


class StopSignal:
    """SIGINT, SIGTERM and SIGUSR1 (and ``extra``: submitit's signal in a submitit job) set a
    flag; the loop finishes its update, saves and exits.

    A second SIGINT stops at once (KeyboardInterrupt); the last checkpoint stays intact. A
    preemption signal that comes again is only logged: the checkpoint is on its way.
    """

    def __init__(self, extra: signal.Signals | None = None) -> None:
        self.received: str | None = None
        self.signals = [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1]
        if extra is not None and extra not in self.signals:
            self.signals.append(extra)
        self.previous: dict[str, Any] = {}  # by name: the handler each signal had before

    def __enter__(self) -> StopSignal:
        for sig in self.signals:
            with contextlib.suppress(ValueError):  # signals only work in the main thread
                self.previous[sig.name] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            if name == "SIGINT" and self.received == "SIGINT":
                raise KeyboardInterrupt
            log.warning("%s received: the checkpoint of %s is on its way", name, self.received)
            return
        self.received = name
        log.warning("%s received: finishing this step, then saving a checkpoint", self.received)

    def code(self, name: str | None) -> int:
        """A signal's number in the ranks' agreement (2, 3, ...; 0 for none)."""
        names = [sig.name for sig in self.signals]
        return 2 + names.index(name) if name in names else 0

    def name(self, code: int) -> str:
        return self.signals[code - 2].name

    def __exit__(self, *exc: Any) -> None:
        for sig in self.signals:
            if sig.name in self.previous:
                signal.signal(sig, self.previous[sig.name])


# --------------------------------------------------------------------------- the trainer


@dataclass
class _Loop:
    """What the updates of :meth:`Trainer.fit` share besides the training state."""

    pbar: ProgressBar
    window: Window
    stop: StopSignal
    skips: Skips = field(default_factory=Skips)  # skipped updates since the last applied one
    batches_per_epoch: int = 1  # this rank's, of the current epoch
    # agreed in the last update's read (Trainer._settle): the signal received by any rank, and
    # whether rank 0's clock says the checkpoint of trainer.save_every_minutes is due
    signal: str | None = None
    save_due: bool = False
    carry: float = 0.0  # seconds of the last update after its clock was taken (its wait)


@dataclass
class Trainer:
    """The training loop, with everything it uses handed in (see
    :func:`nmt.train.build.build_trainer`)."""

    run: Setup
    state: TrainState
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None  # fp16 only
    train_model: torch.nn.Module  # the model as updated: wrapped for DDP / torch.compile
    epochs: TrainingEpochs  # each epoch's training pairs and this rank's batches
    checkpointer: Checkpointer
    writer: SummaryWriter | None  # TensorBoard (main rank only)
    run_log: RunLog  # metrics.jsonl (writes nothing on other ranks)
    explorer: TrainingExplorer | None = None  # trainer.attention_html (main rank only)
    last_save: float = 0.0  # monotonic() at the last checkpoint (or the start), rank 0's clock
    preempted: tuple[str, Any] | None = None  # the signal that stopped it, its earlier handler

    @property
    def t(self) -> DictConfig:
        return self.run.cfg.trainer

    @property
    def model(self) -> Seq2Seq:
        return self.run.model

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
            "world_size": self.run.dist.world_size,  # whose data order batch_in_epoch counts
        }

    def save(self, is_best: bool, validated: bool = True) -> None:
        """Rank 0 writes the checkpoint (``validated``: a validation's, else one only to resume
        from); every rank calls this (its random state goes in too)."""
        self.last_save = monotonic()
        ranks_rng = None
        if self.run.dist.enabled:  # each rank's own: their dropout draws differ
            ranks_rng = [None] * self.run.dist.world_size if self.run.dist.is_main else None
            dist.gather_object(ckpt.rng_state(), ranks_rng, dst=0)
        if self.run.dist.is_main:
            payload = self.payload()
            if ranks_rng is not None:
                payload["ranks_rng"] = ranks_rng
            path = self.checkpointer.save(payload, is_best, validated)
            rel = run_path(path, self.run.run_dir)
            self.run_log.write("checkpoint", self.state.step, path=rel, best=is_best)

    # ----------------------------------------------------------------- validation

    def validate(self) -> bool:
        """Validate, log and checkpoint; True when early stopping says stop.

        Under DDP rank 0 alone validates and every rank takes its scores
        (:func:`~nmt.train.elastic.decided_by_rank0`), so that the new best, the patience count,
        ``best.pt`` and the stop are decided alike on every rank; scores of their own could
        differ between ranks in the last digits and stop one rank while the others go on.
        """
        s, run = self.state, self.run
        metrics = decided_by_rank0(
            run.dist, lambda: validation_scores(self.model, run.data, run.cfg, run.device)
        )
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
        for name, d in metrics.get("directions", {}).items():
            log.info("  %s: loss %.3f BLEU %.2f chrF %.2f", name, d["loss"], d["bleu"], d["chrf"])
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
            for name, d in metrics.get("directions", {}).items():
                for key in ("loss", "bleu", "chrf"):
                    self.writer.add_scalar(f"val_{key}/{name}", d[key], step)
            if t.attention_sentences > 0 and drawing_due(self.state.history, t.attention_every):
                for label, views in self._view_sets():
                    log_validation_views(
                        self.writer, self.model, views, run.data.tokenizers, step,
                        run.device, t.attention_sentences, t.attention_layers,
                        opts=opts, label=label,
                    )  # fmt: skip
            self.writer.flush()
        if self.explorer is not None:
            self.explorer.add(
                step, self.model, run.data.valid, run.data.tokenizers, run.device,
                t.attention_sentences, f"validation BLEU {metrics['bleu']:.2f}",
                opts=opts,
            )  # fmt: skip

    def _view_sets(self) -> list[tuple[str, EvalSet]]:
        """The validation sets drawn: the split, or each direction of a multilingual one
        (labelled with it)."""
        valid, n = self.run.data.valid, self.t.attention_sentences
        if not valid.parts:
            return [("", valid)]
        return [(part[0], direction_set(valid, part, n)) for part in valid.parts]

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

    def position(self, batches_per_epoch: int) -> Position:
        """Where the run is, for the progress bar."""
        s = self.state
        return Position(s.step, s.train_time, s.epoch + s.batch_in_epoch / batches_per_epoch)

    def log_window(self, w: Window, pbar: ProgressBar, sums: list[float]) -> None:
        """One log window's line, progress-bar figures, TensorBoard scalars and ``train`` event;
        ``sums``: the window's loss and gradient-norm sums as read (:meth:`Window.sums`)."""
        s, world = self.state, self.run.dist.world_size
        loss = sums[0] / max(w.tokens, 1)
        tps = w.tokens * world / max(w.seconds, 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = sums[1] / w.steps
        pbar.note(loss=f"{loss:.3f}", lr=f"{lr:.2e}", **{"tokens/s": f"{tps:,.0f}"})
        log.info(
            "step %d: loss %.3f, lr %.2e, %.0f target tokens/s, grad norm %.2f%s",
            s.step, loss, lr, tps, grad_norm,
            f", {w.skipped} update(s) skipped (non-finite)" if w.skipped else "",
        )  # fmt: skip
        self.run_log.write(
            "train", s.step, epoch=s.epoch, train_time=s.train_time, loss=loss, lr=lr,
            grad_norm=grad_norm, tokens=w.tokens * world, updates=w.steps, seconds=w.seconds,
            tokens_per_s=tps, skipped=w.skipped,
        )  # fmt: skip
        if self.writer is None:
            return
        self.writer.add_scalar("train/loss", loss, s.step)
        self.writer.add_scalar("train/lr", lr, s.step)
        self.writer.add_scalar("train/tokens_per_s", tps, s.step)
        self.writer.add_scalar("train/grad_norm", grad_norm, s.step)
        self.writer.add_scalar("train/tokens_per_update", w.tokens / w.steps, s.step)

    # ----------------------------------------------------------------- the loop

    def stop_reason(self, stop: StopSignal | None, loop: _Loop | None = None) -> str:
        """Why training should stop after the current update ("" to go on).

        Every rank stops at the same update; a signal that reached any rank is every rank's
        reason (the highest, where several came), so that all of them save and exit alike.
        After an update (``loop`` given) the ranks have agreed on the signal and the training
        time in its read (:meth:`_settle`); before the first, they agree here.
        """
        s, t, limit = self.state, self.t, self.run.time_limit
        reason = ""
        received = stop.received if stop is not None else None
        if loop is not None and self.run.dist.enabled:
            received = loop.signal  # one received since counts at the next update
        if t.max_steps and s.step >= t.max_steps:
            reason = f"reached trainer.max_steps={t.max_steps}"
        elif limit and s.train_time >= limit:
            reason = f"reached the time limit of {limit:.0f}s"
        elif received:
            reason = f"stopped by {received}"
        if self.run.dist.enabled and stop is not None and loop is None:
            code = stop.code(received) if received else (1 if reason else 0)
            flag = torch.tensor([float(code)], device=self.run.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            agreed = int(flag.item())
            if agreed >= 2:
                stop.received = stop.name(agreed)
                reason = f"stopped by {stop.received}"
            elif agreed and not reason:
                reason = "stopped by another rank"
        return reason

    def save_due(self) -> bool:
        """Whether ``trainer.save_every_minutes`` have passed since the last checkpoint by this
        rank's clock (every rank takes rank 0's answer: :meth:`_settle`)."""
        minutes = self.t.save_every_minutes
        return minutes > 0 and monotonic() - self.last_save >= 60 * minutes

    def fit(self) -> str:
        """Train until a limit is reached; returns the reason for stopping."""
        s, t = self.state, self.t
        limits = Limits(t.max_steps, self.run.time_limit, t.max_epochs)
        pbar = ProgressBar(limits, enabled=t.progress and self.run.dist.is_main)
        self.model.train()
        self.last_save = monotonic()
        with StopSignal(self.run.restart.stop_signal) as stop, logging_redirect_tqdm():
            reason = self.stop_reason(stop)  # a resumed run may already be at its limit
            if not reason and s.step == 0 and not s.history and self.run.init_info:
                # a fine-tuning run's starting point, so that its gain shows (and best.pt is
                # never worse than the model it started from)
                log.info("validating the model trainer.init_from starts from")
                self.validate()
            loop = _Loop(pbar, Window.new(self.run.device), stop)
            while not reason:
                if t.max_epochs and s.epoch >= t.max_epochs:
                    reason = f"reached trainer.max_epochs={t.max_epochs}"
                    break
                reason = self._epoch(loop)
            pbar.close()
            self._finish(stop.received)
        if stop.received and stop.received != "SIGINT" and reason.startswith("stopped by"):
            self.preempted = (stop.received, stop.previous.get(stop.received))
        return reason

    def _epoch(self, loop: _Loop) -> str:
        """Updates over the rest of this epoch's batches; the reason to stop ("" at its end)."""
        s, t = self.state, self.t
        data, batches = self.epochs(s.epoch)
        loop.batches_per_epoch = max(len(batches), 1)
        reason = ""
        while not reason and s.batch_in_epoch + t.accumulate <= len(batches):
            group = batches[s.batch_in_epoch : s.batch_in_epoch + t.accumulate]
            reason = self._update(data, group, loop) or self.stop_reason(loop.stop, loop)
        if s.batch_in_epoch + t.accumulate > len(batches):
            s.epoch += 1
            s.batch_in_epoch = 0
            log.info("epoch %d done at step %d", s.epoch, s.step)
        return reason

    def _update(self, data: TokenDataset, group: list[Any], loop: _Loop) -> str:
        """One optimizer update over ``group``'s batches, then its log line and validation
        when due; early stopping's reason, else ""."""
        s, t, run = self.state, self.t, self.run
        tic = perf_counter()
        micro = [make_batch(data, idx).to_device(run.device) for idx in group]
        res = train_step(
            self.train_model, micro, self.optimizer, self.scaler, run.cfg, run.device, run.dist,
            loss_sum,
        )  # fmt: skip
        s.batch_in_epoch += len(group)
        out, seconds = self._settle(res, loop, tic)  # a skipped update took its time too
        if not out.applied:  # neither a step of the schedule nor an update
            loop.window.skipped += 1
            loop.skips.count(out, self.scaler is not None, s.step)
            return ""
        loop.skips = Skips()
        start_time_decay(s, run.cfg.optim, s.step + 1)  # the schedule's next value is at s.step + 1
        self.scheduler.step()
        s.step += 1
        loop.window.add(res, seconds)
        if s.step % t.log_every == 0:
            self.log_window(loop.window, loop.pbar, out.read)
            loop.window = Window.new(run.device)
        stop = False
        if s.step % t.val_every == 0:
            stop = self.validate()
            loop.pbar.note(BLEU=f"{s.history[-1]['bleu']:.2f}")
        elif loop.save_due:
            log.info("step %d: %g minutes since the last checkpoint (trainer.save_every_minutes)",
                     s.step, t.save_every_minutes)  # fmt: skip
            self.save(is_best=False, validated=False)
        loop.pbar.show(self.position(loop.batches_per_epoch))
        if stop:
            return f"early stopping: no BLEU gain in {t.patience} validations"
        return ""

    def _settle(self, res: StepResult, loop: _Loop, tic: float) -> tuple[Outcome, float]:
        """Update ``res``'s outcome, read in the host's one wait for the device per update, and
        the update's seconds (the previous update's wait included). The ranks agree in that
        read on the signal received by any, on rank 0's checkpoint clock and on the training
        time (the slowest rank's), so that they stop, save and set the learning rate alike;
        it brings the log window's sums too when the update would end the window."""
        s, run, stop = self.state, self.run, loop.stop
        mark = perf_counter()
        seconds = loop.carry + (mark - tic)
        due = run.dist.is_main and self.save_due()
        shared = [stop.code(stop.received), float(due), s.train_time + seconds]
        sums = loop.window.sums(res) if (s.step + 1) % self.t.log_every == 0 else []
        out = settle(res, shared, sums, run.device, run.dist)
        code, due, s.train_time = out.agreed
        loop.signal, loop.save_due = stop.name(int(code)) if code >= 2 else None, due > 0
        if loop.signal:
            stop.received = loop.signal
        loop.carry = perf_counter() - mark
        return out, seconds

    def _finish(self, signal_name: str | None) -> None:
        """Validate (or, when stopped by a signal, just save) unless this step already was."""
        s = self.state
        if s.step == 0 or (s.history and s.history[-1]["step"] == s.step):
            return
        if signal_name:
            self.save(is_best=False, validated=False)
        else:
            self.validate()

    def average_last(self) -> dict[str, float] | None:
        """Average the last ``trainer.average_last`` validations' checkpoints (``step_N.pt``;
        never the clock's or a stop's ``resume_N.pt``) into ``averaged.pt``.

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
        metrics = validation_scores(self.model, run.data, run.cfg, run.device)
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
