"""GPU check: every training path of nmt on one machine in one run, and a table of what passed.

First it prints the PyTorch version against nmt's floor and the GPU's compute capability
(:mod:`benchmarks.gpu_check_env`); a PyTorch below the floor stops it there. Then each part
(:data:`benchmarks.gpu_check_parts.PARTS`) runs as subprocesses of the real command lines
(``python -m nmt.train``, ``torch.distributed.run -m nmt.train``, ``nmt.ship.export``,
``nmt.evaluate``) with the project's Hydra overrides:

* both models (Transformer, GRU+Bahdanau) trained shortly in bf16 (compute capability 8.0 and
  later), fp16 with the loss scaler and fp32 (TF32 where the GPU has it): target tokens/s and
  whether the loss decreased, and the dtype the GRU encoder's cuDNN kernel computes in;
* a run SIGKILLed after its first checkpoint and resumed with ``trainer.resume=auto``: it
  must go on from that checkpoint's step, and is compared with the same run uninterrupted;
* a trained Transformer exported for CTranslate2 and decoded on the device with
  ``engine=ctranslate2`` and ``engine=torch``: the share of identical translations;
* ``trainer.compile=true`` for a few updates;
* two-process DDP under torchrun (NCCL over two GPUs; one GPU: both ranks on it over gloo,
  reported as a fallback, as NCCL is not run);
* on request (``--parts quality``), the 3-minute ``experiment=gpu_quick`` run with validation
  BLEU over time, a timed bench (MFU) and the test BLEU (:mod:`benchmarks.gpu_check_quality`).

Each part has its own time budget, and the check a total one (``--budget``): a part that
overruns is stopped and reported failed, one with no time left is skipped; a failing part
does not stop the others. The result is one JSON (``--out``) and a printed table
(:mod:`benchmarks.gpu_check_report`).

On the GPU machine run it through ``bash scripts/gpu_check.sh``, which first installs the
Python packages the machine lacks from the wheels of ``make gpu-wheels``
(:mod:`benchmarks.gpu_wheels`); ``scripts/gpu_check.py`` is the command line. The check's
modules import only the standard library at load time: nothing of nmt or torch before the first
step.
"""

from __future__ import annotations

import importlib
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "nmt-gpu-check/2"
OUT = Path("outputs") / "gpu_check" / "gpu_check.json"  # in the repository: the default JSON
MULTI30K_FILES = tuple(
    f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")
)
BUDGET_SECONDS = 480.0  # the whole check, by default
MIN_PART_SECONDS = 10.0  # a part is skipped when less than this is left of the budget

# Packages nmt imports that must be on the GPU machine already; the others come as
# wheels (benchmarks.gpu_wheels).
PREINSTALLED = ("torch", "numpy", "sentencepiece", "sacrebleu", "tensorboard")
RUNTIME_IMPORTS = (
    *PREINSTALLED, "hydra", "omegaconf", "yaml", "tqdm", "matplotlib.figure", "sacremoses",
)  # fmt: skip


class CheckFailed(RuntimeError):
    """A step of the check failed; the message says which and why."""


class PartSkipped(Exception):
    """A part that cannot run here (the message says why): reported as skipped."""


@dataclass
class GpuCheckSettings:
    """What the check runs (the options of ``scripts/gpu_check.py``, same names)."""

    repo: Path  # the repository: training runs there, data/ holds Multi30k
    out: Path  # the JSON
    work: Path | None = None  # the runs' folder (default: beside the JSON, check-<time>)
    device: str = "cuda"
    parts: str = ""  # comma-separated parts or groups; "" = the default parts
    quick: bool = False  # tiny models and a few updates per run (the CPU tests)
    budget: float = BUDGET_SECONDS  # seconds for the whole check
    run_seconds: float = 20  # training time of each short run
    override: list[str] = field(default_factory=list)  # Hydra overrides for every run
    # the quality part (--parts quality)
    train_seconds: float = 180
    experiment: str = "gpu_quick"
    matmul_n: int = 0  # 0: 8192 on a GPU, 512 on the CPU
    bench_steps: int = 20  # timed training steps (0 = no bench)
    bench_warmup: int = 5
    no_eval: bool = False
    goal_bleu: float = 40.0


@dataclass
class Context:
    """What a part runs with: the settings, its folder, the environment step's findings, its
    deadline (``time.monotonic()``), and what earlier parts left for later ones (run folders
    by part name, figures by part name)."""

    s: GpuCheckSettings
    work: Path
    env: dict[str, Any]
    deadline: float = math.inf
    runs: dict[str, Path] = field(default_factory=dict)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.env["device_type"] == "cuda"

    @property
    def native_bf16(self) -> bool:
        """bf16 and TF32 in hardware (compute capability 8.0 and later)."""
        return bool(self.env.get("native_bf16"))

    def left(self) -> float:
        """Seconds until the part's deadline."""
        return self.deadline - time.monotonic()


@dataclass
class Outcome:
    """What a part that ran reports: one line of figures for the table, all figures for the
    JSON, a note for the reader, and whether it ran a fallback instead of the path itself."""

    summary: str
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    fallback: bool = False


@dataclass(frozen=True)
class Part:
    """One row of the check: its name, what it does, the function that runs it, its time
    budget in seconds (from the settings), whether it runs by default, and its groups."""

    name: str
    what: str
    run: Callable[[Context], Outcome]
    budget: Callable[[GpuCheckSettings], float]
    default: bool = True
    groups: tuple[str, ...] = ()


