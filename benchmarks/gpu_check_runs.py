"""The commands of the GPU check (:mod:`benchmarks.gpu_check`): subprocesses that end by a
deadline, the overrides of its training runs, and what a finished run reports.

Every command runs in a process group of its own with its output in a log file of the check's
work folder; at the deadline the whole group is killed (torchrun's ranks and data workers
with it) and the part fails with the log's last lines. Standard library only at load time.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_check import CheckFailed, Context, PartSkipped, with_defaults

# the check's precision names -> trainer.precision
PRECISIONS = {"bf16": "bf16", "fp16": "16", "fp32": "32"}

# the models as the check trains them on a GPU: the default Transformer of the 3-minute preset
# (bf16 there; the check sets the precision) and the GRU with its usual recipe, on the same
# 16k-token batches
MODELS = {
    "transformer": ("experiment=gpu_quick", "trainer.average_last=0"),
    "gru": ("experiment=gru_bahdanau", "data.max_tokens=16000", "data.eval_max_tokens=32000"),
}
# --quick: tiny models on small batches, the learning rate up after a few updates
QUICK_MODELS = {
    "transformer": (
        "model=transformer", "model.d_model=64", "model.heads=4", "model.d_ff=128",
        "model.enc_layers=1", "model.dec_layers=1",
    ),
    "gru": (
        "experiment=gru_bahdanau", "model.emb_dim=32", "model.hidden_dim=64", "model.attn_dim=64",
    ),
}  # fmt: skip
QUICK_COMMON = ("data.max_tokens=600", "optim.warmup_steps=5", "optim.lr=3e-3")
QUICK_STEPS = 16  # updates of a --quick run (a GPU run trains for --run-seconds)
LOG_EVERY = {False: 10, True: 2}  # updates per log window, by --quick
VAL_SENTENCES = {False: 200, True: 8}  # the validation at a run's end, by --quick
NO_VALIDATION = 1_000_000  # trainer.val_every of runs that validate only when they stop
TAIL_LINES = 12


# torch's own informational log lines (TORCH_LOGS), left out of a failure's log lines
TORCH_INFO_LINE = re.compile(r"^[IV]\d{4} \d\d:\d\d:\d\d")


def log_tail(log_file: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of a command's log, without torch's informational log lines."""
    if not log_file.is_file():
        return ""
    text = log_file.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join([t for t in text if not TORCH_INFO_LINE.match(t)][-lines:])


def child_env(**extra: str) -> dict[str, str]:
    """The environment of the check's commands: this one, unbuffered, with ``extra``."""
    from nmt.environment import child_environment

    return child_environment(PYTHONUNBUFFERED="1", **extra)


