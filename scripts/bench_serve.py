"""Shipping benchmarks: ``make bench-serve`` (JSON out).

In one run on this machine, for the checkpoints given (each exported to a package first):

* offline decoding of the test set (default: the model's first test split, test_2016_flickr
  for Multi30k), all sentences batched: sentences/s, target tokens/s (EOS counted) and BLEU of
  our PyTorch search and of CTranslate2 in float32 and int8, greedy and beam 5, for the
  Transformer checkpoints (``--transformer``, ``--transformer-base``); for the GRU
  (``--gru``) our search in fp32 and with PyTorch dynamic int8 quantization of its linear and
  recurrent layers. ``--fixed-length N`` (used for ``--transformer-base``: 20) forces every
  output to exactly N tokens, so engines do equal work whatever the weights;
* parity: the share of sentences whose CTranslate2 float32 greedy output equals ours (and
  the others, with whether they reached the length cap), the beam-5 BLEU difference;
* what ``engine=auto`` picks for each search (its probe, cached under the work folder);
* footprint: the size of each package and of its CTranslate2 model;
* the server (``--serve``, on the ``--transformer`` model as deployed: the torch engine on the
  fp32 package, the ctranslate2 engine on the int8 CTranslate2-only package): resident memory
  after start and after the load test, time from start to the first answer, then 1, 8 and 32
  concurrent clients sending single sentences (bounded by ``--requests`` per level and
  ``--level-seconds``): throughput, p50/p99 latency, errors, and
  the throughput against the same engine's offline batched figure; then ``--malformed``
  malformed requests (statuses, and that the server still answers), and a SIGTERM.

::

    python scripts/bench_serve.py --transformer RUN/checkpoints/best.pt \\
        --transformer-base BASE/checkpoints/last.pt --gru GRU/checkpoints/best.pt
    python scripts/bench_serve.py --quick ...     # a smoke run: few sentences and requests
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from nmt import ct2
from nmt.data.prepare import EvalSet, encode_texts, load_eval_set, load_test_sets
from nmt.engines import TorchEngine, auto_choice, make_engine
from nmt.export import export_package, load_package
from nmt.inference import Trained, checkpoint_path
from nmt.metrics import bleu
from nmt.package import CT2_DIR
from nmt.procmem import load_average
from nmt.runtime import cpu_model
from nmt.search import DecodeOptions

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "nmt-bench-serve/1"
BEAM = 5
CPU = torch.device("cpu")


def say(msg: str) -> None:
    print(f"[bench-serve {datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--transformer", help="checkpoint (or run) of the default Transformer")
    p.add_argument("--transformer-base", help="checkpoint (or run) of model=transformer_base")
    p.add_argument("--gru", help="checkpoint (or run) of the GRU model")
    p.add_argument("--test", help="SRC:REF files instead of each model's own test split")
    p.add_argument("--sentences", type=int, default=0, help="test sentences (0 = all)")
    p.add_argument("--base-sentences", type=int, default=200, help="for --transformer-base")
    p.add_argument("--fixed-length", type=int, default=20, help="output length, --transformer-base")
    p.add_argument(
        "--fixed-length-all",
        type=int,
        default=0,
        help="force this output length for --transformer and --gru too (barely trained weights)",
    )
    p.add_argument(
        "--fixed-length-gru",
        type=int,
        default=0,
        help="force this output length for --gru only (default: --fixed-length-all)",
    )
    p.add_argument("--threads", type=int, default=2, help="threads of every engine")
    p.add_argument("--rounds", type=int, default=2, help="timed runs per measurement (best kept)")
    p.add_argument("--serve", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--levels", default="1,8,32", help="concurrent clients of the load test")
    p.add_argument("--requests", type=int, default=400, help="requests per load level")
    p.add_argument("--level-seconds", type=float, default=30.0, help="time bound of a level")
    p.add_argument("--malformed", type=int, default=1000, help="malformed requests sent")
    p.add_argument("--work", default="outputs/bench/serve-work", help="packages and caches")
    p.add_argument("--out", help="JSON (default outputs/bench/bench-serve-<timestamp>.json)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 40 sentences, few requests")
    args = p.parse_args(argv)
    if args.quick:
        args.sentences = args.sentences or 40
        args.base_sentences = min(args.base_sentences, 20)
        args.requests, args.malformed = min(args.requests, 20), min(args.malformed, 30)
        args.rounds = 1
        args.level_seconds = min(args.level_seconds, 10.0)
    return args


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


def test_set(trained: Trained, args: argparse.Namespace, limit: int) -> EvalSet:
    if args.test:
        src, ref = args.test.split(":")
        ds = load_eval_set(Path(src).name, src, ref, trained.tokenizers)
    else:
        ds = load_test_sets(trained.cfg.data, trained.tokenizers)[0]
    if limit and limit < len(ds):
        src, ref = ds.src_text[:limit], ds.ref_text[:limit]
        ds = EvalSet(ds.name, src, ref, encode_texts(trained.tokenizers, src, ref))
    return ds


def timed_decode(engine: Any, ds: EvalSet, opts: DecodeOptions, rounds: int) -> dict[str, Any]:
    """Decode the whole set ``rounds`` times after a warm-up on a few sentences; best time."""
    engine.hypotheses(ds.data, opts, limit=min(16, len(ds)))
    seconds, outputs = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        outputs = engine.hypotheses(ds.data, opts)
        seconds.append(time.perf_counter() - start)
    best = min(seconds)
    tokens = sum(len(h.tokens) + 1 for h in outputs)
    return {
        "seconds": round(best, 4),
        "seconds_all": [round(s, 4) for s in seconds],
        "sentences_per_s": round(len(ds) / best, 2),
        "tgt_tokens_per_s": round(tokens / best, 1),
        "tgt_tokens": tokens,
        "outputs": outputs,
    }


def score(outputs: list, trained: Trained, ds: EvalSet) -> float:
    hyps = [trained.tokenizers.tgt.decode(h.tokens) for h in outputs]
    return round(bleu(hyps, ds.ref_text).score, 2)


def quantized_gru(trained: Trained) -> torch.nn.Module:
    """The GRU with int8 weights for its linear and recurrent layers (dynamic quantization)."""
    layers = {torch.nn.Linear, torch.nn.GRU, torch.nn.GRUCell}
    return torch.ao.quantization.quantize_dynamic(trained.model, layers, dtype=torch.qint8)


def export(ckpt: str, work: Path, name: str, quantize: str | None) -> Path:
    out = work / name
    if out.exists():
        shutil.rmtree(out)
    fmt = "torch" if quantize is None else "ctranslate2"
    return export_package(Path(ckpt), out, fmt=fmt, quantize=quantize)


def bench_model(
    label: str, ckpt: str, args: argparse.Namespace, work: Path, fixed: int | None, limit: int
) -> dict[str, Any]:
    """Offline figures of one checkpoint (see the module docstring)."""
    if Path(ckpt).is_dir():  # a run directory: the checkpoint make eval would load
        ckpt = str(checkpoint_path(ckpt))
    with contextlib.suppress(ValueError):  # recorded relative to the working directory
        ckpt = str(Path(ckpt).resolve().relative_to(Path.cwd().resolve()))
    say(f"{label}: exporting {ckpt}")
    trained_pkg = export(ckpt, work, f"{label}-torch", None)
    trained = load_package(trained_pkg, CPU)
    ds = test_set(trained, args, limit)
    base = DecodeOptions(max_tokens=8192)
    if fixed:
        base = replace(base, max_output_len_a=0.0, max_output_len_b=fixed, min_output_len=fixed)
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
        engines["torch-int8"] = TorchEngine(quantized_gru(trained), CPU)
    outputs: dict[tuple[str, int], list] = {}
    for beam in (1, BEAM):
        opts = replace(base, beam=beam, length_penalty=1.0)
        for name, engine in engines.items():
            say(f"{label}: {name} beam {beam} on {len(ds)} sentences")
            run = timed_decode(engine, ds, opts, args.rounds)
            outputs[name, beam] = run.pop("outputs")
            run["bleu"] = score(outputs[name, beam], trained, ds)
            result["runs"][f"{name}.beam{beam}"] = run
    ours = {beam: result["runs"][f"torch.beam{beam}"] for beam in (1, BEAM)}
    for key, run in result["runs"].items():
        beam = int(key.rsplit("beam", 1)[1])
        run["speed_vs_torch"] = round(run["sentences_per_s"] / ours[beam]["sentences_per_s"], 3)
        run["bleu_vs_torch"] = round(run["bleu"] - ours[beam]["bleu"], 2)
    if ("ctranslate2-float32", 1) in outputs:
        result["parity"] = parity(outputs, ds, base)
        result["auto"] = {}
        for beam in (1, BEAM):
            opts = replace(base, beam=beam)
            pkg = load_package(work / f"{label}-ct2-float32", CPU)
            choice, speeds, cached = auto_choice(pkg, opts, CPU, work / "engine-cache")
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


def rss_kib(pid: int, key: str = "VmRSS") -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


async def post(session: Any, url: str, body: Any, raw: bool = False) -> tuple[int, float]:
    start = time.perf_counter()
    kwargs = {"data": body} if raw else {"json": body}
    async with session.post(url, **kwargs) as r:
        await r.read()
        return r.status, time.perf_counter() - start


async def load_level(url: str, sentences: list[str], clients: int, n: int, limit_s: float) -> dict:
    """``clients`` concurrent clients, each sending one sentence at a time, until ``n``
    requests were sent or ``limit_s`` passed."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    sent = 0
    start = time.perf_counter()

    async def client(session: Any) -> None:
        nonlocal errors, sent
        while sent < n and time.perf_counter() - start < limit_s:
            i = sent
            sent += 1
            try:
                status, seconds = await post(
                    session, url, {"text": [sentences[i % len(sentences)]]}
                )
            except aiohttp.ClientError:
                errors += 1
                continue
            if status == 200:
                latencies.append(seconds)
            else:
                errors += 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 4)  # noqa: E731
    return {
        "clients": clients,
        "requests": sent,
        "answered": len(latencies),
        "errors": errors,
        "seconds": round(elapsed, 3),
        "sentences_per_s": round(len(latencies) / elapsed, 2),
        "latency_p50_s": pick(0.5) if latencies else None,
        "latency_p99_s": pick(0.99) if latencies else None,
    }


