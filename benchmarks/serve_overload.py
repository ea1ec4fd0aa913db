"""The server past what it sustains, for ``make bench-serve --overload`` (:mod:`benchmarks.serve`).

On each engine's package, in one server process per measurement:

* the sustainable load: clients sending requests of ``OVERLOAD_SENTENCES`` sentences at more
  and more concurrent clients; the sustainable level is the fewest clients that reach 90 % of
  the best throughput (beyond it, more clients only wait longer), its request rate the rate
  the server sustains;
* overload: requests sent at 4x that rate (open loop: on a clock, whatever the answers), each
  client giving up at the server's ``request_timeout``: the share answered 200 within the
  deadline, the statuses, and the latency of the 503s;
* abandoned burst: ``--burst-clients`` clients each send 64 long sentences (four test
  sentences each) at beam 16 and give up after ``--burst-patience`` s; from the moment the
  last has gone, a one-sentence request at a time until one is answered at normal latency
  (twice the idle p50, at least 50 ms more than it): the seconds until the server is back at
  full speed, and /health as the clients left;
* A/B (``--ab-base DIR``, a checkout of the code before): the single-sentence load levels on
  this code and on that one, alternating A B A B, ``--ab-rounds`` times each, medians;
* setting A/B (``--setting-ab KEY=VALUE``, a server setting): the overload at 4x again, on
  this code with the setting (A) and without (B), alternating, ``--setting-rounds`` times each:
  medians of the 503s' and the probes' latencies and of the share answered in time.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.serve_load import load_level, say
from nmt.environment import child_environment

if TYPE_CHECKING:
    from benchmarks.serve import ServeSettings

OVERLOAD_SENTENCES = 8  # per request of the sustainable and overload phases
OVERLOAD_LEVELS = (1, 2, 4, 8, 16)


# the A side's package, exported by the A side's code: a package records its training config
# whole, and code from before a new config field refuses a config that has it
EXPORT_WITH_CODE = """
import sys
from pathlib import Path
from nmt.ship.export import export_package
ckpt, out, engine = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if engine == "torch":
    export_package(ckpt, out, fmt="torch")
else:
    export_package(ckpt, out, fmt="ctranslate2", quantize="int8", ctranslate2_only=True)
