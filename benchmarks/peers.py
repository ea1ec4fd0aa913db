"""nmt beside the toolkits users pick instead: ``make bench-peers``. This module runs the
training-speed rounds and the whole command; :mod:`benchmarks.peers_quality` the BLEU at an
equal time budget.

Each peer (Eole 0.6.4, Marian through pymarian 1.12.42, JoeyNMT 2.3.0; :mod:`benchmarks.peer_eole`,
:mod:`benchmarks.peer_marian`, :mod:`benchmarks.peer_joeynmt`) is installed at its pinned
version into a virtual environment of its own under ``--venvs`` the first time it is needed
(never by ``make install``); nmt runs from the project's venv (:mod:`benchmarks.peer_nmt`).
Every toolkit trains the same model shape as far as it allows (the differences are listed in
the JSON) on the same Multi30k de-en lines, with one joint sentencepiece model where the
toolkit takes it, as a process of its own with the same threads, and every one is measured
the same way: the target tokens (EOS included, padding excluded) and seconds of its own log
windows, the first ``--skip`` updates left out, the median window's rate reported.

Batches: each toolkit is asked for ``--tgt-tokens`` target tokens per update in its own batch
setting, through its module's conversion (each measured over whole epochs of the corpus); the
target tokens each trained on are reported beside its speed. ``--calibrate-steps N`` adds a
first run of N updates per toolkit and scales its setting once by what that run trained on
(useful with another corpus; on a few updates of Multi30k batches vary too much for it).
The toolkits then take turns in ``--rounds`` rounds whose order rotates, so that a drift in
the machine's speed hits all of them, and every precision a toolkit offers on a CPU
(``--precision``) is timed.

    python scripts/bench_peers.py                      # all peers, both models, 3 rounds
    python scripts/bench_peers.py --peers eole --models transformer --quick
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks import peer_eole, peer_joeynmt, peer_marian, peer_nmt
from benchmarks.joeynmt_setup import prepare_joey_dir
from benchmarks.machine import busy_warning, cpu_busy_share, load_average_or_none
from benchmarks.peers_common import (
    CT2,
    NATIVE,
    SHAPE,
    TrainJob,
    Workspace,
    failure,
    fresh,
    run,
    window_stats,
)
from benchmarks.peers_quality import TEST as TEST_SET
from benchmarks.peers_quality import compare_quality
from benchmarks.report import SetupError, table
from benchmarks.report import say as _say
from nmt.data.corpus import DataError
from nmt.environment import child_environment
from nmt.runtime.device import cpu_model

SCHEMA = "nmt-peers/1"
PEERS: dict[str, ModuleType] = {"eole": peer_eole, "marian": peer_marian, "joeynmt": peer_joeynmt}
MODELS = ("transformer", "gru")
DEFINITIONS = {
    "tgt_tokens_per_s": "median over the timed log windows of all rounds of the window's "
    "non-padding target tokens (EOS included) per second, as the toolkit's log reports them",
    "tgt_tokens_per_step_mean": "target tokens per update over the timed windows",
    "step_seconds_median": "median over the timed windows of seconds per update",
    "ratio": "nmt's tgt_tokens_per_s / the peer's, in the same precision; best: nmt's faster "
    "fixed precision against the peer's faster one; auto: nmt in the precision its auto "
    "picks against the peer's faster one",
    "decode_seconds": "wall-clock seconds of the whole decoding process of the test source "
    "(start-up and model loading included), one thread per core",
    "seconds_per_sentence": "the first 100 test sentences decoded one per batch, less the same "
    "process on the first sentence alone, over the 99 sentences between",
    "ctranslate2": "the toolkit's model converted by its own path to CTranslate2 (float32) and "
    "decoded by CTranslate2 through the toolkit's command",
}


def say(msg: str) -> None:
    _say("bench-peers", msg)


@dataclass
class Settings:
    peers: list[str]
    models: list[str]
    precisions: list[str]
    rounds: int
    steps: int
    skip: int
    log_every: int
    tgt_tokens: int
    calibrate_steps: int
    threads: int
    venvs: Path
    work: Path
    data_root: Path
    timeout: float
    out: Path
    python: Path  # nmt's
    speed: bool = True  # the training-speed rounds
    quality_minutes: float = 0.0  # > 0: BLEU at this budget (benchmarks.peers_quality)
    quality_done: dict[str, Any] | None = None  # an earlier run's quality section, continued
    quality_redecode: list[str] = field(default_factory=list)  # kept toolkits decoded again


def check_settings(s: Settings) -> list[str]:
    problems = []
    unknown = [p for p in s.peers if p not in PEERS]
    if unknown or not s.peers:
        problems.append(f"--peers {','.join(s.peers)}: choose among {', '.join(PEERS)}")
    if not s.models or any(m not in MODELS for m in s.models):
        problems.append(f"--models {','.join(s.models)}: choose among {', '.join(MODELS)}")
    if not s.precisions or any(p not in ("32", "bf16", "auto") for p in s.precisions):
        problems.append(f"--precision {','.join(s.precisions)}: use 32, bf16 and/or auto")
    if s.quality_minutes < 0 or not (s.speed or s.quality_minutes):
        problems.append("nothing to measure: --quality-minutes must be >= 0, > 0 with --no-speed")
    kept = (s.quality_done or {}).get("toolkits", {})
    if any(name not in kept for name in s.quality_redecode):
        problems.append(
            f"--quality-redecode {','.join(s.quality_redecode)}: only toolkits kept by "
            f"--quality-continue ({', '.join(kept) or 'none'})"
        )
    if s.steps < s.skip + s.log_every:
        problems.append(f"--steps {s.steps} leave no log window after --skip {s.skip}")
    if min(s.rounds, s.threads, s.tgt_tokens, s.log_every) < 1 or s.calibrate_steps < 0:
        problems.append(
            "--rounds, --threads, --tgt-tokens, --log-every >= 1, --calibrate-steps >= 0"
        )
    return problems


# ------------------------------------------------------------------------------ venvs


def venv_python(venvs: Path, name: str) -> Path:
    return venvs / name / "bin" / "python"


def probe(python: Path, code: str) -> dict[str, Any] | None:
    """What ``code`` prints (JSON) in ``python``; None when it fails."""
    env = child_environment()
    env.pop("PYTHONPATH", None)
    try:
        out = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, check=True, env=env
        )
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def ensure_venv(peer: ModuleType, venvs: Path) -> dict[str, Any]:
    """The peer's versions, after installing it into ``venvs/<name>`` when it is missing."""
    python = venv_python(venvs, peer.NAME)
    found = probe(python, peer.PROBE) if python.exists() else None
    if found is not None:
        return found
    folder = venvs / peer.NAME
    say(f"installing {peer.NAME} {peer.VERSION} into {folder}")
    if folder.exists():
        shutil.rmtree(folder)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    for step in peer.REQUIREMENTS:
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *step], capture_output=True, text=True
        )
        if done.returncode != 0:
            tail = " ".join(done.stderr.strip().splitlines()[-3:])
            raise SetupError(f"installing {' '.join(step)} into {folder} failed: {tail}")
    found = probe(python, peer.PROBE)
    if found is None:
        raise SetupError(f"{python} cannot run {peer.NAME} after installing it: {peer.PROBE}")
    return found


