"""The server under load, for ``make bench-serve`` (:mod:`benchmarks.serve`): ``nmt-serve`` started
as a process, its resident memory, levels of concurrent clients, and malformed requests."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.memory import descendants, rss
from benchmarks.report import say as _say

if TYPE_CHECKING:
    from benchmarks.serve import ServeSettings


def rss_kib(pid: int, peak: bool = False) -> int | None:
    """Resident memory of a server in KiB, now or at its peak (None once it is gone): summed
    over its process and the processes it started (our search decodes in one of its own).
    Pages they share (Python's libraries) count once per process; a peak is the sum of each
    process's own peak."""
    if not rss(pid)[0]:
        return None
    total = 0
    for p in descendants(pid):
        now, high = rss(p)
        total += high if peak else now
    return total // 1024


async def post(session: Any, url: str, body: Any, raw: bool = False) -> tuple[int, float]:
    start = time.perf_counter()
    kwargs = {"data": body} if raw else {"json": body}
    async with session.post(url, **kwargs) as r:
        await r.read()
        return r.status, time.perf_counter() - start


async def load_level(
    url: str,
    sentences: list[str],
    clients: int,
    n: int,
    limit_s: float,
    beam: int,
    per_request: int = 1,
) -> dict:
    """``clients`` concurrent clients, each sending ``per_request`` sentences at a time (search
    ``beam``), until ``n`` requests were sent or ``limit_s`` passed. Throughput and latency
    count sentences and requests."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    sent = 0
    start = time.perf_counter()

    async def client(session: Any) -> None:
        nonlocal errors, sent
        while sent < n and time.perf_counter() - start < limit_s:
            i = sent * per_request
            sent += 1
            text = [sentences[j % len(sentences)] for j in range(i, i + per_request)]
            try:
                status, seconds = await post(session, url, {"text": text, "beam": beam})
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
        "beam": beam,
        "clients": clients,
        "sentences_per_request": per_request,
        "requests": sent,
        "answered": len(latencies),
        "errors": errors,
        "seconds": round(elapsed, 3),
        "sentences_per_s": round(len(latencies) * per_request / elapsed, 2),
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
    offline: dict[int, float | None],
    s: ServeSettings,
    in_batches: dict[str, dict[int, float]] | None = None,
) -> dict[str, Any]:
    """Start nmt-serve on ``package``, measure it (each search of ``offline``: beam -> the
    engine's offline batched sentences/s; ``in_batches``: "in_batches_of_N" and
    "in_length_sorted_batches_of_N", N the largest level's clients -> beam ->
    :func:`batches_of`), stop it with SIGTERM."""
    import urllib.request

    say(f"server, engine {engine}")
    cmd = [
        sys.executable, "-m", "nmt.serve", f"model={package}", f"engine={engine}", "port=0",
        f"threads={s.threads}",
    ]  # fmt: skip
    if s.fixed_length_all:  # the same fixed-length outputs as the offline figures
        n = s.fixed_length_all
        cmd += ["max_output_len_a=0", f"max_output_len_b={n}", f"min_output_len={n}"]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=s.cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        line = proc.stdout.readline()
        port = int(line.rsplit(":", 1)[1])
        url = f"http://127.0.0.1:{port}/v1/translate"  # our API
        request = urllib.request.Request(url, data=json.dumps({"text": [sentences[0]]}).encode())
        with urllib.request.urlopen(request, timeout=120) as r:
            r.read()
        first = time.perf_counter() - start
        before = rss_kib(proc.pid)
        most = max(s.clients)
        shapes = [(c, 1) for c in s.clients]
        if s.per_request > 1:
            shapes.append((most, s.per_request))
        levels = [
            asyncio.run(
                load_level(url, sentences, clients, s.requests, s.level_seconds, beam, size)
            )
            for beam in offline
            for clients, size in shapes
        ]
        after = rss_kib(proc.pid)
        bad = asyncio.run(malformed(url, s.malformed))
        result = {
            "engine": engine,
            "first_answer_after_start_s": round(first, 3),
            "rss_kib_after_first_answer": before,
            "rss_kib_after_load": after,
            "rss_peak_kib": rss_kib(proc.pid, peak=True),
            "levels": levels,
            "offline_batched_sentences_per_s": {f"beam{b}": v for b, v in offline.items()},
            "malformed": bad,
        }
        for name, figures in (in_batches or {}).items():
            result[f"offline_{name}_sentences_per_s"] = {f"beam{b}": v for b, v in figures.items()}
        for level in levels:
            if offline[level["beam"]]:
                level["vs_offline_batched"] = round(
                    level["sentences_per_s"] / offline[level["beam"]], 3
                )
            if (level["clients"], level["sentences_per_request"]) == (most, 1):
                for name, figures in (in_batches or {}).items():
                    level[f"vs_offline_{name}"] = round(
                        level["sentences_per_s"] / figures[level["beam"]], 3
                    )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    result["exit_code_after_sigterm"] = proc.returncode
    return result


def say(msg: str) -> None:
    """Progress on stderr."""
    _say("bench-serve", msg)
