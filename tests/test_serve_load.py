"""``nmt-serve`` under overload: a bounded queue (503 with Retry-After), a deadline per request
(504), requests whose client goes away leave the queue undecoded, /health and /ready answer
while the decoder is busy, big requests are tokenized off the event loop, and /metrics."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from nmt.config import ConfigError
from nmt.data.tokenizer import Tokenizer
from nmt.decode.options import DecodeOptions
from nmt.serve.app import make_app
from nmt.serve.backend import load_backend
from nmt.serve.main import check_config

from .helpers import REPO
from .test_serve import SENTENCES, get, package, run_app, serve_config, until

__all__ = ["package"]  # the module's fixture: a tiny trained package
pytestmark = pytest.mark.usefixtures("one_thread")


class HeldBackend:
    """The torch backend of the package, whose first decode waits for ``release``; ``calls``
    has the number of sentences of each decode."""

    def __init__(self, package: Path, *extra: str) -> None:
        self.cfg = serve_config(package, "engine=torch", *extra)
        backend = load_backend(self.cfg)
        self.calls: list[int] = []
        self.release = threading.Event()
        real = backend.decode

        def decode(sources: list[list[int]], opts: DecodeOptions, attention: bool) -> list:
            self.calls.append(len(sources))
            if len(self.calls) == 1:
                self.release.wait(60)
            return real(sources, opts, attention)

        self.backend = replace(backend, decode=decode)

    async def decoding(self) -> bool:
        return len(self.calls) == 1


def metric_values(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, from Prometheus' text format."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(client: TestClient) -> dict[tuple[str, tuple], float]:
    response = await client.get("/metrics")
    assert response.status == 200 and response.content_type == "text/plain"
    return metric_values(await response.text())


def post(client: TestClient, text: list[str], **extra: Any) -> asyncio.Future:
    return asyncio.ensure_future(client.post("/v1/translate", json={"text": text, **extra}))


def test_a_full_queue_answers_503_with_retry_after_while_the_decoder_is_busy(
    package: Path,
) -> None:
    held = HeldBackend(package, "max_queued_sentences=4")
    app = make_app(held.backend, held.cfg)

    async def scenario(client: TestClient) -> None:
        first = post(client, SENTENCES[:1])
        await until(held.decoding, "the first request is being decoded")
        queued = [post(client, SENTENCES[:2]), post(client, SENTENCES[1:3])]

        async def full() -> bool:
            return (await (await client.get("/health")).json())["queued_sentences"] == 4

        await until(full, "four sentences wait")
        # the decoder is held: /health, /ready and /metrics still answer
        ready = await client.get("/ready")
        assert ready.status == 503 and "queue is full" in (await ready.json())["reason"]
        refused = await client.post("/v1/translate", json={"text": SENTENCES[:1]})
        assert refused.status == 503, await refused.text()
        assert int(refused.headers["Retry-After"]) >= 1
        assert "busy" in (await refused.json())["error"]
        assert (await scrape(client))[
            ("nmt_rejected_requests_total", (("reason", "overloaded"),))
        ] == 1
        held.release.set()
        responses = [await r for r in (first, *queued)]
        assert [r.status for r in responses] == [200] * 3
        assert held.calls == [1, 4]  # the refused request was never decoded
        ready = await client.get("/ready")
        assert ready.status == 200 and (await ready.json()) == {"status": "ready"}

    run_app(app, scenario)


def test_a_request_past_its_deadline_gets_504_and_is_never_decoded(package: Path) -> None:
    held = HeldBackend(package, "request_timeout=2")
    app = make_app(held.backend, held.cfg)

    async def scenario(client: TestClient) -> None:
        first = post(client, SENTENCES[:1])
        await until(held.decoding, "the first request is being decoded")
        late = await client.post("/v1/translate", json={"text": SENTENCES})  # waits 2 s, then 504
        assert late.status == 504, await late.text()
        assert "request_timeout=2" in (await late.json())["error"]
        assert (await first).status == 504  # its decode is still running
        health = await (await client.get("/health")).json()
        assert health["queued"] == 0 and health["cancelled"] == 1
        held.release.set()
        after = await client.post("/v1/translate", json={"text": SENTENCES[:2]})
        assert after.status == 200, await after.text()
        assert held.calls == [1, 2]  # the three sentences of the late request: never
        values = await scrape(client)
        assert values[("nmt_cancelled_requests_total", (("reason", "deadline"),))] == 1
        assert values[("nmt_rejected_requests_total", (("reason", "deadline"),))] == 2

    run_app(app, scenario)


def test_a_client_that_goes_away_leaves_the_queue(package: Path) -> None:
    held = HeldBackend(package)
    app = make_app(held.backend, held.cfg)

    async def scenario(client: TestClient) -> None:
        first = post(client, SENTENCES[:1])
        await until(held.decoding, "the first request is being decoded")
        gone = post(client, SENTENCES)

        async def queued(n: int) -> bool:
            return (await (await client.get("/health")).json())["queued"] == n

        await until(lambda: queued(1), "the second request waits")
        gone.cancel()  # the client closes its connection
        await until(lambda: queued(0), "the second request left the queue")
        held.release.set()
        assert (await first).status == 200
        assert (await client.post("/v1/translate", json={"text": SENTENCES[:2]})).status == 200
        assert held.calls == [1, 2]
        values = await scrape(client)
        assert values[("nmt_cancelled_requests_total", (("reason", "disconnected"),))] == 1
        gone = ("nmt_http_requests_total", (("endpoint", "/v1/translate"), ("status", "499")))
        assert values[gone]

    run_app(app, scenario)


def test_big_requests_are_tokenized_and_answered_off_the_event_loop(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 long sentences take milliseconds to tokenize, and their attention weights far more to
    write: that work runs on a thread of its own, and the event loop goes on answering."""
    threads: dict[str, set[str]] = {"encode": set(), "decode": set()}
    encode, decode = Tokenizer.encode_batch, Tokenizer.decode

    def encode_batch(self: Tokenizer, texts: Any, num_threads: int | None = None) -> Any:
        threads["encode"].add(threading.current_thread().name)
        return encode(self, texts, num_threads)

    def decode_text(self: Tokenizer, ids: Any) -> str:
        threads["decode"].add(threading.current_thread().name)
        return decode(self, ids)

    monkeypatch.setattr(Tokenizer, "encode_batch", encode_batch)
    monkeypatch.setattr(Tokenizer, "decode", decode_text)
    cfg = serve_config(package, "engine=torch")
    app = make_app(load_backend(cfg), cfg)
    long = " ".join(SENTENCES * 6)

    async def scenario(client: TestClient) -> None:
        big = await client.post("/v1/translate", json={"text": [long] * 64, "attention": True})
        assert big.status == 200 and len((await big.json())["attention"]) == 64
        small = await client.post("/v1/translate", json={"text": SENTENCES[:1]})
        assert small.status == 200

    run_app(app, scenario)
    loop_thread = threading.main_thread().name
    assert loop_thread in threads["encode"] and loop_thread in threads["decode"]  # the small
    assert any(t.startswith("nmt-text") for t in threads["encode"])  # the big one
    assert any(t.startswith("nmt-text") for t in threads["decode"])