"""


def package_by(code: Path, ckpt: Path, engine: str, work: Path) -> Path:
    """The package for ``engine`` that the checkout ``code`` exports from ``ckpt``."""
    out = work / f"before-{engine}"
    if out.exists():
        shutil.rmtree(out)
    done = subprocess.run(
        [sys.executable, "-c", EXPORT_WITH_CODE, str(ckpt.resolve()), str(out.resolve()), engine],
        cwd=code, env=child_environment(PYTHONPATH=str(code)), capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the code in {code} could not export {ckpt}: {done.stderr[-2000:]}")
    return out


class Server:
    """``nmt-serve`` as a process, from this code or from the checkout ``code``."""

    def __init__(
        self,
        package: Path,
        engine: str,
        threads: int,
        cwd: Path,
        code: Path | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        env = child_environment(**({} if code is None else {"PYTHONPATH": str(code)}))
        cmd = [
            sys.executable, "-m", "nmt.serve", f"model={package.resolve()}", f"engine={engine}",
            "port=0",
            f"threads={threads}", *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=code or cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()
        if "nmt-serve:" not in line:
            self.proc.wait()
            raise RuntimeError(
                f"nmt-serve did not start ({' '.join(cmd)}): exit {self.proc.returncode}"
            )
        self.port = int(line.rsplit(":", 1)[1])
        self.health()  # answered: serving
        self.url = f"http://127.0.0.1:{self.port}{self.translate_path()}"

    def translate_path(self) -> str:
        """Our API's path: /v1/translate, or /translate in code from before LibreTranslate's
        API took that path."""
        probe = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/translate", data=b"{}", method="POST"
        )
        try:
            urllib.request.urlopen(probe, timeout=60).close()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return "/translate"
        return "/v1/translate"

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=60) as r:
            return json.loads(r.read())

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_: Any) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def post_status(session: Any, url: str, body: dict) -> str:
    """The status of one request as a string, or how the client failed ("gave up" when its
    timeout passed)."""
    import aiohttp

    try:
        async with session.post(url, json=body) as r:
            await r.read()
            return str(r.status)
    except asyncio.TimeoutError:
        return "gave up"
    except aiohttp.ClientError as e:
        return f"error {type(e).__name__}"


def pick(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


def sustainable(server: Server, sentences: list[str], beam: int, seconds: float) -> dict:
    levels = [
        asyncio.run(load_level(server.url, sentences, c, 10**9, seconds, beam, OVERLOAD_SENTENCES))
        for c in OVERLOAD_LEVELS
    ]
    best = max(lv["sentences_per_s"] for lv in levels)
    level = next(lv for lv in levels if lv["sentences_per_s"] >= 0.9 * best)
    rate = level["answered"] / level["seconds"]
    say(f"sustainable: {level['clients']} clients, {rate:.2f} requests/s")
    return {"levels": levels, "clients": level["clients"], "requests_per_s": round(rate, 3)}


async def open_loop(
    url: str, sentences: list[str], rate: float, seconds: float, beam: int, patience: float
) -> dict:
    """Requests sent every 1/``rate`` s for ``seconds``, each given up after ``patience`` s."""
    import aiohttp

    results: list[tuple[str, float]] = []
    timeout = aiohttp.ClientTimeout(total=patience)

    async def one(session: Any, i: int) -> None:
        text = [sentences[(i + j) % len(sentences)] for j in range(OVERLOAD_SENTENCES)]
        start = time.perf_counter()
        status = await post_status(session, url, {"text": text, "beam": beam})
        results.append((status, time.perf_counter() - start))

    probes: dict[str, list[float]] = {"/health": [], "/ready": []}
    probe_failures = 0
    base = url.rsplit("/", 1)[0]

    async def probe(session: Any, stop: asyncio.Event) -> None:
        """/health and /ready in turn while the load runs (a new connection each)."""
        nonlocal probe_failures
        while not stop.is_set():
            for path, times in probes.items():
                start = time.perf_counter()
                try:
                    async with session.get(base + path) as r:
                        await r.read()
                    times.append(time.perf_counter() - start)
                except (asyncio.TimeoutError, aiohttp.ClientError):
                    probe_failures += 1
            await asyncio.sleep(0.2)

    connector = aiohttp.TCPConnector(limit=0)
    # the clients share the machine's cores with the server: the cores they used are reported
    cpu, wall = time.process_time(), time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        stop = asyncio.Event()
        prober = asyncio.ensure_future(probe(session, stop))
        tasks, start, i = [], time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            tasks.append(asyncio.ensure_future(one(session, i)))
            i += 1
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        await asyncio.gather(*tasks)
        stop.set()
        await prober
    client_cores = (time.process_time() - cpu) / (time.perf_counter() - wall)
    statuses: dict[str, int] = {}
    for status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    ok = [t for status, t in results if status == "200"]
    busy = [t for status, t in results if status == "503"]
    return {
        "requests_per_s": round(rate, 3),
        "sent": len(results),
        "statuses": statuses,
        "answered_200_share": round(len(ok) / len(results), 3),
        "latency_200_p50_s": pick(ok, 0.5),
        "latency_200_p99_s": pick(ok, 0.99),
        "latency_503_p50_s": pick(busy, 0.5),
        "latency_503_p99_s": pick(busy, 0.99),
        "probes_while_loaded": {
            path: {"n": len(t), "p50_s": pick(t, 0.5), "p99_s": pick(t, 0.99), "max_s": max(t)}
            for path, t in probes.items()
            if t
        },
        "probes_failed": probe_failures,
        "load_generator_cores": round(client_cores, 3),  # its CPU seconds per second
    }


async def idle_latency(url: str, sentence: str, n: int = 20) -> float:
    import aiohttp

    times = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            start = time.perf_counter()
            async with session.post(url, json={"text": [sentence]}) as r:
                await r.read()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


async def burst(
    server: Server, sentences: list[str], clients: int, patience: float, cap: float
) -> dict:
    """Big requests given up after ``patience`` s, then the time until a one-sentence request
    is answered at normal latency again (at most ``cap`` s of probing)."""
    import aiohttp

    normal = await idle_latency(server.url, sentences[0])
    bound = max(2 * normal, normal + 0.05)
    long = " ".join(sentences[:4])  # four test sentences in one
    statuses: dict[str, int] = {}

    async def big(session: Any) -> None:
        status = await post_status(session, server.url, {"text": [long] * 64, "beam": 16})
        statuses[status] = statuses.get(status, 0) + 1

    timeout = aiohttp.ClientTimeout(total=patience)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:
        await asyncio.gather(*(big(session) for _ in range(clients)))
    gone = time.perf_counter()
    await asyncio.sleep(0.2)  # the server sees the connections close
    after = await asyncio.to_thread(server.health)
    probes: list[float] = []
    recovered = None
    probe_timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=probe_timeout) as session:
        while time.perf_counter() - gone < cap:
            start = time.perf_counter()
            try:
                async with session.post(server.url, json={"text": [sentences[1]]}) as r:
                    await r.read()
                    ok = r.status == 200
            except (asyncio.TimeoutError, aiohttp.ClientError):
                ok = False
            seconds = time.perf_counter() - start
            probes.append(round(seconds, 3))
            if ok and seconds <= bound:
                recovered = time.perf_counter() - gone
                break
            await asyncio.sleep(0.1)
    later = await asyncio.to_thread(server.health)
    return {
        "clients": clients,
        "sentences_per_request": 64,
        "sentence_chars": len(long),
        "beam": 16,
        "patience_s": patience,
        "statuses": statuses,
        "normal_latency_s": round(normal, 4),
        "recovered_bound_s": round(bound, 4),
        "health_after_clients_left": {
            k: after.get(k) for k in ("in_flight", "queued", "queued_sentences", "cancelled")
        },
        "seconds_to_normal_latency": None if recovered is None else round(recovered, 2),
        "probing_cap_s": cap,
        "probes": len(probes),
        "probe_latencies_s": probes[:20],
        "sentences_decoded_by_then": later.get("sentences"),
    }


def overload_engine(
    package: Path, engine: str, sentences: list[str], beam: int, s: Any, before: Path | None
) -> dict:
    say(f"overload, engine {engine}")
    deadline = (f"request_timeout={s.patience}",)  # the server's deadline is the clients'
    with Server(package, engine, s.threads, s.cwd, extra=deadline) as server:
        found = sustainable(server, sentences, beam, s.overload_seconds / 2)
    with Server(package, engine, s.threads, s.cwd, extra=deadline) as server:
        rate = 4 * found["requests_per_s"]
        say(f"overload: {rate:.2f} requests/s for {s.overload_seconds:g}s")
        over = asyncio.run(
            open_loop(server.url, sentences, rate, s.overload_seconds, beam, s.patience)
        )
        over["health_after"] = server.health()
    result = {"sustainable": found, "overload_4x": over}
    with Server(package, engine, s.threads, s.cwd, extra=deadline) as server:
        result["abandoned_burst"] = asyncio.run(
            burst(server, sentences, s.burst_clients, s.burst_patience, s.recovery_cap)
        )
    if before is not None:
        with Server(before, engine, s.threads, s.cwd, Path(s.ab_base)) as server:
            result["abandoned_burst_before"] = asyncio.run(
                burst(server, sentences, s.burst_clients, s.burst_patience, s.recovery_cap)
            )
    return result


# the figures of an overload run compared by the setting A/B (medians over its rounds)
SETTING_FIGURES = (
    "answered_200_share",
    "latency_503_p50_s",
    "latency_503_p99_s",
    "load_generator_cores",
)


def setting_ab(
    package: Path, engine: str, sentences: list[str], beam: int, s: Any, rate: float
) -> dict:
    """The overload at ``rate`` with ``s.setting_ab`` given to the server (A) and without (B),
    alternating A B, ``s.setting_rounds`` times each."""
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    levels: dict[str, list[list[dict]]] = {"A": [], "B": []}
    deadline = f"request_timeout={s.patience}"
    for r in range(s.setting_rounds):
        for side, extra in (("A", (deadline, s.setting_ab)), ("B", (deadline,))):
            say(f"setting A/B {engine}: round {r + 1}, {side}")
            with Server(package, engine, s.threads, s.cwd, extra=extra) as server:
                runs[side].append(
                    asyncio.run(
                        open_loop(server.url, sentences, rate, s.overload_seconds, beam, s.patience)
                    )
                )
            if s.setting_levels:
                with Server(package, engine, s.threads, s.cwd, extra=extra) as server:
                    url, n, limit = server.url, s.requests, s.level_seconds
                    levels[side].append(
                        [
                            asyncio.run(load_level(url, sentences, c, n, limit, beam))
                            for c in s.clients
                        ]
                    )
    medians: dict[str, dict[str, float | None]] = {}
    for side, rounds in runs.items():
        figures = {k: [r[k] for r in rounds if r[k] is not None] for k in SETTING_FIGURES}
        for path in ("/health", "/ready"):
            for key in ("p99_s", "max_s"):
                figures[f"{path} {key}"] = [
                    r["probes_while_loaded"][path][key]
                    for r in rounds
                    if path in r["probes_while_loaded"]
                ]
        medians[side] = {k: statistics.median(v) if v else None for k, v in figures.items()}
    result = {"A": s.setting_ab, "B": "the default", "rate": rate, "runs": runs, "medians": medians}
    if s.setting_levels:
        result["levels"] = levels
        result["level_medians"] = level_medians(levels, s.clients)
    return result


def level_medians(runs: dict[str, list[list[dict]]], clients: list[int]) -> dict:
    """Per side and load level, the medians over the rounds of throughput and latency."""
    return {
        side: {
            f"{c}_clients": {
                key: statistics.median(rnd[i][key] for rnd in rounds)
                for key in ("sentences_per_s", "latency_p50_s", "latency_p99_s")
            }
            for i, c in enumerate(clients)
        }
        for side, rounds in runs.items()
    }


def ab_levels(
    package: Path, engine: str, sentences: list[str], beam: int, s: Any, before: Path
) -> dict:
    """Single-sentence load levels on this code (B) and on ``s.ab_base`` (A), alternating, each
    on the package its own code exported (``before`` for A)."""
    runs: dict[str, list[list[dict]]] = {"A": [], "B": []}
    for r in range(s.ab_rounds):
        for side, code, served in (("A", Path(s.ab_base), before), ("B", None, package)):
            say(f"A/B {engine}: round {r + 1}, {side}")
            with Server(served, engine, s.threads, s.cwd, code) as server:
                runs[side].append(
                    [
                        asyncio.run(
                            load_level(server.url, sentences, c, s.requests, s.level_seconds, beam)
                        )
                        for c in s.clients
                    ]
                )
    medians = level_medians(runs, s.clients)
    return {"A": str(s.ab_base), "B": "this code", "beam": beam, "runs": runs, "medians": medians}


def run_overload(
    s: ServeSettings, packages: dict[str, Path], sentences: list[str], beam: int, ckpt: Path
):
    out: dict[str, Any] = {}
    for engine, package in packages.items():
        before = None
        if s.ab_base:
            before = package_by(Path(s.ab_base), ckpt, engine, package.parent)
        out[engine] = overload_engine(package, engine, sentences, beam, s, before)
        if s.setting_ab:
            rate = out[engine]["overload_4x"]["requests_per_s"]
            out[engine]["setting_ab"] = setting_ab(package, engine, sentences, beam, s, rate)
        if before is not None:
            out[engine]["ab"] = ab_levels(package, engine, sentences, beam, s, before)
    return out