# ------------------------------------------------------------------------------ runs


def segment(peer: ModuleType, python: Path, job: TrainJob, ws: Workspace, s: Settings, skip: int):
    """One training process of ``peer`` for ``job``; its windows' figures."""
    fresh(job.work)
    cmd = peer.train_command(python, job, ws)
    done = run(cmd, s.timeout)
    if done.rc != 0:
        raise failure(peer.NAME, "training", done.rc, cmd)
    windows = peer.parse_train_log(cmd.windows_file.read_text(errors="replace"))
    stats = window_stats(windows, skip)
    details = peer.run_details(cmd) if hasattr(peer, "run_details") else {}
    return {
        **stats,
        **details,
        "process_seconds": done.seconds,
        "peak_rss_bytes": done.peak_rss_bytes,
        "log": str(cmd.log),
    }


def calibrate(peer: ModuleType, python: Path, model: str, ws: Workspace, s: Settings) -> int:
    """The target tokens to ask ``peer`` for so that it trains on ``s.tgt_tokens``
    (``s.tgt_tokens`` itself without a calibration run)."""
    if s.calibrate_steps == 0:
        return s.tgt_tokens
    job = TrainJob(
        model, "32", s.calibrate_steps, s.tgt_tokens, s.threads, s.work / peer.NAME / "calib", 1
    )
    say(f"{peer.NAME} {model}: calibrating its batch over {s.calibrate_steps} updates")
    got = segment(peer, python, job, ws, s, 0)["tgt_tokens_per_step_mean"]
    asked = round(s.tgt_tokens * s.tgt_tokens / got)
    say(f"{peer.NAME} {model}: {got:.0f} target tokens per update; asking {asked} instead")
    return asked