@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_metrics_count_requests_sentences_and_batches(package: Path, engine: str) -> None:
    cfg = serve_config(package, f"engine={engine}")
    app = make_app(load_backend(cfg), cfg)

    async def scenario(client: TestClient) -> None:
        before = await scrape(client)
        assert before[("nmt_sentences_total", ())] == 0
        for n in (1, 2, 3):
            assert (await client.post("/v1/translate", json={"text": SENTENCES[:n]})).status == 200
        assert (await client.post("/v1/translate", data=b"{")).status == 400
        values = await scrape(client)
        ok = ("nmt_http_requests_total", (("endpoint", "/v1/translate"), ("status", "200")))
        assert values[ok] == 3
        assert values[("nmt_rejected_requests_total", (("reason", "invalid"),))] == 1
        assert values[("nmt_sentences_total", ())] == 6
        assert values[("nmt_batch_sentences_count", ())] == 3
        assert values[("nmt_batch_sentences_sum", ())] == 6
        assert values[("nmt_decode_seconds_count", ())] == 3
        latency = ("nmt_http_request_seconds_count", (("endpoint", "/v1/translate"),))
        assert values[latency] == 4
        assert values[("nmt_queued_sentences", ())] == 0
        metrics = ("nmt_http_requests_total", (("endpoint", "/metrics"), ("status", "200")))
        assert values[metrics] == 1  # the first scrape
        assert ("nmt_http_requests_total", (("endpoint", "other"), ("status", "404"))) not in values
        await client.get("/nothing/at/all")
        assert (await scrape(client))[
            ("nmt_http_requests_total", (("endpoint", "other"), ("status", "404")))
        ] == 1

    run_app(app, scenario)


def test_the_queue_must_hold_the_largest_request(package: Path) -> None:
    check_config(serve_config(package))
    for extra, words in (
        (["max_queued_sentences=10"], "max_queued_sentences=10 must be >= max_sentences=64"),
        (["request_timeout=0"], "request_timeout=0"),
        (["max_queued_sentences=0"], "max_queued_sentences=0 must be >= 1"),
        (["max_segments=0"], "max_segments=0 must be >= 1"),
    ):
        with pytest.raises(ConfigError, match=words):
            check_config(serve_config(package, *extra))


