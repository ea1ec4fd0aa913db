"""nmt itself as a toolkit of ``make bench-peers``: timed the way the peers are, as a
training process of its own whose log windows are read (:mod:`benchmarks.peers_common`).

``nmt-train`` runs beside the python it is given (the project's venv) on its own Multi30k
preparation (its sentencepiece model and the same corpus lines as the workspace's text
files), with no validation before the last update. Its windows come from the run's
``metrics.jsonl`` ``train`` events: updates, seconds of training and non-padding target
tokens (EOS included) per window, as every peer counts them.

``data.max_tokens`` bounds a batch's padded source or target tokens, whichever is longer;
batches are length-bucketed, so a budget holds :data:`BUDGET_PER_TARGET` times the target
tokens a batch trains on, averaged over an epoch of Multi30k de-en.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.peers_common import (
    CT2,
    NATIVE,
    Command,
    Decoding,
    RecipeJob,
    TrainJob,
    Window,
    Workspace,
    command,
)

NAME = "nmt"
VERSION = "this checkout"
REQUIREMENTS: tuple[tuple[str, ...], ...] = ()  # the project's own venv
PROBE = "import json, torch, nmt; print(json.dumps({'torch': torch.__version__}))"
# auto: the precision nmt-train picks by its own probe (the run's start event names it)
PRECISIONS = {"transformer": ("32", "bf16", "auto"), "gru": ("32", "bf16", "auto")}
MODELS = {"transformer": "transformer", "gru": "gru_bahdanau"}
BUDGET_PER_TARGET = 1.212  # data.max_tokens 4,242: 3,501 target tokens per update, one epoch
DIFFERENCES: dict[str, list[str]] = {"transformer": [], "gru": []}


def nmt_train(
    python: Path, work: Path, threads: int, seed: int, ws: Workspace, settings: list[str]
) -> Command:
    """``nmt-train`` (beside ``python``) on the CPU with ``settings``, its run in
    ``work/run``, whose ``metrics.jsonl`` holds the windows."""
    work.mkdir(parents=True, exist_ok=True)
    argv = [
        str(python.parent / "nmt-train"),
        *settings,
        f"data.root={ws.data_root}",
        "trainer.device=cpu",
        f"trainer.threads={threads}",
        f"trainer.seed={seed}",
        "trainer.progress=false",
        f"hydra.run.dir={work / 'run'}",
    ]
    return command(argv, work, "train.log", threads, windows_from=work / "run" / "metrics.jsonl")


def overrides(job: TrainJob) -> list[str]:
    """``nmt-train`` overrides for ``job``: its model, batch, updates and logging, nothing
    decoded before the last update and no attention pictures."""
    return [
        f"model={MODELS[job.model]}",
        f"data.max_tokens={round(job.tgt_tokens_per_step * BUDGET_PER_TARGET)}",
        f"trainer.precision={job.precision}",
        f"trainer.max_steps={job.steps}",
        f"trainer.log_every={job.log_every}",
        f"trainer.val_every={job.steps + 10**6}",
        "trainer.val_sentences=8",
        "trainer.attention_sentences=0",
    ]


def train_command(python: Path, job: TrainJob, ws: Workspace) -> Command:
    """``nmt-train`` with :func:`overrides`."""
    return nmt_train(python, job.work, job.threads, job.seed, ws, overrides(job))


def parse_train_log(text: str) -> list[Window]:
    """The ``train`` events of a run's ``metrics.jsonl`` as windows."""
    windows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as err:
            raise ValueError(f"metrics.jsonl line {number}: not JSON ({err})") from err
        if event.get("event") == "train":
            windows.append(
                Window(
                    int(event["step"]),
                    int(event["updates"]),
                    float(event["seconds"]),
                    float(event["tokens"]),
                )
            )
    if not windows:
        raise ValueError("no 'train' event in metrics.jsonl")
    return windows


def run_details(cmd: Command) -> dict[str, str]:
    """The precision the run trained in (what ``auto`` chose), from its start event."""
    for line in cmd.windows_file.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "start":
            return {"trained_in": str(event.get("precision"))}
    return {}


# ------------------------------------------------------------------------------ its recipe

RECIPE = {
    "source": "experiment=cpu_quick (configs/experiment/cpu_quick.yaml): the project's "
    "30-minute CPU preset",
    "kept": "everything: lr 2e-3 with 300 warm-up updates and a linear decay to the time "
    "limit, validation every 200 updates, the last 5 validations averaged, the average or "
    "the best checkpoint (whichever validates better) decoded with beam 5, alpha 1",
    "adapted": [
        "trainer.max_time is the budget: seconds of updates, validations not counted; the "
        "peers are given the wall-clock time this whole training process took",
    ],
}
STOP_SIGNAL = None  # stops itself at trainer.max_time


def recipe_command(python: Path, job: RecipeJob, ws: Workspace) -> Command:
    """``nmt-train experiment=cpu_quick`` with ``job.seconds`` of training."""
    settings = ["experiment=cpu_quick", f"trainer.max_time={job.seconds:g}"]
    return nmt_train(python, job.work, job.threads, job.seed, ws, settings)


ENGINES = (NATIVE, CT2)  # our search; our CTranslate2 package (nmt-export --format ctranslate2)


def package_dir(job: RecipeJob) -> Path:
    return job.work / "package-ct2"


def convert_command(python: Path, job: RecipeJob, ws: Workspace) -> Command:
    """``nmt-export --format ctranslate2`` of the checkpoint the run decodes (float32
    weights): the package ``engine=ctranslate2`` decodes."""
    argv = [str(python.parent / "nmt-export"), str(job.work / "run"), "--out"]
    argv += [str(package_dir(job)), "--format", "ctranslate2", "--force"]
    return command(argv, job.work, "convert.log", job.threads)


def decode_command(python: Path, job: RecipeJob, ws: Workspace, d: Decoding) -> Command:
    """``nmt-translate`` of ``d.src`` with the run's own decoding settings at ``d.beam``: our
    search on the run's checkpoint, or CTranslate2 on :func:`convert_command`'s package (one
    worker of one thread per core)."""
    model = [f"run={job.work / 'run'}", "engine=torch"]
    if d.engine == CT2:
        model = [f"model={package_dir(job)}", "engine=ctranslate2"]
    return command(
        [
            str(python.parent / "nmt-translate"),
            *model,
            f"input={d.src}",
            f"output={d.out}",
            f"beam={d.beam}",
            *(["max_tokens=1"] if d.one_at_a_time else []),  # a sentence over it is batched alone
            "device=cpu",
            "progress=false",
        ],
        job.work,
        "decode.log",
        job.threads,
    )
