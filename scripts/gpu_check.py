"""GPU check: the default Transformer trained on Multi30k for 3 minutes in bf16, measured.

One run (under 8 minutes on an H200) that

1. measures the device's matrix-product peak in the training precision (``bench.matmul_peak``);
2. trains ``experiment=gpu_quick`` (``python -m nmt.train``) for ``--train-seconds`` of
   training time, following its log to record validation BLEU against wall-clock time and the
   training throughput (target tokens/s);
3. times real training steps of the trained configuration (``bench.bench_training``): target
   tokens/s, achieved TFLOP/s and model FLOPs utilisation against the measured peak;
4. scores the run as it is meant to be decoded (beam 5; the averaged weights if they beat the
   best checkpoint on validation) on the test split
   (``python -m nmt.evaluate``);
5. prints a summary and writes one JSON (``--out``).

On the GPU machine run it through ``bash scripts/gpu_check.sh``, which first installs the
Python packages the machine lacks from the wheels of ``make gpu-wheels``. Elsewhere::

    python scripts/gpu_check.py --device cpu --train-seconds 10 --override model.d_model=64 ...

Helper commands (standard library only, used by gpu_check.sh and ``make gpu-wheels``)::

    python scripts/gpu_check.py missing-wheels DIR        # wheels to install, one per line
    python scripts/gpu_check.py unpack-wheels SITE WHEEL...  # install without pip
    python scripts/gpu_check.py fetch-wheels --dest DIR   # download them (needs network)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "nmt-gpu-check/1"
DEFAULT_WHEELS = REPO / "scripts" / "gpu_wheels"
DEFAULT_OUT = REPO / "outputs" / "gpu_check" / "gpu_check.json"
MIRROR_ENV = "NMT_MULTI30K_MIRROR"
MULTI30K_FILES = tuple(
    f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")
)
TEST_SET = "test_2016_flickr"

# Packages that nmt imports and a fresh GPU machine may lack: import name -> distribution.
# They travel as wheels (make gpu-wheels). PyTorch, numpy, sentencepiece, sacrebleu and
# tensorboard must already be installed there.
WHEEL_PACKAGES = {
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "antlr4": "antlr4-python3-runtime",
    "yaml": "PyYAML",
    "tqdm": "tqdm",
    "matplotlib": "matplotlib",
    "contourpy": "contourpy",
    "cycler": "cycler",
    "fontTools": "fonttools",
    "kiwisolver": "kiwisolver",
    "PIL": "pillow",
    "pyparsing": "pyparsing",
    "dateutil": "python-dateutil",
    "tzdata": "tzdata",
    "packaging": "packaging",
}
SOURCE_ONLY = {"antlr4-python3-runtime"}  # no wheel on the index: built from its sdist
PREINSTALLED = ("torch", "numpy", "sentencepiece", "sacrebleu", "tensorboard")
RUNTIME_IMPORTS = (*PREINSTALLED, "hydra", "omegaconf", "yaml", "tqdm", "matplotlib.figure")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


class CheckFailed(RuntimeError):
    """A step of the check failed; the message says which and why."""


def say(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ wheels


def normalize(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 503, underscores, lower case)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def wheels_needed(
    wheel_dir: Path, present: Callable[[str], bool] | None = None
) -> tuple[list[Path], list[str]]:
    """Wheels in ``wheel_dir`` for the packages this Python lacks, and the lacking ones
    that have no wheel there."""
    present = present or (lambda module: importlib.util.find_spec(module) is not None)
    wanted = [dist for module, dist in WHEEL_PACKAGES.items() if not present(module)]
    files = sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
    by_dist = {normalize(f.name.split("-", 1)[0]): f for f in files}
    found = [by_dist[normalize(d)] for d in wanted if normalize(d) in by_dist]
    absent = [d for d in wanted if normalize(d) not in by_dist]
    return found, absent


def wrong_python(wheels: Sequence[Path], version: tuple[int, int] | None = None) -> list[Path]:
    """The wheels built for another CPython than this one (``cp312`` on Python 3.11)."""
    major, minor = version or sys.version_info[:2]
    ours = f"cp{major}{minor}"
    bad = []
    for wheel in wheels:
        tags = wheel.name[: -len(".whl")].split("-")[-3].split(".")
        if not any(t.startswith("py") or t == ours for t in tags):
            bad.append(wheel)
    return bad


def missing_wheels_message(wheel_dir: Path, absent: Sequence[str]) -> str:
    where = f"{wheel_dir} has no wheel for them" if wheel_dir.is_dir() else f"{wheel_dir} is absent"
    return (
        f"error: this Python ({sys.executable}, {sys.version.split()[0]}) lacks "
        f"{', '.join(absent)}, and {where}. Run `make gpu-wheels` on a machine with network "
        f"access and bring {DEFAULT_WHEELS.relative_to(REPO)}/ along with the repository, or "
        "set NMT_GPU_WHEELS to a folder holding those wheels."
    )


def cmd_missing_wheels(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py missing-wheels")
    p.add_argument("wheel_dir", type=Path)
    args = p.parse_args(argv)
    found, absent = wheels_needed(args.wheel_dir)
    if absent:
        print(missing_wheels_message(args.wheel_dir, absent), file=sys.stderr)
        return 3
    bad = wrong_python(found)
    if bad:
        print(
            f"error: {', '.join(w.name for w in bad)} in {args.wheel_dir} are not for this "
            f"Python ({sys.executable}, {sys.version.split()[0]}): run `make gpu-wheels "
            f"GPU_PYTHON_VERSION={sys.version_info[0]}.{sys.version_info[1]}` for it",
            file=sys.stderr,
        )
        return 3
    for path in found:
        print(path)
    return 0


def unpack_wheel(wheel: Path, site: Path) -> None:
    """Install a wheel by extracting it into ``site`` (what pip does for a --target install,
    without scripts, headers and data files)."""
    root = site.resolve()
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            target = root.joinpath(*parts).resolve()
            if root not in target.parents:
                raise CheckFailed(f"{wheel.name}: entry {info.filename!r} leaves the target")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode | 0o600)


def cmd_unpack_wheels(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py unpack-wheels")
    p.add_argument("site", type=Path)
    p.add_argument("wheels", nargs="+", type=Path)
    args = p.parse_args(argv)
    args.site.mkdir(parents=True, exist_ok=True)
    for wheel in args.wheels:
        unpack_wheel(wheel, args.site)
    return 0


def installed_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        raise CheckFailed(
            f"{dist} is not installed in this Python ({sys.executable}): run `make install` first"
        ) from None


def fetch_wheels(dest: Path, python_version: str) -> list[Path]:
    """Download (or build) the wheels, pinned to the versions installed here."""
    pins = {dist: installed_version(dist) for dist in WHEEL_PACKAGES.values()}
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    pip = [sys.executable, "-m", "pip"]
    binary = [f"{d}=={v}" for d, v in pins.items() if d not in SOURCE_ONLY]
    platforms = [arg for plat in PLATFORMS for arg in ("--platform", plat)]
    subprocess.run(
        [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
         "--implementation", "cp", *platforms, "-d", str(dest), *binary],
        check=True,
    )  # fmt: skip
    for dist in SOURCE_ONLY:
        subprocess.run(
            [*pip, "wheel", "--no-deps", f"{dist}=={pins[dist]}", "-w", str(dest)], check=True
        )
    wheels = sorted(dest.glob("*.whl"))
    _, absent = wheels_needed(dest, present=lambda _module: False)
    if absent:
        raise CheckFailed(f"no wheel came for: {', '.join(absent)}")
    return wheels


def cmd_fetch_wheels(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py fetch-wheels")
    p.add_argument("--dest", type=Path, default=DEFAULT_WHEELS)
    p.add_argument("--python-version", default="3.12", help="of the GPU machine (default 3.12)")
    args = p.parse_args(argv)
    wheels = fetch_wheels(args.dest, args.python_version)
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.dest}")
    return 0


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
    mirror_text = f"{MIRROR_ENV}={mirror}" if mirror else f"{MIRROR_ENV} is not set"
    return (
        f"error: Multi30k not found: {mirror_text} and {local} lacks {', '.join(missing)}. "
        f"Bring {local.relative_to(REPO) if local.is_relative_to(REPO) else local}/ along (any "
        f"training run fills it) or set {MIRROR_ENV} to a directory holding "
        f"{', '.join(MULTI30K_FILES)}."
    )


# ------------------------------------------------------------------------------ the run's log

_VAL = re.compile(
    r"validation at step (\d+): loss ([\d.]+|nan|inf) ppl ([\d.]+|nan|inf) BLEU ([\d.]+) "
    r"chrF ([\d.]+) \(([\d.]+)s\)"
)
_STEP = re.compile(r"step (\d+): loss ([\d.]+|nan|inf), lr (\S+), (\d+) target tokens/s")
_AVG = re.compile(r"averaged (.+?): validation loss ([\d.]+) BLEU ([\d.]+) chrF ([\d.]+)")
_START = re.compile(r"training data: (\d+) pairs, (\d+) batches per epoch")
_PARAMS = re.compile(r"model (\w+): ([\d,]+) parameters on (\S+)")
_EPOCH = re.compile(r"epoch (\d+) done at step (\d+)")


class LogFollower:
    """Reads the training log line by line as it is written, with the wall time of each line
    (seconds since the process started)."""

    def __init__(self) -> None:
        self.train_start: float | None = None  # wall seconds when training began
        self.validations: list[dict[str, float]] = []
        self.windows: list[dict[str, float]] = []  # one per log line: tokens/s of the window
        self.epochs: list[dict[str, float]] = []
        self.averaged: dict[str, Any] | None = None
        self.model: dict[str, Any] = {}
        self.train_pairs = 0
        self.batches_per_epoch = 0

    def _since_start(self, wall: float) -> float:
        return round(wall - self.train_start, 2) if self.train_start is not None else 0.0

    def feed(self, line: str, wall: float) -> None:
        if m := _VAL.search(line):
            self.validations.append({
                "step": int(m[1]), "loss": float(m[2]), "ppl": float(m[3]),
                "bleu": float(m[4]), "chrf": float(m[5]), "seconds": float(m[6]),
                "wall_s": round(wall, 2), "since_train_start_s": self._since_start(wall),
            })  # fmt: skip
        elif m := _AVG.search(line):
            self.averaged = {
                "checkpoints": m[1].split(", "), "loss": float(m[2]), "bleu": float(m[3]),
                "chrf": float(m[4]), "wall_s": round(wall, 2),
            }  # fmt: skip
        elif m := _STEP.search(line):
            self.windows.append({
                "step": int(m[1]), "loss": float(m[2]), "lr": float(m[3]),
                "tgt_tokens_per_s": float(m[4]), "wall_s": round(wall, 2),
            })  # fmt: skip
        elif m := _START.search(line):
            self.train_start = wall
            self.train_pairs, self.batches_per_epoch = int(m[1]), int(m[2])
        elif m := _PARAMS.search(line):
            self.model = {"class": m[1], "parameters": int(m[2].replace(",", "")), "device": m[3]}
        elif m := _EPOCH.search(line):
            self.epochs.append({"epoch": int(m[1]), "step": int(m[2]), "wall_s": round(wall, 2)})

    def tokens_per_s(self) -> dict[str, float] | None:
        """Training target tokens/s over the log windows, the first (warm-up) one left out
        when there are others."""
        rates = [w["tgt_tokens_per_s"] for w in self.windows]
        if len(rates) > 1:
            rates = rates[1:]
        if not rates:
            return None
        return {"median": statistics.median(rates), "mean": statistics.mean(rates), "n": len(rates)}


def stream(cmd: Sequence[str], on_line: Callable[[str, float], None], log_file: Path) -> int:
    """Run ``cmd`` in the repository, echo its output to stderr, copy it into ``log_file``, and
    hand each line with its wall time to ``on_line``; returns the exit status."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_file, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            list(cmd), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1, errors="replace",
        )  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            wall = time.perf_counter() - start
            sys.stderr.write(line)
            log.write(line)
            on_line(line, wall)
        return proc.wait()