def summarize(segments: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r for seg in segments for r in seg["window_tokens_per_s"]]
    return {
        "tgt_tokens_per_s": statistics.median(rates),
        "tgt_tokens_per_s_by_round": [seg["tgt_tokens_per_s"] for seg in segments],
        "tgt_tokens_per_step_mean": statistics.mean(
            g["tgt_tokens_per_step_mean"] for g in segments
        ),
        "step_seconds_median": statistics.median(g["step_seconds_median"] for g in segments),
        "peak_rss_bytes": max(g["peak_rss_bytes"] for g in segments),
        "rounds": segments,
    }


def ratios(toolkits: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """nmt / peer per precision both timed; ``best``: nmt's faster fixed precision against
    the peer's faster one; ``auto``: nmt in the precision ``auto`` picks against the same."""
    ours = toolkits.get("nmt", {})
    out: dict[str, dict[str, float]] = {}
    for name, theirs in toolkits.items():
        if name == "nmt" or not theirs or not ours:
            continue
        r = {
            p: ours[p]["tgt_tokens_per_s"] / theirs[p]["tgt_tokens_per_s"]
            for p in theirs
            if p in ours
        }
        best_theirs = max(v["tgt_tokens_per_s"] for v in theirs.values())
        fixed = [v["tgt_tokens_per_s"] for p, v in ours.items() if p != "auto"]
        if fixed:
            r["best"] = max(fixed) / best_theirs
        if "auto" in ours:
            r["auto"] = ours["auto"]["tgt_tokens_per_s"] / best_theirs
        out[name] = r
    return out


def compare_training(
    s: Settings, ws: Workspace, kits: dict[str, ModuleType], pythons: dict[str, Path]
) -> dict[str, Any]:
    """Per model: each toolkit's batch calibrated, then ``s.rounds`` rounds in a rotating
    order, every precision the toolkit offers; ``kits``: name -> module, nmt's as "nmt"."""
    out: dict[str, Any] = {}
    for model in s.models:
        present = {n: m for n, m in kits.items() if model in m.PRECISIONS}
        asked = {n: calibrate(m, pythons[n], model, ws, s) for n, m in present.items()}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {n: {} for n in present}
        names = list(present)
        for r in range(s.rounds):
            say(f"{model}: round {r + 1} of {s.rounds}")
            for name in names[r % len(names) :] + names[: r % len(names)]:
                peer = present[name]
                for precision in [p for p in s.precisions if p in peer.PRECISIONS[model]]:
                    work = s.work / name / f"{model}-{precision}"
                    job = TrainJob(
                        model, precision, s.steps, asked[name], s.threads, work, s.log_every
                    )
                    say(f"{name} {model} {precision}: {s.steps} updates")
                    seg = segment(peer, pythons[name], job, ws, s, s.skip)
                    rate = seg["tgt_tokens_per_s"]
                    say(f"{name} {model} {precision}: {rate:,.0f} target tokens/s")
                    runs[name].setdefault(precision, []).append(seg)
        toolkits = {n: {p: summarize(v) for p, v in by.items()} for n, by in runs.items()}
        out[model] = {
            "asked_tgt_tokens": asked,
            "toolkits": toolkits,
            "ratios": ratios(toolkits),
            "differences": {n: present[n].DIFFERENCES[model] for n in present},
        }
    return out


def compare(s: Settings) -> dict[str, Any]:
    problems = check_settings(s)
    if problems:
        raise SetupError("\n".join(problems))
    start = time.perf_counter()
    versions = {"nmt": probe(s.python, peer_nmt.PROBE)}
    pythons = {"nmt": s.python}
    for name in s.peers:
        versions[name] = ensure_venv(PEERS[name], s.venvs)
        pythons[name] = venv_python(s.venvs, name)
    ws = Workspace(s.work / "shared", s.data_root.resolve())
    try:
        prepare_joey_dir(ws.root, s.data_root, s.threads)
    except DataError as err:
        raise SetupError(f"preparing the shared data in {ws.root}: {err}") from err
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(s).items()
            if k != "quality_done"
        },
        "definitions": DEFINITIONS,
        "shape": SHAPE,
        "machine": {
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "threads": s.threads,
            "load_average_start": load_average_or_none(),
            "cpu_busy_share_start": cpu_busy_share(),
        },
        "versions": versions,
    }
    kits = {"nmt": peer_nmt, **{name: PEERS[name] for name in s.peers}}
    if s.speed:
        result["train"] = compare_training(s, ws, kits, pythons)
    if s.quality_minutes:
        result["quality"] = compare_quality(
            s.quality_minutes, s.threads, s.work, ws, kits, pythons, s.quality_done,
            s.quality_redecode,
        )  # fmt: skip
    result["machine"]["load_average_end"] = load_average_or_none()
    result["seconds"] = time.perf_counter() - start
    return result