def spawn(cmd: Sequence[str], cwd: Path, log_file: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start ``cmd`` in a process group of its own, its output appended to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(map(str, cmd))}\n")
        log.flush()
        return subprocess.Popen(
            list(map(str, cmd)), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads, and reap ``proc``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_for(proc: subprocess.Popen, deadline: float, log_file: Path) -> int:
    """``proc``'s exit status; at ``deadline`` (``time.monotonic()``) its group is killed and
    CheckFailed says so with the log's last lines."""
    try:
        return proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise CheckFailed(
            f"stopped at the part's deadline: {log_file.name} ends\n{log_tail(log_file)}"
        ) from None


def run_logged(
    ctx: Context, cmd: Sequence[str], log_file: Path, env: dict[str, str] | None = None
) -> None:
    """Run ``cmd`` in the repository until the part's deadline; CheckFailed with the log's
    last lines when it fails."""
    proc = spawn(cmd, ctx.s.repo, log_file, env or child_env())
    rc = wait_for(proc, ctx.deadline, log_file)
    if rc != 0:
        raise CheckFailed(f"exit status {rc}: {log_file.name} ends\n{log_tail(log_file)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ training runs


@dataclass
class RunSpec:
    """One training run of the check: its folder name, model, precision (bf16 | fp16 | fp32)
    and overrides of its own (over the check's defaults, under the user's ``--override``)."""

    name: str
    model: str
    precision: str
    extra: list[str] = field(default_factory=list)


def limits(ctx: Context, steps: int = 0) -> list[str]:
    """A short run's end: ``steps`` updates (default: --run-seconds of training, or
    QUICK_STEPS updates with --quick). A run of so many updates decays its learning rate over
    them (the GPU preset's decays over its time budget)."""
    if steps or ctx.s.quick:
        steps = steps or QUICK_STEPS
        return [f"trainer.max_steps={steps}", "trainer.max_time=0", "optim.decay_over=steps"]
    return ["trainer.max_steps=0", f"trainer.max_time={ctx.s.run_seconds}"]


def train_overrides(ctx: Context, spec: RunSpec, run_dir: Path, outputs: Path) -> list[str]:
    """The Hydra overrides of a run: the model's, the check's, the spec's, the user's."""
    quick = ctx.s.quick
    base = [
        *(QUICK_MODELS if quick else MODELS)[spec.model],
        *(QUICK_COMMON if quick else ()),
        f"trainer.device={ctx.s.device}",
        f"trainer.precision={PRECISIONS[spec.precision]}",
        "trainer.progress=false",
        "trainer.attention_sentences=0",
        f"trainer.log_every={LOG_EVERY[quick]}",
        f"trainer.val_every={NO_VALIDATION}",
        f"trainer.val_sentences={VAL_SENTENCES[quick]}",
        f"outputs={outputs}",
        f"hydra.run.dir={run_dir}",
        f"data.root={ctx.s.repo / 'data'}",
        *limits(ctx),
    ]
    return with_defaults(with_defaults(base, spec.extra), ctx.s.override)


def train_command(ctx: Context, spec: RunSpec, run_dir: Path, outputs: Path) -> list[str]:
    return [sys.executable, "-m", "nmt.train", *train_overrides(ctx, spec, run_dir, outputs)]


def run_folder(ctx: Context, name: str) -> tuple[Path, Path]:
    """A run's folder in the check's work folder, and the ``outputs`` it is alone in (its
    ``latest`` link is the run's own: ``trainer.resume=auto`` follows it)."""
    outputs = ctx.work / name
    return outputs / "run", outputs


def train(ctx: Context, spec: RunSpec, env: dict[str, str] | None = None) -> Path:
    """Train ``spec`` to its end; its run folder."""
    run_dir, outputs = run_folder(ctx, spec.name)
    run_logged(ctx, train_command(ctx, spec, run_dir, outputs), outputs / "console.log", env)
    return run_dir


def tokens_per_s(windows: list[dict[str, Any]], skip: int = 1) -> dict[str, float] | None:
    """Training target tokens/s over the log windows, the first ``skip`` (warm-up) left out
    when there are more."""
    rates = [w["tgt_tokens_per_s"] for w in windows]
    if len(rates) > skip:
        rates = rates[skip:]
    if not rates:
        return None
    return {"median": statistics.median(rates), "mean": statistics.mean(rates), "n": len(rates)}


def run_figures(run_dir: Path, skip: int = 1) -> dict[str, Any]:
    """What the check reports of a finished run, from its events: updates, training seconds,
    the precision it trained in, target tokens/s, the first and last log window's loss."""
    from benchmarks.report import run_summary
    from nmt.train.runlog import of_kind, read_events

    events = read_events(run_dir)
    summary = run_summary(run_dir)
    if not events or summary is None:
        raise CheckFailed(f"the run wrote no events into {run_dir}")
    trains = of_kind(events, "train")
    windows = [{"step": t["step"], "tgt_tokens_per_s": t["tokens_per_s"]} for t in trains]
    rate = tokens_per_s(windows, skip)
    validations = of_kind(events, "validation")
    return {
        "run_dir": str(run_dir),
        "updates": summary["step"],
        "train_seconds": round(summary["train_time"], 2),
        "stop_reason": summary["stop_reason"],
        "precision": summary.get("hardware", {}).get("precision"),
        "world_size": summary.get("hardware", {}).get("world_size"),
        "tokens_per_s": round(rate["median"]) if rate else None,
        "losses": [round(t["loss"], 4) for t in trains],
        "validation_bleu": validations[-1]["bleu"] if validations else None,
    }


def loss_decreased(figures: dict[str, Any]) -> bool:
    """Whether the last log window's loss is below the first's (CheckFailed with fewer than
    two windows to compare)."""
    losses = figures["losses"]
    if len(losses) < 2:
        raise CheckFailed(
            f"{len(losses)} log window(s) in {figures['updates']} updates: too few to see the "
            "loss go down (raise --run-seconds)"
        )
    return losses[-1] < losses[0]


def trained_figures(run_dir: Path, precision: str, skip: int = 1) -> dict[str, Any]:
    """:func:`run_figures` of a run that must have trained in ``precision`` with a falling
    loss; CheckFailed otherwise."""
    figures = run_figures(run_dir, skip)
    if figures["precision"] != PRECISIONS[precision]:
        raise CheckFailed(
            f"the run trained in precision {figures['precision']}, not {PRECISIONS[precision]}"
        )
    if not loss_decreased(figures):
        raise CheckFailed(
            f"the loss did not decrease: {figures['losses'][0]:.3f} -> {figures['losses'][-1]:.3f}"
        )
    return figures


def loss_text(figures: dict[str, Any]) -> str:
    return f"loss {figures['losses'][0]:.2f} -> {figures['losses'][-1]:.2f}"


def rate_text(figures: dict[str, Any]) -> str:
    rate = figures["tokens_per_s"]
    return f"{rate:,} tok/s" if rate is not None else "- tok/s"


def needs_native_bf16(ctx: Context, what: str) -> None:
    """PartSkipped on a GPU older than compute capability 8.0, which only emulates bf16."""
    if ctx.cuda and not ctx.native_bf16:
        cap = ".".join(map(str, ctx.env["capability"]))
        raise PartSkipped(f"{what} needs compute capability 8.0 (this GPU: {cap}, bf16 emulated)")