# ------------------------------------------------------------------------- the process

# nmt-serve whose first decode waits until a file exists: the real process, with the real
# aiohttp runner and sockets, and a decoder that is busy for as long as the test wants
HELD_SERVER = """
import dataclasses, sys, time
from pathlib import Path
import nmt.serve.backend as backend_module
from nmt.serve.main import main

gate, load = Path(sys.argv[1]), backend_module.load_backend

def held_load(cfg):
    backend = load(cfg)
    decode = backend.decode

    def held(sources, opts, attention):
        gate.with_suffix(".started").touch()  # the decode has begun: what it holds is set
        while not gate.exists():
            time.sleep(0.01)
        return decode(sources, opts, attention)

    return dataclasses.replace(backend, decode=held)

backend_module.load_backend = held_load
main(sys.argv[2:])
"""


def start_held_server(package: Path, gate: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", HELD_SERVER, str(gate), f"model={package}", "port=0", *extra]
    fd, name = tempfile.mkstemp(suffix=".log", dir=package.parent)
    with os.fdopen(fd, "w") as err:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
    proc.log = Path(name)  # type: ignore[attr-defined]
    line = proc.stdout.readline()
    assert "nmt-serve:" in line, line + Path(name).read_text()
    return proc, int(line.rsplit(":", 1)[1])


def raw_post(port: int, body: dict) -> socket.socket:
    """A /v1/translate request sent on a socket of its own, its answer not read."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def wait_for(port: int, check: Any, what: str) -> dict:
    for _ in range(3000):
        health = get(port, "/health")
        if check(health):
            return health
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}: {health}")


def test_a_disconnected_clients_sentences_are_never_decoded_by_the_server_process(
    package: Path, tmp_path: Path
) -> None:
    """Through real sockets: while the decoder is busy, a client sends 3 sentences and closes
    its connection; they leave the queue, and only the other requests' sentences are decoded.
    /health, /ready and /metrics answer all along (and the process has no PyTorch)."""
    gate = tmp_path / "release"
    proc, port = start_held_server(package, gate, "engine=ctranslate2", "threads=1")
    try:
        busy = raw_post(port, {"text": SENTENCES[:1]})
        started = gate.with_suffix(".started")
        wait_for(port, lambda h: started.exists() and h["queued"] == 0, "the first decodes")
        gone = raw_post(port, {"text": SENTENCES})
        wait_for(port, lambda h: h["queued"] == 1, "the second request waits")
        with urllib_get(port, "/ready") as ready:
            assert ready.status == 200  # the queue has room
        gone.close()
        health = wait_for(port, lambda h: h["queued"] == 0, "the closed request left the queue")
        assert health["cancelled"] == 1 and health["pytorch_loaded"] is False
        gate.touch()
        answer = busy.makefile("rb").readline()
        assert b"200 OK" in answer, answer
        busy.close()
        second = raw_post(port, {"text": SENTENCES[:2]})
        assert b"200 OK" in second.makefile("rb").readline()
        second.close()
        health = wait_for(port, lambda h: h["sentences"] == 3, "the other requests decoded")
        assert health["batches"] == 2  # 1 + 2 sentences: never the closed request's 3
        with urllib_get(port, "/metrics") as response:
            values = metric_values(response.read().decode())
        assert values[("nmt_cancelled_requests_total", (("reason", "disconnected"),))] == 1
        assert values[("nmt_sentences_total", ())] == 3
        proc.terminate()
        proc.communicate(timeout=60)
        assert proc.returncode == 0, proc.log.read_text()  # type: ignore[attr-defined]
    finally:
        if proc.poll() is None:
            proc.kill()


def urllib_get(port: int, path: str) -> Any:
    import urllib.error
    import urllib.request

    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60)
    except urllib.error.HTTPError as e:
        return e


def test_a_running_decode_drops_the_rest_of_a_request_whose_client_went_away(
    package: Path,
) -> None:
    """32 sentences at beam 16 decode in calls of DECODE_ROWS // 16 = 16: the client goes away
    during the first call, and the second is never made."""
    held = HeldBackend(package)
    app = make_app(held.backend, held.cfg)

    async def scenario(client: TestClient) -> None:
        gone = post(client, (SENTENCES * 11)[:32], beam=16)
        await until(held.decoding, "the first call decodes")
        gone.cancel()

        async def cancelled() -> bool:
            return (await (await client.get("/health")).json())["in_flight"] == 0

        await until(cancelled, "the request was cancelled")
        held.release.set()
        assert (await client.post("/v1/translate", json={"text": SENTENCES[:2]})).status == 200
        assert held.calls == [16, 2]

    run_app(app, scenario)
