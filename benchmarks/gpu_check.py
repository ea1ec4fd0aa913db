"""GPU check: the default Transformer trained on Multi30k for 3 minutes in bf16, measured.

One run (under 8 minutes on an H200) that

1. measures the device's matrix-product peak in the training precision
   (:func:`benchmarks.machine.matmul_peak`);
2. trains ``experiment=gpu_quick`` (``python -m nmt.train``) for ``--train-seconds`` of
   training time, and reads the run's events (``metrics.jsonl``, :mod:`nmt.train.runlog`) for the
   validation BLEU against wall-clock time and the training throughput (target tokens/s);
3. times real training steps of the trained configuration
   (:func:`benchmarks.timing.time_training`): target tokens/s, achieved TFLOP/s and model FLOPs
   utilisation against the measured peak;
4. scores the run as it is meant to be decoded (beam 5; the averaged weights if they beat the
   best checkpoint on validation) on the test split
   (``python -m nmt.evaluate``);
5. prints a summary and writes one JSON (``--out``).

On the GPU machine run it through ``bash scripts/gpu_check.sh``, which first installs the
Python packages the machine lacks from the wheels of ``make gpu-wheels``; ``scripts/
gpu_check.py`` is the command line. This module holds the check's steps and the result
they make; :mod:`benchmarks.gpu_wheels` finds and installs those packages' wheels,
:mod:`benchmarks.gpu_check_report` prints the summary. All three import only the standard
library at load time: the wheel helpers run before those packages are there.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import run_summary
from benchmarks.report import say as _say
from nmt.environment import MULTI30K_MIRROR, child_environment, multi30k_source

SCHEMA = "nmt-gpu-check/1"
OUT = Path("outputs") / "gpu_check" / "gpu_check.json"  # in the repository: the default JSON
MULTI30K_FILES = tuple(
    f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")
)
TEST_SET = "test_2016_flickr"

# Packages nmt imports that must be on the GPU machine already; the others come as
# wheels (benchmarks.gpu_wheels).
PREINSTALLED = ("torch", "numpy", "sentencepiece", "sacrebleu", "tensorboard")
RUNTIME_IMPORTS = (*PREINSTALLED, "hydra", "omegaconf", "yaml", "tqdm", "matplotlib.figure")


class CheckFailed(RuntimeError):
    """A step of the check failed; the message says which and why."""


@dataclass
class GpuCheckSettings:
    """What the check runs (the options of ``scripts/gpu_check.py``, same names)."""

    repo: Path  # the repository: training runs there, data/ holds Multi30k
    out: Path  # the JSON; the run goes beside it
    device: str = "cuda"
    train_seconds: float = 180
    experiment: str = "gpu_quick"
    override: list[str] = field(default_factory=list)  # Hydra overrides for the training run
    matmul_n: int = 0  # 0: 8192 on a GPU, 512 on the CPU
    bench_steps: int = 20  # timed training steps (0 = no bench)
    bench_warmup: int = 5
    no_eval: bool = False
    goal_bleu: float = 40.0


def say(msg: str) -> None:
    """Progress on stderr."""
    _say("gpu-check", msg)


# ------------------------------------------------------------------------------ preconditions


def import_problems(modules: Sequence[str] = RUNTIME_IMPORTS) -> list[str]:
    """``module: error`` for each module that fails to import."""
    problems = []
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as e:  # any failure to import is a finding here
            problems.append(f"{module}: {type(e).__name__}: {e}")
    return problems


def override_keys(overrides: Sequence[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


def uses_multi30k(overrides: Sequence[str]) -> bool:
    """Whether the overrides keep the data on Multi30k (they may switch to other files)."""
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.lstrip("+~")
        if (key == "data" and not value.startswith("multi30k")) or (
            key == "data.corpus" and value != "multi30k"
        ):
            return False
    return True


def corpus_problem(data_root: Path, mirror: str | None) -> str | None:
    """None when every Multi30k file the check needs is in ``data_root/multi30k`` or in the
    mirror directory; else an error naming both places."""
    local = data_root / "multi30k"
    places = [local] + ([Path(mirror)] if mirror else [])
    missing = [f for f in MULTI30K_FILES if not any((p / f).is_file() for p in places)]
    if not missing:
        return None
    mirror_text = f"{MULTI30K_MIRROR}={mirror}" if mirror else f"{MULTI30K_MIRROR} is not set"
    return (
        f"error: Multi30k not found: {mirror_text} and {local} lacks {', '.join(missing)}. "
        f"Bring {local.relative_to(data_root.parent)}/ along (any "
        f"training run fills it) or set {MULTI30K_MIRROR} to a directory holding "
        f"{', '.join(MULTI30K_FILES)}."
    )


# ------------------------------------------------------------------------------ the run's events


def tokens_per_s(windows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Training target tokens/s over the log windows, the first (warm-up) one left out when
    there are others."""
    rates = [w["tgt_tokens_per_s"] for w in windows]
    if len(rates) > 1:
        rates = rates[1:]
    if not rates:
        return None
    return {"median": statistics.median(rates), "mean": statistics.mean(rates), "n": len(rates)}