# ------------------------------------------------------------------------------ steps


def with_defaults(defaults: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """``defaults`` less those whose key the user's overrides set, then the overrides."""
    keys = override_keys(overrides)
    return [d for d in defaults if d.split("=", 1)[0] not in keys] + list(overrides)


def train_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    defaults = [
        f"experiment={args.experiment}",
        f"trainer.device={args.device}",
        f"trainer.max_time={args.train_seconds}",
        "trainer.progress=false",
        f"outputs={run_dir.parent}",
        f"hydra.run.dir={run_dir}",
        f"data.root={REPO / 'data'}",
    ]
    return [sys.executable, "-m", "nmt.train", *with_defaults(defaults, args.override)]


def run_training(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    cmd = train_command(args, run_dir)
    say("training: " + " ".join(cmd[1:]))
    follower = LogFollower()
    rc = stream(cmd, follower.feed, run_dir.parent / f"{run_dir.name}.console.log")
    if rc != 0:
        raise CheckFailed(f"training failed (exit status {rc}); its log: {run_dir}/train.log")
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        raise CheckFailed(f"training wrote no {summary_file}")
    summary = json.loads(summary_file.read_text())
    history = follower.validations
    return {
        "run_dir": str(run_dir),
        "command": cmd[1:],
        "model": follower.model,
        "train_pairs": follower.train_pairs,
        "batches_per_epoch": follower.batches_per_epoch,
        "train_start_wall_s": follower.train_start,
        "summary": summary,
        "validation_history": history,
        "validation_seconds_total": sum(v["seconds"] for v in history),
        "averaged": follower.averaged,
        "log_windows": follower.windows,
        "epochs": follower.epochs,
        "tgt_tokens_per_s": follower.tokens_per_s(),
    }


def dtype_of(precision: str) -> Any:
    import torch

    return {"32": torch.float32, "bf16": torch.bfloat16, "16": torch.float16}[precision]


def measure_peak(device: Any, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    import bench

    n = args.matmul_n or (8192 if device.type == "cuda" else 512)
    samples, seconds = (7, 0.2) if device.type == "cuda" else (3, 0.05)
    say(f"matmul peak in {precision} ({n} x {n})")
    return bench.matmul_peak(device, dtype_of(precision), n, samples, seconds)


def run_bench(
    run_dir: Path, device: Any, precision: str, peak_tflops: float, args: argparse.Namespace
) -> dict[str, Any]:
    """bench.bench_training on the trained run's own config, data and tokenizers."""
    import bench
    from omegaconf import OmegaConf

    from nmt.checkpoint import load_checkpoint
    from nmt.data.prepare import prepare_data
    from nmt.data.tokenizer import TokenizerPair

    payload = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    cfg = OmegaConf.create(payload["config"])
    tokenizers = TokenizerPair.from_state_dict(payload["tokenizers"])
    del payload
    data = prepare_data(cfg.data, tokenizers)
    s = bench.settings_from_args(
        bench.parse_args([
            "--device", str(device), "--steps", str(args.bench_steps),
            "--warmup", str(args.bench_warmup), "--out", os.devnull,
        ])
    )  # fmt: skip
    say(f"bench: {args.bench_warmup} + {args.bench_steps} training steps in {precision}")
    return bench.bench_training(cfg, data, precision, s, peak_tflops)


def run_eval(run_dir: Path, device: str) -> dict[str, Any]:
    out_dir = run_dir / "eval"
    cmd = [sys.executable, "-m", "nmt.evaluate", f"run={run_dir}", f"device={device}"]
    cmd.append(f"out={out_dir}")
    say("evaluation: " + " ".join(cmd[1:]))
    before = set(out_dir.glob("scores.*.json"))
    rc = stream(cmd, lambda _line, _wall: None, run_dir.parent / f"{run_dir.name}.eval.log")
    if rc != 0:
        raise CheckFailed(f"evaluation failed (exit status {rc})")
    new = sorted(set(out_dir.glob("scores.*.json")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        raise CheckFailed(f"evaluation wrote no scores into {out_dir}")
    return json.loads(new[-1].read_text())


def machine_info(device: Any) -> dict[str, Any]:
    import platform

    import torch

    from nmt.runtime import device_name

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


# ------------------------------------------------------------------------------ report


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


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    head = " | ".join(c.rjust(w) for c, w in zip(header, widths, strict=True))
    return "\n".join([head, "-+-".join("-" * w for w in widths), *lines])


def _fmt(x: float | None, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def report(result: dict[str, Any]) -> str:
    m, train = result["machine"], result["training"]
    summary = train["summary"]
    peak = result["peak"]
    lines = [
        f"device: {m['device_name']} ({m['device']}), torch {m['torch']}, python {m['python']}",
        f"matmul peak ({result['precision']}, measured): {peak['tflops']:.1f} TFLOP/s",
        "",
        f"training: {train['model'].get('parameters', 0):,} parameters, "
        f"{summary['step']} updates, {summary['epoch']} epochs, "
        f"{summary['train_time']:.0f} s of training; {summary['stop_reason']}",
        "validation BLEU over time (greedy, validation split; wall s since training began):",
    ]
    rows = [
        [f"{v['since_train_start_s']:.0f}", str(v["step"]), f"{v['bleu']:.2f}",
         f"{v['chrf']:.2f}", f"{v['loss']:.3f}"]
        for v in train["validation_history"]
    ]  # fmt: skip
    lines.append(_table(["wall s", "step", "BLEU", "chrF", "loss"], rows))
    if train["averaged"]:
        avg = train["averaged"]
        lines.append(f"averaged {len(avg['checkpoints'])} checkpoints: validation BLEU "
                     f"{avg['bleu']:.2f}")  # fmt: skip
    tps = train["tgt_tokens_per_s"]
    lines += ["", "throughput (target tokens/s):"]
    rows = []
    if tps:
        mfu = result.get("train_mfu")
        achieved = result.get("train_achieved_tflops")
        rows.append(["training (log)", f"{tps['median']:.0f}", _fmt(achieved, ".3g"),
                     _fmt(mfu, ".1%")])  # fmt: skip
    b = result.get("bench")
    if b:
        rows.append([f"bench ({b['steps']} steps)", f"{b['tgt_tokens_per_s']:.0f}",
                     f"{b['achieved_tflops']:.3g}", f"{b['mfu']:.1%}"])  # fmt: skip
    lines.append(_table(["", "tgt tok/s", "TFLOP/s", "MFU"], rows))
    lines.append("")
    for name, t in (result.get("test") or {}).items():
        ev = result["evaluation"]
        opts = ev.get("options", {})
        lines.append(
            f"test {name}: BLEU {t['bleu']:.2f}, chrF {_fmt(t['chrf'], '.2f')} "
            f"({Path(ev['checkpoint']).name}, beam {opts.get('beam')}, {t['sentences']} sentences)"
        )
    g = result["goal"]
    first = g["first_validation_at_target"]
    if first:
        lines.append(
            f"validation BLEU first reached {g['target_bleu']:g} at step {first['step']}, "
            f"{first['since_train_start_s']:.0f} s after training began"
        )
    verdict = "MET" if g["met"] else "NOT MET"
    lines.append(
        f"goal: {g['target_bleu']:g} BLEU on {g['test_set']} in {_fmt(g['train_seconds'], '.0f')} s"
        f" of training: {verdict} ({_fmt(g['test_bleu'], '.2f')})"
    )
    phases = ", ".join(f"{k} {v:.0f} s" for k, v in result["phase_seconds"].items())
    lines.append(f"time: {phases}; total {result['seconds']:.0f} s")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default cuda)")
    p.add_argument("--train-seconds", type=float, default=180, help="training time (default 180)")
    p.add_argument("--experiment", default="gpu_quick", help="training preset (default gpu_quick)")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra override for the training run (repeatable)",
    )
    p.add_argument("--matmul-n", type=int, default=0, help="matmul size (default 8192; CPU 512)")
    p.add_argument("--bench-steps", type=int, default=20, help="timed bench steps (0 = no bench)")
    p.add_argument("--bench-warmup", type=int, default=5, help="untimed bench steps first")
    p.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation")
    p.add_argument("--goal-bleu", type=float, default=40.0, help="target test BLEU (default 40)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON (default {DEFAULT_OUT})")
    return p.parse_args(argv)


def preconditions(args: argparse.Namespace) -> None:
    problems = import_problems()
    if problems:
        raise CheckFailed(
            "cannot import what nmt needs:\n  " + "\n  ".join(problems) + "\n"
            f"{', '.join(PREINSTALLED)} must be installed on the machine; the others come from "
            "the wheels of `make gpu-wheels` (bash scripts/gpu_check.sh installs them)"
        )
    if uses_multi30k(args.override):
        problem = corpus_problem(REPO / "data", os.environ.get(MIRROR_ENV, "").strip() or None)
        if problem:
            raise CheckFailed(problem)


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    phases: dict[str, float] = {}
    preconditions(args)
    import torch

    from nmt.precision import resolve_precision

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CheckFailed(f"--device {args.device}: torch.cuda.is_available() is False")
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(device),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }

    tic = time.perf_counter()
    peaks = {"bf16": measure_peak(device, "bf16", args)}
    phases["peak"] = time.perf_counter() - tic

    run_dir = args.out.parent / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    tic = time.perf_counter()
    train = run_training(args, run_dir)
    phases["training"] = time.perf_counter() - tic
    result["training"] = train

    from omegaconf import OmegaConf

    # the precision the run trained in (summary.json), else its config's resolved here
    precision = train["summary"].get("hardware", {}).get("precision") or resolve_precision(
        str(OmegaConf.load(run_dir / "config.yaml").trainer.precision), device
    )
    if precision not in peaks:
        peaks[precision] = measure_peak(device, precision, args)
    peak = peaks[precision]
    result.update(precision=precision, peak=peak, peaks=peaks)

    if args.bench_steps > 0:
        tic = time.perf_counter()
        bench_result = run_bench(run_dir, device, precision, peak["tflops"], args)
        phases["bench"] = time.perf_counter() - tic
        result["bench"] = bench_result
        tps = train["tgt_tokens_per_s"]
        if tps:
            flops = bench_result["train_flops_per_tgt_token"] * tps["median"]
            result["train_achieved_tflops"] = flops / 1e12
            result["train_mfu"] = flops / 1e12 / peak["tflops"]
    if not args.no_eval:
        tic = time.perf_counter()
        result["evaluation"] = run_eval(run_dir, args.device)
        result["test"] = test_scores(result["evaluation"])
        phases["evaluation"] = time.perf_counter() - tic
    result["goal"] = goal(result, args.goal_bleu)
    result["phase_seconds"] = phases
    result["seconds"] = time.perf_counter() - start
    return result


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "missing-wheels": cmd_missing_wheels,
    "unpack-wheels": cmd_unpack_wheels,
    "fetch-wheels": cmd_fetch_wheels,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        args = parse_args(argv)
        args.out = args.out.resolve()
        for path in (REPO, REPO / "scripts"):  # nmt and bench, however this file was loaded
            if str(path) not in sys.path:
                sys.path.insert(1, str(path))
        result = run_check(args)
    except CheckFailed as e:
        msg = str(e)
        print(msg if msg.startswith("error:") else f"error: {msg}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