def malformed_bodies() -> list[tuple[str, bytes]]:
    return [
        ("bad json", b'{"text": ['),
        ("invalid utf-8", b'{"text": ["\xff\xfe"]}'),
        ("wrong type", b'{"text": "Ein Hund."}'),
        ("numbers", b'{"text": [1, 2]}'),
        ("empty list", b'{"text": []}'),
        ("unknown key", b'{"text": ["a"], "x": 1}'),
        ("beam", b'{"text": ["a"], "beam": "5"}'),
        ("too many", json.dumps({"text": ["a"] * 1000}).encode()),
        ("huge body", b'{"text": ["' + b"a" * 2_000_000 + b'"]}'),
    ]


async def malformed(url: str, n: int) -> dict[str, Any]:
    import aiohttp

    bodies = malformed_bodies()
    statuses: dict[str, dict[str, int]] = {}
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            kind, body = bodies[i % len(bodies)]
            try:
                status, _ = await post(session, url, body, raw=True)
            except aiohttp.ClientError as e:
                status = f"error {type(e).__name__}"  # type: ignore[assignment]
            statuses.setdefault(kind, {}).setdefault(str(status), 0)
            statuses[kind][str(status)] += 1
        status, _ = await post(session, url, {"text": ["Ein Hund rennt."]})
    all_4xx = all(s.startswith("4") for kinds in statuses.values() for s in kinds)
    return {"sent": n, "statuses": statuses, "all_4xx": all_4xx, "then_serves": status == 200}