def with_quick(s: Settings) -> Settings:
    """A smoke run: one round of short segments, a 2-minute quality budget if one is asked."""
    return replace(s, rounds=1, steps=12, skip=4, quality_minutes=min(s.quality_minutes, 2))


def quality_report(quality: dict[str, Any]) -> str:
    """The BLEU table (each toolkit's own beam-5 decoding) and the decoding table (each
    toolkit's translator, and CTranslate2 where the toolkit converts to it)."""
    rows, decoding = [], []
    for name, r in quality["toolkits"].items():
        low, high = r["bleu_ci"]
        p = r.get("p_value_against_nmt")
        rows.append(
            [
                name,
                f"{r['bleu']:.2f} [{low:.2f}, {high:.2f}]",
                "" if p is None else f"{p:.4f}",
                str(r["updates"] or "?"),
                f"{r['training_seconds'] / 60:.1f}",
            ]
        )
        for engine, d in ((NATIVE, r), *((e, r[e]) for e in (CT2,) if e in r)):
            one = d["one_at_a_time"]
            decoding.append(
                [
                    name,
                    engine,
                    f"{d['bleu']:.2f}",
                    f"{d['decode_seconds']:.1f}",
                    f"{d['greedy']['bleu']:.2f}",
                    f"{d['greedy']['decode_seconds']:.1f}",
                    f"{1000 * one['beam5']['seconds_per_sentence']:.0f}",
                    f"{1000 * one['greedy']['seconds_per_sentence']:.0f}",
                ]
            )
    header = ["toolkit", "BLEU [95% CI]", "p vs nmt", "updates", "train min"]
    head = f"{TEST_SET} BLEU, beam 5, after {quality['minutes']:g} minutes of nmt's training"
    dec_header = ["toolkit", "engine", "BLEU", "beam 5 s", "greedy BLEU", "greedy s"]
    dec_header += ["ms/sent beam 5, one", "ms/sent greedy, one"]
    dec_head = f"decoding the {TEST_SET} source (whole processes), and one sentence at a time"
    return "\n".join(
        [head, table(header, rows, "l"), "", dec_head, table(dec_header, decoding, "ll")]
    )


def report(result: dict[str, Any]) -> str:
    """The training table (per model, toolkit and precision, with nmt's ratio) and the
    quality table."""
    text = [quality_report(result["quality"])] if "quality" in result else []
    if "train" not in result:
        return text[0]
    rows = []
    for model, entry in result["train"].items():
        for name, by in entry["toolkits"].items():
            for precision, v in by.items():
                ratio = entry["ratios"].get(name, {}).get(precision)
                rows.append(
                    [
                        model,
                        name,
                        precision,
                        f"{v['tgt_tokens_per_step_mean']:,.0f}",
                        f"{v['tgt_tokens_per_s']:,.0f}",
                        " / ".join(f"{x:,.0f}" for x in v["tgt_tokens_per_s_by_round"]),
                        f"{ratio:.2f}x" if ratio else "",
                    ]
                )
    header = ["model", "toolkit", "precision", "tgt tok/update", "tgt tok/s", "by round", "nmt/it"]
    lines = [table(header, rows, "lll")]
    for model, entry in result["train"].items():
        for name, r in entry["ratios"].items():
            for key, what in (("best", "nmt's faster precision"), ("auto", "nmt's auto")):
                if key in r:
                    lines.append(f"{model}: {what} / {name}'s faster: {r[key]:.2f}x")
    warning = busy_warning(result["machine"])
    return "\n\n".join(["\n".join([*lines, warning] if warning else lines), *text])