def run_history(events: list[dict[str, Any]], started: float) -> dict[str, Any]:
    """What the check reports of a training run, from its events (:func:`nmt.train.runlog.
    read_events`): validation BLEU over time, the log windows' throughput, epochs, the averaged
    checkpoint. ``wall_s`` is seconds since the training process started (Unix time
    ``started``); ``since_train_start_s`` since the run's ``start`` event."""
    from nmt.train.runlog import of_kind

    def wall(e: dict[str, Any]) -> float:
        return round(e["time"] - started, 2)

    starts = of_kind(events, "start")
    first = starts[0] if starts else None
    train_start = wall(first) if first else None

    def since_start(e: dict[str, Any]) -> float:
        return round(wall(e) - train_start, 2) if train_start is not None else 0.0

    validations = [
        {"step": v["step"], "loss": v["loss"], "ppl": v["ppl"], "bleu": v["bleu"],
         "chrf": v["chrf"], "seconds": v["seconds"], "wall_s": wall(v),
         "since_train_start_s": since_start(v)}
        for v in of_kind(events, "validation")
    ]  # fmt: skip
    trains = of_kind(events, "train")
    windows = [
        {"step": t["step"], "loss": t["loss"], "lr": t["lr"],
         "tgt_tokens_per_s": t["tokens_per_s"], "wall_s": wall(t)}
        for t in trains
    ]  # fmt: skip
    # an epoch's end: the last window logged in it (the events have no epoch-end event)
    epochs = [
        {"epoch": a["epoch"], "step": a["step"], "wall_s": wall(a)}
        for a, b in zip(trains, trains[1:], strict=False)
        if b["epoch"] > a["epoch"]
    ]
    averaged = of_kind(events, "averaged")
    avg = averaged[-1] if averaged else None
    model = {}
    if first:
        model = {"parameters": first.get("parameters"), "device": first.get("device_type")}
    return {
        "model": model,
        "train_pairs": first.get("train_pairs") if first else None,
        "batches_per_epoch": first.get("batches_per_epoch") if first else None,
        "train_start_wall_s": train_start,
        "validation_history": validations,
        "validation_seconds_total": sum(v["seconds"] for v in validations),
        "averaged": {
            "checkpoints": avg["checkpoints"],
            "loss": avg.get("loss"),
            "bleu": avg["bleu"],
            "chrf": avg.get("chrf"),
            "wall_s": wall(avg),
        }
        if avg
        else None,  # fmt: skip
        "log_windows": windows,
        "epochs": epochs,
        "tgt_tokens_per_s": tokens_per_s(windows),
    }


def stream(cmd: Sequence[str], cwd: Path, log_file: Path) -> int:
    """Run ``cmd`` in ``cwd``, echo its output to stderr and copy it into ``log_file``;
    returns the exit status."""
    env = child_environment(PYTHONUNBUFFERED="1")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1, errors="replace",
        )  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(line)
            log.write(line)
        return proc.wait()


# ------------------------------------------------------------------------------ steps