def bench_server(
    package: Path,
    engine: str,
    sentences: list[str],
    offline: float | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Start nmt-serve on ``package``, measure it, stop it with SIGTERM."""
    import urllib.request

    say(f"server, engine {engine}")
    cmd = [
        sys.executable, "-m", "nmt.serve", f"model={package}", f"engine={engine}", "port=0",
        f"threads={args.threads}",
    ]  # fmt: skip
    if args.fixed_length_all:  # the same fixed-length outputs as the offline figures
        n = args.fixed_length_all
        cmd += ["max_output_len_a=0", f"max_output_len_b={n}", f"min_output_len={n}"]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        line = proc.stdout.readline()
        port = int(line.rsplit(":", 1)[1])
        url = f"http://127.0.0.1:{port}/translate"
        request = urllib.request.Request(url, data=json.dumps({"text": [sentences[0]]}).encode())
        with urllib.request.urlopen(request, timeout=120) as r:
            r.read()
        first = time.perf_counter() - start
        before = rss_kib(proc.pid)
        levels = [
            asyncio.run(load_level(url, sentences, int(c), args.requests, args.level_seconds))
            for c in args.levels.split(",")
        ]
        after = rss_kib(proc.pid)
        bad = asyncio.run(malformed(url, args.malformed))
        result = {
            "engine": engine,
            "first_answer_after_start_s": round(first, 3),
            "rss_kib_after_first_answer": before,
            "rss_kib_after_load": after,
            "rss_peak_kib": rss_kib(proc.pid, "VmHWM"),
            "levels": levels,
            "offline_batched_sentences_per_s": offline,
            "malformed": bad,
        }
        if offline:
            for level in levels:
                level["vs_offline_batched"] = round(level["sentences_per_s"] / offline, 3)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    result["exit_code_after_sigterm"] = proc.returncode
    return result


# -------------------------------------------------------------------------------------- run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(0)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "date": datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(["python", "scripts/bench_serve.py", *(argv or sys.argv[1:])]),
        "machine": machine(),
        "threads": args.threads,
        "models": {},
    }
    models = [
        ("transformer", args.transformer, args.fixed_length_all or None, args.sentences),
        ("transformer_base", args.transformer_base, args.fixed_length, args.base_sentences),
        ("gru", args.gru, args.fixed_length_gru or args.fixed_length_all or None, args.sentences),
    ]
    for label, ckpt, fixed, limit in models:
        if ckpt:
            result["models"][label] = bench_model(label, ckpt, args, work, fixed, limit)
    if args.serve and args.transformer:
        trained = load_package(work / "transformer-torch", CPU)
        sentences = test_set(trained, args, args.sentences).src_text
        decode = trained.cfg.decode
        result["server"] = {
            "decode": {"beam": decode.beam, "length_penalty": decode.length_penalty}
        }
        runs = result["models"]["transformer"]["runs"]
        # each engine as it would be deployed: the fp32 package, the int8 CTranslate2-only one
        servers = (
            ("torch", "transformer-torch", "torch"),
            ("ctranslate2", "transformer-ct2-int8-only", "ctranslate2-int8"),
        )
        for engine, package, offline_key in servers:
            offline = runs.get(f"{offline_key}.beam{decode.beam}", {}).get("sentences_per_s")
            server = bench_server(work / package, engine, sentences, offline, args)
            result["server"][engine] = {"package": str(work / package), **server}
        torch_rss = result["server"]["torch"]["rss_kib_after_load"]
        ct2_rss = result["server"]["ctranslate2"]["rss_kib_after_load"]
        if torch_rss and ct2_rss:
            result["server"]["ctranslate2_rss_vs_torch"] = round(ct2_rss / torch_rss, 3)
    result["machine"]["load_average_end"] = load_average()
    out = Path(args.out or f"outputs/bench/bench-serve-{datetime.now():%Y-%m-%d-%H%M%S}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    say(f"wrote {out}")
    print(json.dumps(summary(result), indent=2))
    return 0


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
    for engine in ("torch", "ctranslate2"):
        server = result.get("server", {}).get(engine)
        if server:
            out[f"server {engine}"] = {
                "first answer s": server["first_answer_after_start_s"],
                "rss MiB": round((server["rss_kib_after_load"] or 0) / 1024, 1),
                "levels": {
                    lv["clients"]: f"{lv['sentences_per_s']} sent/s p99 {lv['latency_p99_s']}s "
                    f"errors {lv['errors']}"
                    for lv in server["levels"]
                },
                "malformed all 4xx": server["malformed"]["all_4xx"],
            }
    return out


if __name__ == "__main__":
    sys.exit(main())