def say(msg: str) -> None:
    """Progress on stderr."""
    from benchmarks.report import say as report_say

    report_say("gpu-check", msg)


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


def with_defaults(defaults: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """``defaults`` less those whose key the overrides set, then the overrides."""
    keys = override_keys(overrides)
    return [d for d in defaults if d.split("=", 1)[0].lstrip("+~") not in keys] + list(overrides)


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
    from nmt.environment import MULTI30K_MIRROR

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


def preconditions(s: GpuCheckSettings) -> None:
    """CheckFailed when a package nmt needs does not import or Multi30k is not there."""
    problems = import_problems()
    if problems:
        raise CheckFailed(
            "cannot import what nmt needs:\n  " + "\n  ".join(problems) + "\n"
            f"{', '.join(PREINSTALLED)} must be installed on the machine; the others come from "
            "the wheels of `make gpu-wheels` (bash scripts/gpu_check.sh installs them)"
        )
    if uses_multi30k(s.override):
        from nmt.environment import multi30k_source

        mirror = multi30k_source().mirror
        problem = corpus_problem(s.repo / "data", str(mirror) if mirror else None)
        if problem:
            raise CheckFailed(problem)


# ------------------------------------------------------------------------------ the parts


def select_parts(parts: Sequence[Part], spec: str) -> list[Part]:
    """The parts ``spec`` names, in the table's order: comma-separated part names or group
    names (``all``: every part); "" = the default parts. CheckFailed names the choices for
    a name that is neither."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        return [p for p in parts if p.default]
    known = {p.name for p in parts} | {g for p in parts for g in p.groups} | {"all"}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CheckFailed(
            f"--parts: no part or group {', '.join(unknown)}; the parts: "
            f"{', '.join(p.name for p in parts)}; the groups: "
            f"{', '.join(sorted(known - {p.name for p in parts}))}"
        )
    wanted = set(names)
    return [p for p in parts if "all" in wanted or p.name in wanted or wanted & set(p.groups)]


def row(name: str, status: str, seconds: float, **fields: Any) -> dict[str, Any]:
    """One part's entry of the result."""
    return {"part": name, "status": status, "seconds": round(seconds, 1), "summary": "",
            "note": "", "figures": {}, **fields}  # fmt: skip


def run_part(part: Part, ctx: Context, end: float) -> dict[str, Any]:
    """Run one part until its deadline (its budget, or what is left of the check's): passed,
    fallback, skipped (PartSkipped, or no time left) or failed (anything raised)."""
    start = time.monotonic()
    if end - start < MIN_PART_SECONDS:
        return row(part.name, "skipped", 0.0, note="no time left in the check's budget")
    ctx.deadline = start + min(part.budget(ctx.s), end - start)
    say(f"{part.name}: {part.what} (budget {ctx.deadline - start:.0f} s)")
    try:
        outcome = part.run(ctx)
    except PartSkipped as e:
        return row(part.name, "skipped", time.monotonic() - start, note=str(e))
    except Exception as e:  # any failure is the part's finding; the next part runs
        note = str(e) or type(e).__name__
        return row(part.name, "failed", time.monotonic() - start, note=note,
                   error=traceback.format_exc())  # fmt: skip
    ctx.figures[part.name] = outcome.figures
    status = "fallback" if outcome.fallback else "passed"
    return row(part.name, status, time.monotonic() - start, summary=outcome.summary,
               note=outcome.note, figures=outcome.figures)  # fmt: skip


def run_parts(parts: Sequence[Part], ctx: Context, budget: float) -> list[dict[str, Any]]:
    """Every part in turn within ``budget`` seconds in all; each part's entry."""
    end = time.monotonic() + budget
    results = []
    for part in parts:
        entry = run_part(part, ctx, end)
        say(f"{part.name}: {entry['status']} ({entry['seconds']:.0f} s) {entry['note']}".rstrip())
        results.append(entry)
    return results


# ------------------------------------------------------------------------------ main


def run_check(
    s: GpuCheckSettings, announce: Callable[[str], None] = print, parts: Sequence[Part] = ()
) -> dict[str, Any]:
    """The environment step (its lines go to ``announce`` at once), then the selected parts
    (of ``parts``, default :data:`benchmarks.gpu_check_parts.PARTS`). CheckFailed before
    any part runs: a package or Multi30k missing, or an unknown part."""
    from benchmarks.gpu_check_env import describe, environment

    start = time.monotonic()
    if not parts:
        from benchmarks.gpu_check_parts import PARTS

        parts = PARTS
    selected = select_parts(parts, s.parts)
    env = environment(s.device, s.repo)
    for line in describe(env):
        announce(line)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": env,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(s).items()},
    }
    if env["problems"]:
        result["parts"] = [row(p.name, "skipped", 0.0, note=env["problems"][0]) for p in selected]
    else:
        preconditions(s)
        work = s.work or s.out.parent / f"check-{time.strftime('%Y%m%d-%H%M%S')}"
        ctx = Context(s, work.resolve(), env)
        result["work"] = str(ctx.work)
        result["parts"] = run_parts(selected, ctx, s.budget - (time.monotonic() - start))
    result["passed"] = not env["problems"] and all(
        p["status"] in ("passed", "fallback", "skipped") for p in result["parts"]
    )
    result["seconds"] = time.monotonic() - start
    return result