def with_defaults(defaults: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """``defaults`` less those whose key the user's overrides set, then the overrides."""
    keys = override_keys(overrides)
    return [d for d in defaults if d.split("=", 1)[0] not in keys] + list(overrides)


def train_command(s: GpuCheckSettings, run_dir: Path) -> list[str]:
    defaults = [
        f"experiment={s.experiment}",
        f"trainer.device={s.device}",
        f"trainer.max_time={s.train_seconds}",
        "trainer.progress=false",
        f"outputs={run_dir.parent}",
        f"hydra.run.dir={run_dir}",
        f"data.root={s.repo / 'data'}",
    ]
    return [sys.executable, "-m", "nmt.train", *with_defaults(defaults, s.override)]


def run_training(s: GpuCheckSettings, run_dir: Path) -> dict[str, Any]:
    cmd = train_command(s, run_dir)
    say("training: " + " ".join(cmd[1:]))
    started = time.time()
    rc = stream(cmd, s.repo, run_dir.parent / f"{run_dir.name}.console.log")
    if rc != 0:
        raise CheckFailed(f"training failed (exit status {rc}); its log: {run_dir}/train.log")
    from nmt.train.runlog import METRICS_FILE, read_events

    events = read_events(run_dir)
    summary = run_summary(run_dir)
    if not events or summary is None:
        raise CheckFailed(f"training wrote no {run_dir / METRICS_FILE}")
    history = run_history(events, started)
    history["model"] = {"class": model_class(run_dir), **history["model"]}
    return {"run_dir": str(run_dir), "command": cmd[1:], "summary": summary, **history}


def model_class(run_dir: Path) -> str:
    """The class name of the run's model (its config's ``model.arch``)."""
    from nmt.models.registry import MODELS
    from nmt.store.gate import load_run_config

    arch = load_run_config(run_dir).model.arch
    return MODELS[arch].__name__ if arch in MODELS else str(arch)


def measure_peak(device: Any, precision: str, s: GpuCheckSettings) -> dict[str, Any]:
    from benchmarks.machine import PRECISION_DTYPES, matmul_peak

    n = s.matmul_n or (8192 if device.type == "cuda" else 512)
    samples, seconds = (7, 0.2) if device.type == "cuda" else (3, 0.05)
    say(f"matmul peak in {precision} ({n} x {n})")
    return matmul_peak(device, PRECISION_DTYPES[precision], n, samples, seconds)


def run_bench(
    run_dir: Path, device: Any, precision: str, peak_tflops: float, s: GpuCheckSettings
) -> dict[str, Any]:
    """The training steps of the trained run's own config, data and tokenizers, timed."""
    from omegaconf import OmegaConf

    from benchmarks.timing import StepSettings, time_training
    from nmt.data.datasets import prepare_data
    from nmt.data.tokenizer import TokenizerPair
    from nmt.store.checkpoint import load_checkpoint

    payload = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    cfg = OmegaConf.create(payload["config"])
    tokenizers = TokenizerPair.from_state_dict(payload["tokenizers"])
    del payload
    data = prepare_data(cfg.data, tokenizers, multi30k_source())
    steps = StepSettings(device, s.bench_steps, s.bench_warmup)
    say(f"bench: {s.bench_warmup} + {s.bench_steps} training steps in {precision}")
    return time_training(cfg, data, precision, steps, peak_tflops)


def run_eval(run_dir: Path, device: str, repo: Path) -> dict[str, Any]:
    out_dir = run_dir / "eval"
    cmd = [sys.executable, "-m", "nmt.evaluate", f"run={run_dir}", f"device={device}"]
    cmd.append(f"out={out_dir}")
    say("evaluation: " + " ".join(cmd[1:]))
    before = set(out_dir.glob("scores.*.json"))
    rc = stream(cmd, repo, run_dir.parent / f"{run_dir.name}.eval.log")
    if rc != 0:
        raise CheckFailed(f"evaluation failed (exit status {rc})")
    new = sorted(set(out_dir.glob("scores.*.json")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        raise CheckFailed(f"evaluation wrote no scores into {out_dir}")
    return json.loads(new[-1].read_text())


def machine_info(device: Any) -> dict[str, Any]:
    import platform

    import torch

    from nmt.runtime.device import device_name

    info: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            cuda=torch.version.cuda,
            memory_bytes=props.total_memory,
            multiprocessors=props.multi_processor_count,
        )
    return info


# ------------------------------------------------------------------------------ scores and goal


def test_scores(evaluation: dict[str, Any]) -> dict[str, Any]:
    """{set name: {"bleu", "chrf", "sentences"}} from nmt.evaluate's report."""
    out = {}
    for name, s in evaluation.get("sets", {}).items():
        scores = s["scores"]
        out[name] = {
            "bleu": scores["BLEU"]["score"],
            "chrf": scores.get("chrF2", {}).get("score"),
            "bleu_signature": scores["BLEU"]["signature"],
            "sentences": s["sentences"],
        }
    return out


def goal(result: dict[str, Any], target: float) -> dict[str, Any]:
    """Whether the test BLEU reached ``target`` with the training time of this run."""
    tests = result.get("test") or {}
    name = TEST_SET if TEST_SET in tests else next(iter(tests), None)
    bleu = tests[name]["bleu"] if name else None
    train = result.get("training") or {}
    history = train.get("validation_history") or []
    first = next((v for v in history if v["bleu"] >= target), None)
    return {
        "target_bleu": target,
        "test_set": name,
        "test_bleu": bleu,
        "train_seconds": (train.get("summary") or {}).get("train_time"),
        "met": bleu is not None and bleu >= target,
        "first_validation_at_target": first,
    }


# ------------------------------------------------------------------------------ main


def preconditions(s: GpuCheckSettings) -> None:
    problems = import_problems()
    if problems:
        raise CheckFailed(
            "cannot import what nmt needs:\n  " + "\n  ".join(problems) + "\n"
            f"{', '.join(PREINSTALLED)} must be installed on the machine; the others come from "
            "the wheels of `make gpu-wheels` (bash scripts/gpu_check.sh installs them)"
        )
    if uses_multi30k(s.override):
        mirror = multi30k_source().mirror
        problem = corpus_problem(s.repo / "data", str(mirror) if mirror else None)
        if problem:
            raise CheckFailed(problem)


def run_check(s: GpuCheckSettings) -> dict[str, Any]:
    """Every step of the check (module docstring); CheckFailed says which failed and why."""
    start = time.perf_counter()
    phases: dict[str, float] = {}
    preconditions(s)
    import torch

    from nmt.runtime.precision import resolve_precision

    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CheckFailed(f"--device {s.device}: torch.cuda.is_available() is False")
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(device),
        "settings": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(s).items() if k != "repo"
        },
    }

    tic = time.perf_counter()
    peaks = {"bf16": measure_peak(device, "bf16", s)}
    phases["peak"] = time.perf_counter() - tic

    run_dir = s.out.parent / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    tic = time.perf_counter()
    train = run_training(s, run_dir)
    phases["training"] = time.perf_counter() - tic
    result["training"] = train

    from omegaconf import OmegaConf

    # the precision the run trained in (summary.json), else its config's resolved here
    precision = train["summary"].get("hardware", {}).get("precision") or resolve_precision(
        str(OmegaConf.load(run_dir / "config.yaml").trainer.precision), device
    )
    if precision not in peaks:
        peaks[precision] = measure_peak(device, precision, s)
    peak = peaks[precision]
    result.update(precision=precision, peak=peak, peaks=peaks)

    if s.bench_steps > 0:
        tic = time.perf_counter()
        bench_result = run_bench(run_dir, device, precision, peak["tflops"], s)
        phases["bench"] = time.perf_counter() - tic
        result["bench"] = bench_result
        tps = train["tgt_tokens_per_s"]
        if tps:
            flops = bench_result["train_flops_per_tgt_token"] * tps["median"]
            result["train_achieved_tflops"] = flops / 1e12
            result["train_mfu"] = flops / 1e12 / peak["tflops"]
    if not s.no_eval:
        tic = time.perf_counter()
        result["evaluation"] = run_eval(run_dir, s.device, s.repo)
        result["test"] = test_scores(result["evaluation"])
        phases["evaluation"] = time.perf_counter() - tic
    result["goal"] = goal(result, s.goal_bleu)
    result["phase_seconds"] = phases
    result["seconds"] = time.perf_counter() - start
    return result
