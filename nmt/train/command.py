"""Training: ``nmt-train`` / ``make train`` (``python -m nmt.train`` under torchrun).

One explicit loop for every model. :func:`train` is :func:`~nmt.train.setup.setup` (data and
model, or a checkpoint's to resume, or, to fine-tune, a new run from a checkpoint's weights and
tokenizers), :func:`~nmt.train.build.build_trainer` (the optimizer, schedule and the other
parts the :class:`~nmt.train.loop.Trainer` is handed), :func:`run_training` (the trainer
repeats :func:`~nmt.train.step.train_step` over token batches, validates every
``trainer.val_every`` updates and writes checkpoints) and :func:`finish`. Everything a run
writes goes into its run directory; its events go to ``metrics.jsonl``
(:mod:`nmt.train.runlog`), from which ``summary.json`` is derived.
"""

from __future__ import annotations

import logging
import shutil
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import hydra
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from nmt.cli import config_dir, exit_on_error, setup_logging
from nmt.config import register_configs, to_container
from nmt.data.batching import padding_share
from nmt.runtime.distributed import exit_joined
from nmt.train.build import build_trainer
from nmt.train.elastic import drop_record, requeue_status
from nmt.train.loop import Trainer
from nmt.train.runlog import write_summary
from nmt.train.setup import setup
from nmt.viz.visualize import log_hparams

log = logging.getLogger(__name__)
register_configs()


# --------------------------------------------------------------------------- entry points


def run_training(trainer: Trainer) -> str:
    """Log the run's start and its training data, train, and log the outcome; returns why
    training stopped."""
    s, data = trainer.state, trainer.run.data
    epoch_data, first = trainer.epochs(s.epoch)
    padding = padding_share(epoch_data, first)
    log.info(
        "training data: %d pairs, %d batches per epoch per rank, padding share %.1f%%",
        len(data.train), len(first), 100 * padding,
    )  # fmt: skip
    multilingual = {}
    if "directions" in data.stats:  # each direction's pairs, pairs per epoch and share
        multilingual = {"directions": data.stats["directions"],
                        "tag_placement": data.stats["tag_placement"]}  # fmt: skip
        for name, d in data.stats["directions"].items():
            log.info(
                "direction %s: %d pairs, %d per epoch (%.1f%% of the epoch)",
                name, d["pairs"], d["per_epoch"], 100 * d["share"],
            )  # fmt: skip
    trainer.log_start(
        train_pairs=len(data.train), batches_per_epoch=len(first), padding_share=padding,
        data_time=round(trainer.run.data_time, 3), **multilingual,
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
        if trainer.preempted is None:
            drop_record(run.restart)
    if trainer.preempted is not None and run.dist.enabled:
        # a rank that exits for a restart makes torchrun stop the others: none leaves before
        # rank 0 has written the run's end
        dist.barrier()
    result = {"state": asdict(s), "stop_reason": reason, "run_dir": str(run.run_dir)}
    if trainer.preempted is not None:
        result["preempted"] = trainer.preempted
    if averaged is not None:
        result["averaged"] = averaged
    return result


def train(cfg: DictConfig, run_dir: Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Train a model as configured; returns the final training state and stop reason.

    ``overrides`` (the command line's) make a resumed run keep its own config except for the
    keys they set one by one; without them ``cfg`` is used as it is."""
    trainer = build_trainer(setup(cfg, run_dir, overrides))
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
            result = train(cfg, run_dir, list(HydraConfig.get().overrides.task))
    finally:
        _drop_if_unused(run_dir)
    if "preempted" in result:
        exit_for_requeue(*result["preempted"])
    return result["state"]["best_bleu"]


def exit_for_requeue(signal_name: str, previous: Any) -> NoReturn:
    """After the checkpoint of a preemption signal: hand the signal to the handler it had
    before (submitit's, in a submitit job: on rank 0 it resubmits the job and exits), then
    exit with 128 + its number, which torchrun (with restarts left) and schedulers that retry
    a job a signal ended take as a reason to start it again."""
    status = requeue_status(signal_name)
    log.warning("exiting with status %d (%s) for a restart; the run continues from its last "
                "checkpoint", status, signal_name)  # fmt: skip
    if callable(previous):
        previous(int(signal.Signals[signal_name]), None)
    raise SystemExit(status)


def main() -> None:
    """``nmt-train``. A process in a process group (a torchrun rank) ends through
    :func:`~nmt.runtime.distributed.exit_joined`, with the status it would have had, without
    tearing the group down: the gloo group's teardown can hang or abort a rank at the end."""
    try:
        _main()
    except SystemExit as e:  # the preemption status, an error's, or Hydra's
        exit_joined(e.code)
        raise
    exit_joined(0)


if __name__ == "__main__":
    main()
