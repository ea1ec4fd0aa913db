"""Shipping benchmarks: ``make bench-serve`` (JSON out).

In one run on this machine, for the checkpoints given (each exported to a package first):

* offline decoding of the test set (default: the model's first test split, test_2016_flickr
  for Multi30k), all sentences batched: sentences/s, target tokens/s (EOS counted) and BLEU of
  our PyTorch search and of CTranslate2 in float32 and int8, greedy and beam 5, for the
  Transformer checkpoints (``--transformer``, ``--transformer-base``); for the GRU
  (``--gru``) our search in fp32 and with int8 linear layers and GRU cells
  (``engine=torch-int8``, :mod:`nmt.models.int8`). ``--fixed-length N`` (used for
  ``--transformer-base``: 20) forces every output to exactly N tokens, so engines do equal
  work whatever the weights; a model decoded so is also decoded once with its natural output
  lengths, for its BLEU (``natural_length``);
* parity: the share of sentences whose CTranslate2 float32 greedy output equals ours (and
  the others, with whether they reached the length cap), the beam-5 BLEU difference;
* what ``engine=auto`` picks for each search (its probe, cached under the work folder);
* footprint: the size of each package and of its CTranslate2 model;
* the server (``--serve``, on the ``--transformer`` model as deployed: the torch engine on the
  fp32 package, the ctranslate2 engine on the int8 CTranslate2-only package): resident memory
  after start and after the load test, time from start to the first answer, then 1, 8 and 32
  concurrent clients sending single sentences (bounded by ``--requests`` per level and
  ``--level-seconds``), with the package's search and with greedy search (``beam`` of each
  level): throughput, p50/p99 latency, errors, and the throughput against the same engine's
  offline batched figure and against the test set decoded by that engine in consecutive
  batches of as many sentences as the largest level has clients, one batch at a time, in the
  set's order (the most a server fed by that many single-sentence clients gets by batching
  them as they come) and sorted by length; then the most clients again, each sending
  ``--per-request`` sentences per request; then ``--malformed``
  malformed requests (statuses, and that the server still answers), and a SIGTERM.

::

    python scripts/bench_serve.py --transformer RUN/checkpoints/best.pt \\
        --transformer-base BASE/checkpoints/last.pt --gru GRU/checkpoints/best.pt
    python scripts/bench_serve.py --quick ...     # a smoke run: few sentences and requests
    python scripts/bench_serve.py --transformer CKPT --no-offline --overload \\
        --ab-base ../checkout-before       # overload, abandoned burst, A/B: see serve_overload
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import shutil
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.memory import load_average
from benchmarks.serve_load import bench_server, say
from benchmarks.serve_overload import run_overload
from nmt.data.datasets import EvalSet, encode_texts, load_eval_set, load_test_sets
from nmt.decode import ct2
from nmt.decode.engines import TorchEngine, auto_choice, make_engine
from nmt.decode.options import DecodeOptions
from nmt.environment import multi30k_source
from nmt.evaluate.metrics import bleu
from nmt.runtime.device import cpu_model
from nmt.ship.export import export_package
from nmt.store.loading import Trained, load_package
from nmt.store.package import CT2_DIR
from nmt.store.paths import checkpoint_path

SCHEMA = "nmt-bench-serve/1"
BEAM = 5
CPU = torch.device("cpu")


@dataclass
class ServeSettings:
    """What ``scripts/bench_serve.py`` measures (its options, same names)."""

    transformer: str | None = None  # checkpoint (or run) of the default Transformer
    transformer_base: str | None = None  # of model=transformer_base
    gru: str | None = None
    test: str | None = None  # SRC:REF files instead of each model's own test split
    sentences: int = 0  # test sentences (0 = all)
    base_sentences: int = 200  # for --transformer-base
    fixed_length: int = 20  # output length, --transformer-base
    fixed_length_all: int = 0  # for --transformer and --gru too
    fixed_length_gru: int = 0  # for --gru only (default: fixed_length_all)
    threads: int = 2
    rounds: int = 2  # timed runs per measurement (best kept)
    serve: bool = True
    levels: str = "1,8,32"  # concurrent clients of the load test
    per_request: int = 8  # sentences per request of one more level at the most clients (0: none)
    requests: int = 400  # requests per load level
    level_seconds: float = 30.0
    malformed: int = 1000
    offline: bool = True  # offline figures and the server's load levels (--no-offline: not)
    overload: bool = False  # the overload phases (benchmarks.serve_overload), --transformer
    overload_seconds: float = 20.0  # length of the overload phase (half for each level)
    patience: float = 10.0  # clients give up after this, and the server's request_timeout
    burst_clients: int = 100  # clients of the abandoned burst
    burst_patience: float = 2.0  # seconds before each gives up
    recovery_cap: float = 120.0  # seconds of probing after the burst, at most
    ab_base: str | None = None  # a checkout of the code before, for A/B figures
    ab_rounds: int = 3  # A B rounds
    setting_ab: str | None = None  # a server setting (KEY=VALUE) against the default, overloaded
    setting_rounds: int = 3  # its A B rounds
    setting_levels: bool = False  # the setting A/B also runs the load levels (levels)
    overload_engines: str = "torch,ctranslate2"  # the engines of the overload phases
    work: str = "outputs/bench/serve-work"
    out: str | None = None
    quick: bool = False
    command: str = ""  # the command line, recorded in the JSON
    cwd: Path | None = None  # where the server runs (the repository)

    @property
    def clients(self) -> list[int]:
        """The concurrent clients of each single-sentence load level."""
        return [int(c) for c in self.levels.split(",")]

    def __post_init__(self) -> None:
        if self.quick:  # a smoke run: few sentences and requests
            self.sentences = self.sentences or 40
            self.base_sentences = min(self.base_sentences, 20)
            self.requests, self.malformed = min(self.requests, 20), min(self.malformed, 30)
            self.rounds = 1
            self.level_seconds = min(self.level_seconds, 10.0)
            self.overload_seconds = min(self.overload_seconds, 10.0)
            self.recovery_cap = min(self.recovery_cap, 60.0)


def machine() -> dict[str, Any]:
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_start": load_average(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ctranslate2": ct2.version() if ct2.available() else None,
    }


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------- offline


def test_set(trained: Trained, s: ServeSettings, limit: int) -> EvalSet:
    if s.test:
        src, ref = s.test.split(":")
        ds = load_eval_set(Path(src).name, src, ref, trained.tokenizers)
    else:
        ds = load_test_sets(trained.cfg.data, trained.tokenizers, multi30k_source())[0]
    if limit and limit < len(ds):
        src, ref = ds.src_text[:limit], ds.ref_text[:limit]
        ds = EvalSet(ds.name, src, ref, encode_texts(trained.tokenizers, src, ref))
    return ds


def timed_decode(engine: Any, ds: EvalSet, opts: DecodeOptions, rounds: int) -> dict[str, Any]:
    """Decode the whole set ``rounds`` times after a warm-up on a few sentences; best time."""
    engine.hypotheses(ds.data, opts, limit=min(16, len(ds)))
    seconds, outputs = [], []
    for _ in range(rounds):
        calls = getattr(engine, "calls", 0)
        start = time.perf_counter()
        outputs = engine.hypotheses(ds.data, opts)
        seconds.append(time.perf_counter() - start)
    best = min(seconds)
    tokens = sum(len(h.tokens) + 1 for h in outputs)
    extra = {}
    if hasattr(engine, "calls"):  # CTranslate2: translate_batch calls of one decode of the set
        extra["ctranslate2_calls"] = engine.calls - calls
    return {
        **extra,
        "seconds": round(best, 4),
        "seconds_all": [round(s, 4) for s in seconds],
        "sentences_per_s": round(len(ds) / best, 2),
        "tgt_tokens_per_s": round(tokens / best, 1),
        "tgt_tokens": tokens,
        "outputs": outputs,
    }


def offline_options(fixed: int | None) -> DecodeOptions:
    """The options of the offline figures; ``fixed``: every output exactly that many tokens."""
    opts = DecodeOptions(max_tokens=8192)
    if fixed:
        opts = replace(opts, max_output_len_a=0.0, max_output_len_b=fixed, min_output_len=fixed)
    return opts


def batches_of(
    engine: Any, ds: EvalSet, opts: DecodeOptions, size: int, rounds: int, by_length: bool = False
) -> float:
    """Sentences/s decoding the set in consecutive batches of ``size`` sentences, one batch
    at a time (best of ``rounds``). In the set's order: what a server whose every batch holds
    the single sentences of ``size`` clients could give at most. ``by_length``: the set sorted
    by source length first, so a batch's sentences end at about the same step: what a server
    holding ``size`` sentences at a time could give if it chose which ones share a batch."""
    n = len(ds)
    order = np.argsort(ds.data.src_lens[:n], kind="stable") if by_length else np.arange(n)
    batches = [ds.data.subset(order[i : i + size]) for i in range(0, n, size)]
    engine.hypotheses(batches[0], opts)  # warm-up
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for batch in batches:
            engine.hypotheses(batch, opts)
        best = min(best, time.perf_counter() - start)
    return round(n / best, 2)


def score(outputs: list, trained: Trained, ds: EvalSet) -> float:
    hyps = [trained.tokenizers.tgt.decode(h.tokens) for h in outputs]
    return round(bleu(hyps, ds.ref_text).score, 2)


def export(ckpt: str, work: Path, name: str, quantize: str | None) -> Path:
    out = work / name
    if out.exists():
        shutil.rmtree(out)
    fmt = "torch" if quantize is None else "ctranslate2"
    return export_package(Path(ckpt), out, fmt=fmt, quantize=quantize)


def bench_model(
    label: str, ckpt: str, s: ServeSettings, work: Path, fixed: int | None, limit: int
) -> dict[str, Any]:
    """Offline figures of one checkpoint (see the module docstring)."""
    if Path(ckpt).is_dir():  # a run directory: the checkpoint make eval would load
        ckpt = str(checkpoint_path(ckpt))
    with contextlib.suppress(ValueError):  # recorded relative to the working directory
        ckpt = str(Path(ckpt).resolve().relative_to(Path.cwd().resolve()))
    say(f"{label}: exporting {ckpt}")
    trained_pkg = export(ckpt, work, f"{label}-torch", None)
    trained = load_package(trained_pkg, CPU)
    ds = test_set(trained, s, limit)
    base = offline_options(fixed)
    result: dict[str, Any] = {
        "checkpoint": str(ckpt),
        "step": trained.step,
        "arch": trained.cfg.model.arch,
        "parameters": trained.model.num_parameters(),
        "test_set": ds.name,
        "sentences": len(ds),
        "fixed_length": fixed,
        "packages": {"torch": {"path": str(trained_pkg), "bytes": folder_size(trained_pkg)}},
        "runs": {},
    }
    engines: dict[str, Any] = {"torch": TorchEngine(trained.model, CPU)}
    if trained.cfg.model.arch == "transformer" and ct2.available():
        for q in ("float32", "int8"):
            pkg = export(ckpt, work, f"{label}-ct2-{q}", q)
            result["packages"][f"ctranslate2-{q}"] = {
                "path": str(pkg),
                "bytes": folder_size(pkg),
                "ctranslate2_model_bytes": folder_size(pkg / CT2_DIR),
            }
            engines[f"ctranslate2-{q}"] = make_engine(
                "ctranslate2", load_package(pkg, CPU), base, CPU
            )
        only = work / f"{label}-ct2-int8-only"
        if only.exists():
            shutil.rmtree(only)
        export_package(Path(ckpt), only, fmt="ctranslate2", quantize="int8", ctranslate2_only=True)
        result["packages"]["ctranslate2-int8-only"] = {
            "path": str(only),
            "bytes": folder_size(only),
        }
        fp32 = result["packages"]["torch"]["bytes"]
        result["int8_only_package_vs_fp32_package"] = round(folder_size(only) / fp32, 3)
    elif trained.cfg.model.arch == "gru_bahdanau":
        engines["torch-int8"] = make_engine("torch-int8", trained, base, CPU)
    outputs: dict[tuple[str, int], list] = {}
    for beam in (1, BEAM):
        opts = replace(base, beam=beam, length_penalty=1.0)
        for name, engine in engines.items():
            say(f"{label}: {name} beam {beam} on {len(ds)} sentences")
            run = timed_decode(engine, ds, opts, s.rounds)
            outputs[name, beam] = run.pop("outputs")
            run["bleu"] = score(outputs[name, beam], trained, ds)
            if fixed:  # the forced length makes BLEU meaningless: once with natural lengths
                natural = replace(offline_options(None), beam=beam, length_penalty=1.0)
                start = time.perf_counter()
                hyps = engine.hypotheses(ds.data, natural)
                run["natural_length"] = {
                    "bleu": score(hyps, trained, ds),
                    "seconds": round(time.perf_counter() - start, 4),
                    "tgt_tokens": sum(len(h.tokens) + 1 for h in hyps),
                }
            result["runs"][f"{name}.beam{beam}"] = run
    ours = {beam: result["runs"][f"torch.beam{beam}"] for beam in (1, BEAM)}
    for key, run in result["runs"].items():
        beam = int(key.rsplit("beam", 1)[1])
        run["speed_vs_torch"] = round(run["sentences_per_s"] / ours[beam]["sentences_per_s"], 3)
        run["bleu_vs_torch"] = round(run["bleu"] - ours[beam]["bleu"], 2)
        if "natural_length" in run:
            natural = run["natural_length"]
            natural["bleu_vs_torch"] = round(
                natural["bleu"] - ours[beam]["natural_length"]["bleu"], 2
            )
    if ("ctranslate2-float32", 1) in outputs:
        result["parity"] = parity(outputs, ds, base)
        result["auto"] = {}
        for beam in (1, BEAM):
            opts = replace(base, beam=beam)
            pkg = load_package(work / f"{label}-ct2-float32", CPU)
            choice, speeds, cached = auto_choice(
                pkg, opts, CPU, work / "engine-cache", sample=ds.data
            )
            result["auto"][f"beam{beam}"] = {"choice": choice, "probe": speeds, "cached": cached}
    return result


def parity(outputs: dict, ds: EvalSet, opts: DecodeOptions) -> dict[str, Any]:
    """CTranslate2 float32 against ours: identical greedy outputs, and the others."""
    ours, theirs = outputs["torch", 1], outputs["ctranslate2-float32", 1]
    caps = opts.caps(ds.data.src_lens + 1)
    differ = [
        {
            "index": i,
            "ours_len": len(a.tokens),
            "ctranslate2_len": len(b.tokens),
            "capped": len(a.tokens) >= int(caps[i]),
        }
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
        if a.tokens != b.tokens
    ]
    beam_same = sum(
        a.tokens == b.tokens
        for a, b in zip(outputs["torch", BEAM], outputs["ctranslate2-float32", BEAM], strict=True)
    )
    return {
        "greedy_identical_share": round(1 - len(differ) / len(ours), 4),
        "greedy_differing": differ[:50],
        "beam5_identical_share": round(beam_same / len(ours), 4),
    }


# ----------------------------------------------------------------------------------- server


# -------------------------------------------------------------------------------------- run


def run(s: ServeSettings) -> dict[str, Any]:
    """Every measurement the settings ask for: the JSON-ready result."""
    torch.set_num_threads(s.threads)
    random.seed(0)
    work = Path(s.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "date": datetime.now().isoformat(timespec="seconds"),
        "command": s.command,
        "machine": machine(),
        "threads": s.threads,
        "models": {},
    }
    models = [
        ("transformer", s.transformer, s.fixed_length_all or None, s.sentences),
        ("transformer_base", s.transformer_base, s.fixed_length, s.base_sentences),
        ("gru", s.gru, s.fixed_length_gru or s.fixed_length_all or None, s.sentences),
    ]
    overload_ckpt = None
    if s.overload and s.transformer:
        overload_ckpt = Path(s.transformer)
        if overload_ckpt.is_dir():  # a run directory: the checkpoint make eval would load
            overload_ckpt = checkpoint_path(overload_ckpt)
    if overload_ckpt is not None and not s.offline:  # only the packages the servers serve
        say("transformer: exporting for the overload phases")
        export(str(overload_ckpt), work, "transformer-torch", None)
        only = work / "transformer-ct2-int8-only"
        if only.exists():
            shutil.rmtree(only)
        export_package(
            overload_ckpt, only, fmt="ctranslate2", quantize="int8", ctranslate2_only=True
        )
    for label, ckpt, fixed, limit in models:
        if ckpt and s.offline:
            result["models"][label] = bench_model(label, ckpt, s, work, fixed, limit)
    if overload_ckpt is not None:
        trained = load_package(work / "transformer-torch", CPU)
        packages = {
            "torch": work / "transformer-torch",
            "ctranslate2": work / "transformer-ct2-int8-only",
        }
        packages = {e: packages[e] for e in s.overload_engines.split(",")}
        lines = test_set(trained, s, s.sentences).src_text
        beam = trained.cfg.decode.beam or 1
        result["overload"] = run_overload(s, packages, lines, beam, overload_ckpt)
    if s.serve and s.transformer and s.offline:
        trained = load_package(work / "transformer-torch", CPU)
        ds = test_set(trained, s, s.sentences)
        sentences = ds.src_text
        most = max(s.clients)
        base = offline_options(s.fixed_length_all or None)
        decode = trained.cfg.decode
        result["server"] = {
            "decode": {"beam": decode.beam, "length_penalty": decode.length_penalty}
        }
        runs = result["models"]["transformer"]["runs"]
        # each engine as it would be deployed: the fp32 package, the int8 CTranslate2-only one
        # (its int8 model is the one of the package the offline figures come from)
        servers = (
            ("torch", "transformer-torch", "torch", "transformer-torch"),
            (
                "ctranslate2",
                "transformer-ct2-int8-only",
                "ctranslate2-int8",
                "transformer-ct2-int8",
            ),
        )
        beams = dict.fromkeys((decode.beam or 1, 1))  # the package's search, then greedy
        for engine, package, offline_key, same_model in servers:
            offline = {
                b: runs.get(f"{offline_key}.beam{b}", {}).get("sentences_per_s") for b in beams
            }
            decoder = make_engine(engine, load_package(work / same_model, CPU), base, CPU)
            say(f"{engine}: the test set in batches of {most} sentences")
            searches = {b: replace(base, beam=b, length_penalty=1.0) for b in beams}
            in_batches = {
                f"in{sort}_batches_of_{most}": {
                    b: batches_of(decoder, ds, o, most, s.rounds, by_length=bool(sort))
                    for b, o in searches.items()
                }
                for sort in ("", "_length_sorted")
            }
            del decoder
            server = bench_server(work / package, engine, sentences, offline, s, in_batches)
            result["server"][engine] = {"package": str(work / package), **server}
        torch_rss = result["server"]["torch"]["rss_kib_after_load"]
        ct2_rss = result["server"]["ctranslate2"]["rss_kib_after_load"]
        if torch_rss and ct2_rss:
            result["server"]["ctranslate2_rss_vs_torch"] = round(ct2_rss / torch_rss, 3)
    result["machine"]["load_average_end"] = load_average()
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a result, for the terminal."""
    out: dict[str, Any] = {}
    for label, model in result["models"].items():
        out[label] = {
            key: f"{run['sentences_per_s']} sent/s, BLEU {run['bleu']}"
            for key, run in model["runs"].items()
        }
        if "parity" in model:
            out[label]["greedy identical"] = model["parity"]["greedy_identical_share"]
    for engine, over in result.get("overload", {}).items():
        o, b = over["overload_4x"], over["abandoned_burst"]
        out[f"overload {engine}"] = {
            "sustainable clients": over["sustainable"]["clients"],
            "4x: answered 200 share": o["answered_200_share"],
            "4x: 503 p99 s": o["latency_503_p99_s"],
            "burst: s to normal latency": b["seconds_to_normal_latency"],
        }
        if "abandoned_burst_before" in over:
            before = over["abandoned_burst_before"]["seconds_to_normal_latency"]
            out[f"overload {engine}"]["burst before: s to normal latency"] = before
        if "ab" in over:
            out[f"overload {engine}"]["A/B medians"] = over["ab"]["medians"]
        if "setting_ab" in over:
            out[f"overload {engine}"]["setting A/B medians"] = over["setting_ab"]["medians"]
            if "level_medians" in over["setting_ab"]:
                levels = over["setting_ab"]["level_medians"]
                out[f"overload {engine}"]["setting A/B level medians"] = levels
    for engine in ("torch", "ctranslate2"):
        server = result.get("server", {}).get(engine)
        if server:
            out[f"server {engine}"] = {
                "first answer s": server["first_answer_after_start_s"],
                "rss MiB": round((server["rss_kib_after_load"] or 0) / 1024, 1),
                "levels": {
                    f"beam {lv['beam']}, {lv['clients']} clients x "
                    f"{lv['sentences_per_request']} sentences": f"{lv['sentences_per_s']} "
                    f"sent/s ({lv.get('vs_offline_batched')} of offline) p99 "
                    f"{lv['latency_p99_s']}s errors {lv['errors']}"
                    for lv in server["levels"]
                },
                "malformed all 4xx": server["malformed"]["all_4xx"],
            }
    return out
