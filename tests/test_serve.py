"""``nmt-serve``: real requests, batching of concurrent ones (shown by counters), a 4xx with a
message for each kind of malformed request, and a graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from aiohttp.test_utils import TestClient

from nmt.config import ConfigError
from nmt.decode.options import DecodeOptions
from nmt.decode.translate import translate_lines
from nmt.serve.app import make_app
from nmt.serve.backend import load_backend
from nmt.store.loading import load_package

from .serving import (
    SENTENCES,
    decoding_process,
    fake_ct2_gpus,
    get,
    post,
    run_app,
    serve_config,
    server_log,
    start_server,
    stop_server,
    until,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def package(serve_package: Path) -> Path:
    return serve_package


@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_a_real_request_is_translated_as_nmt_translate_does(package: Path, engine: str) -> None:
    backend = load_backend(serve_config(package, f"engine={engine}"))
    assert backend.engine == engine
    trained = load_package(package, torch.device("cpu"))
    expected = translate_lines(trained, SENTENCES, DecodeOptions(beam=2), torch.device("cpu"), 2)

    async def scenario(client: TestClient) -> None:
        response = await client.post(
            "/v1/translate", json={"text": SENTENCES, "beam": 2, "n_best": 2, "attention": True}
        )
        assert response.status == 200, await response.text()
        body = await response.json()
        assert body["translations"] == [r[0][0] for r in expected]
        assert [[h["text"] for h in n] for n in body["n_best"]] == [
            [t for t, _ in r] for r in expected
        ]
        for att in body["attention"]:
            assert att["source"][-1] == "</s>"
            assert len(att["weights"]) == len(att["target"])  # one row per output token
            for row in att["weights"]:
                assert len(row) == len(att["source"]) and abs(sum(row) - 1) < 1e-3
        health = await (await client.get("/health")).json()
        assert health["engine"] == engine and health["requests"] == 1

    run_app(make_app(backend, serve_config(package)), scenario)


def test_concurrent_requests_share_one_decode(package: Path) -> None:
    """While the model decodes a first request, three more arrive: they make one batch."""
    cfg = serve_config(package, "engine=torch")
    backend = load_backend(cfg)
    decode, calls, release = backend.decode, [], threading.Event()

    def held_decode(sources: list[list[int]], opts: DecodeOptions, attention: bool) -> list:
        calls.append(len(sources))
        if len(calls) == 1:
            release.wait(60)  # the first decode lasts until the others are queued
        return decode(sources, opts, attention)

    app = make_app(replace(backend, decode=held_decode), cfg)

    async def health(client: TestClient) -> dict:
        return await (await client.get("/health")).json()

    async def scenario(client: TestClient) -> None:
        first = asyncio.ensure_future(client.post("/v1/translate", json={"text": SENTENCES[:1]}))

        async def decoding() -> bool:
            return len(calls) == 1

        await until(decoding, "the first request is being decoded")
        others = [
            asyncio.ensure_future(client.post("/v1/translate", json={"text": SENTENCES[i : i + 2]}))
            for i in range(3)
        ]

        async def queued() -> bool:
            return (await health(client))["queued"] == 3

        await until(queued, "three requests wait")
        release.set()
        responses = [await r for r in (first, *others)]
        bodies = [await r.json() for r in responses]
        assert [r.status for r in responses] == [200] * 4
        assert [len(b["translations"]) for b in bodies] == [1, 2, 2, 1]
        state = await health(client)
        assert calls == [1, 5] and state["batches"] == 2 and state["sentences"] == 6
        # each request got its own sentences back
        alone = await (await client.post("/v1/translate", json={"text": SENTENCES[1:3]})).json()
        assert bodies[2]["translations"] == alone["translations"]

    run_app(app, scenario)


def test_a_backend_with_two_workers_runs_two_decodes_at_once(package: Path) -> None:
    """concurrency 2 (CTranslate2's workers): a request that comes while one decode runs
    starts a second one at once; requests that come while both run wait for a free one."""
    cfg = serve_config(package, "engine=torch")
    backend = load_backend(cfg)
    decode, calls, release = backend.decode, [], threading.Event()

    def held_decode(sources: list[list[int]], opts: DecodeOptions, attention: bool) -> list:
        calls.append(len(sources))
        if len(calls) <= 2:
            release.wait(60)  # the first two decodes last until the others are queued
        return decode(sources, opts, attention)

    app = make_app(replace(backend, decode=held_decode, concurrency=2), cfg)

    async def health(client: TestClient) -> dict:
        return await (await client.get("/health")).json()

    def post(client: TestClient, i: int) -> asyncio.Future:
        return asyncio.ensure_future(client.post("/v1/translate", json={"text": SENTENCES[i:]}))

    async def scenario(client: TestClient) -> None:
        first = post(client, 2)

        async def decodes(n: int) -> bool:
            return len(calls) == n

        await until(lambda: decodes(1), "the first request is being decoded")
        second = post(client, 1)
        await until(lambda: decodes(2), "the second request is decoded beside the first")
        others = [post(client, 0), post(client, 2)]

        async def queued() -> bool:
            return (await health(client))["queued"] == 2

        await until(queued, "two requests wait")
        release.set()
        responses = [await r for r in (first, second, *others)]
        assert [r.status for r in responses] == [200] * 4
        bodies = [await r.json() for r in responses]
        assert [len(b["translations"]) for b in bodies] == [1, 2, 3, 1]
        # then they took the two free decodes, each its share, or one decode
        assert calls[:2] == [1, 2] and sum(calls[2:]) == 4
        assert (await health(client))["batches"] == len(calls)

    run_app(app, scenario)


def test_the_ctranslate2_backend_turns_mkls_memory_pool_off(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Intel MKL's pool would keep the memory of the largest batches for the server's life: the
    CTranslate2 backend sets MKL_DISABLE_FAST_MM (before CTranslate2 loads, in a server)."""
    monkeypatch.delenv("MKL_DISABLE_FAST_MM", raising=False)
    assert load_backend(serve_config(package, "engine=ctranslate2")).engine == "ctranslate2"
    assert os.environ["MKL_DISABLE_FAST_MM"] == "1"


@pytest.mark.parametrize(
    ("device", "gpus", "expected"),
    [("auto", 1, ("cuda", 0)), ("auto", 0, ("cpu", 0)), ("cuda", 2, ("cuda", 0)),
     ("cuda:1", 2, ("cuda", 1)), ("cpu", 2, ("cpu", 0))],
)  # fmt: skip
def test_the_ct2_backend_decodes_on_the_device_it_is_given(
    package: Path, monkeypatch: pytest.MonkeyPatch, device: str, gpus: int, expected: tuple
) -> None:
    """``auto`` is a GPU when CTranslate2 sees one, ``cuda:N`` is GPU N (without PyTorch)."""
    seen = fake_ct2_gpus(monkeypatch, gpus)
    backend = load_backend(serve_config(package, "engine=ctranslate2", f"device={device}"))
    assert (seen["device"], seen["device_index"]) == expected
    assert backend.engine == "ctranslate2"


def test_the_ct2_backend_refuses_a_gpu_ctranslate2_does_not_see(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_ct2_gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match=r"device='cuda:1', but CTranslate2 sees 1 CUDA"):
        load_backend(serve_config(package, "engine=ctranslate2", "device=cuda:1"))


def malformed_requests(limit: int) -> list[tuple[str, bytes, int, str]]:
    """(kind, body, expected status, words of the message)."""
    big = json.dumps({"text": ["x" * 50] * 200}).encode()
    return [
        ("bad json", b'{"text": [', 400, "not valid JSON"),
        ("invalid utf-8", b'{"text": ["\xff\xfe"]}', 400, "not valid UTF-8"),
        ("not an object", b'["Ein Hund."]', 400, "JSON object"),
        ("text missing", b'{"beam": 2}', 400, "'text' is missing"),
        ("text not a list", b'{"text": "Ein Hund."}', 400, "list of strings"),
        ("numbers", b'{"text": [1, 2]}', 400, "list of strings"),
        ("empty list", b'{"text": []}', 400, "empty"),
        ("unknown key", b'{"text": ["a"], "exec": "rm"}', 400, "unknown key"),
        ("beam string", b'{"text": ["a"], "beam": "5"}', 400, "'beam' must be an integer"),
        ("beam zero", b'{"text": ["a"], "beam": 0}', 400, "between 1"),
        ("beam huge", b'{"text": ["a"], "beam": 1000}', 400, "between 1"),
        ("n_best > beam", b'{"text": ["a"], "beam": 2, "n_best": 3}', 400, "'n_best'=3"),
        ("penalty", b'{"text": ["a"], "length_penalty": "x"}', 400, "length_penalty"),
        ("attention", b'{"text": ["a"], "attention": 1}', 400, "true or false"),
        ("too many", json.dumps({"text": ["a"] * 65}).encode(), 413, "at most 64"),
        ("too long", json.dumps({"text": ["a" * 1001]}).encode(), 413, "at most 1000"),
        ("huge body", big, 413, f"at most {limit}"),
    ]


def test_each_malformed_request_gets_a_4xx_with_a_message(package: Path) -> None:
    cfg = serve_config(package, "engine=torch", "max_body_bytes=4000")
    app = make_app(load_backend(cfg), cfg)
    cases = malformed_requests(4000)

    async def chunks(data: bytes):  # a body without Content-Length: only reading finds its size
        for start in range(0, len(data), 1000):
            yield data[start : start + 1000]

    async def scenario(client: TestClient) -> None:
        for kind, body, status, words in cases:
            response = await client.post("/v1/translate", data=body)
            assert response.status == status, (kind, await response.text())
            assert words in (await response.json())["error"], kind
        response = await client.post("/v1/translate", data=chunks(cases[-1][1]))
        assert response.status == 413 and "larger than 4000" in (await response.json())["error"]
        assert (await client.get("/translate")).status == 405
        assert (await client.get("/nothing")).status == 404
        good = await client.post("/v1/translate", json={"text": ["Ein Hund."]})
        assert good.status == 200  # still serving
        state = await (await client.get("/health")).json()
        assert state["rejected"] == len(cases) + 1 and state["requests"] == 1

    run_app(app, scenario)


def test_the_model_loads_and_decodes_on_one_thread_that_is_not_the_event_loops(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch runs only on the decode thread (an OpenMP team started on the main thread
    slows every other thread's teams), and answers reach the event loop without tensors."""
    import nmt.serve.backend

    loaded_on = []

    def load(cfg: Any) -> Any:
        loaded_on.append(threading.current_thread())
        return load_backend(cfg)

    monkeypatch.setattr(nmt.serve.backend, "load_backend", load)
    cfg = serve_config(package, "engine=torch", "decode_process=false")
    backend, executor = nmt.serve.backend.start_backend(cfg)
    decoded_on = []

    def decode(sources: list, opts: DecodeOptions, attention: bool) -> list:
        decoded_on.append(threading.current_thread())
        return backend.decode(sources, opts, attention)

    async def scenario(client: TestClient) -> None:
        response = await client.post("/v1/translate", json={"text": SENTENCES, "attention": True})
        body = await response.json()
        assert response.status == 200 and len(body["attention"]) == len(SENTENCES)

    run_app(make_app(replace(backend, decode=decode), cfg, executor=executor), scenario)
    assert loaded_on[0] is not threading.main_thread()
    assert decoded_on == [loaded_on[0]]
    ids = backend.tokenizers.src.encode_batch(SENTENCES)
    with ThreadPoolExecutor(1) as pool:
        outputs = pool.submit(backend.decode, ids, DecodeOptions(beam=2), True).result()
    assert all(isinstance(o.attention, np.ndarray) for o in outputs)


def test_our_search_decodes_in_a_process_of_its_own_that_is_replaced_if_it_dies(
    package: Path,
) -> None:
    """The default for our search: the model loads and decodes in a child process, with the
    same outputs as on a thread of the server; the child ignores SIGINT and SIGTERM (the
    server's graceful stop decides when it ends), and a killed one fails only the decode it
    was running: the next request starts a new one and is answered."""
    from concurrent.futures.process import BrokenProcessPool

    from nmt.serve.backend import DecodeProcess, start_backend

    cfg = serve_config(package, "engine=torch")
    backend, executor = start_backend(cfg)
    try:
        assert isinstance(executor, DecodeProcess)
        child = executor.pid()
        assert child != os.getpid()
        ids = backend.tokenizers.src.encode_batch(SENTENCES)
        here = load_backend(serve_config(package, "engine=torch", "decode_process=false"))
        for opts in (DecodeOptions(beam=1), DecodeOptions(beam=2)):
            theirs = executor.submit(backend.decode, ids, opts, True).result()
            ours = here.decode(ids, opts, True)
            for a, b in zip(theirs, ours, strict=True):
                assert a.tokens == b.tokens and a.score == pytest.approx(b.score, abs=1e-6)
                np.testing.assert_allclose(a.attention, b.attention, atol=1e-6)

        for sig in (signal.SIGINT, signal.SIGTERM):
            os.kill(child, sig)
        assert executor.submit(backend.decode, ids, DecodeOptions(), False).result()
        assert executor.pid() == child and executor.restarts == 0

        # killed in the middle of a decode: that decode fails, the next one gets a new process
        long = [ids[0] * 12] * 32
        running = executor.submit(backend.decode, long, DecodeOptions(beam=4), False)
        os.kill(child, signal.SIGKILL)
        with pytest.raises(BrokenProcessPool):
            running.result(timeout=60)

        async def scenario(client: TestClient) -> None:
            response = await client.post("/v1/translate", json={"text": SENTENCES})
            body = await response.json()
            assert response.status == 200, body
            expected = here.decode(ids, backend.defaults, False)
            assert body["translations"] == [here.tokenizers.tgt.decode(o.tokens) for o in expected]

        run_app(make_app(backend, cfg, executor=executor), scenario)  # shuts the executor down
        assert executor.restarts == 1
    finally:
        executor.shutdown(wait=True)


# ------------------------------------------------------------------------- the process


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux's /proc finds the child")
def test_sigterm_finishes_the_request_in_flight(package: Path) -> None:
    # a long request on a busy machine may take more than the default request_timeout
    proc, port = start_server(package, "engine=torch", "request_timeout=600")
    try:
        long = " ".join(SENTENCES * 8)  # a barely trained model writes up to the length cap
        result: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: result.update(answer=post(port, {"text": [long] * 64, "beam": 5}))
        )
        worker.start()
        for _ in range(6000):
            if get(port, "/health")["in_flight"] == 1:
                break
        else:
            raise AssertionError("the request never arrived")
        # as a terminal's Ctrl-C or a service manager's stop, every process of the server gets
        # the signal: the decoding process goes on with the request in flight
        os.kill(decoding_process(proc.pid), signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        worker.join(120)
        if "answer" not in result:  # the server's own account of what happened
            out, _ = proc.communicate(timeout=60)
            raise AssertionError(f"no answer (exit {proc.returncode}):\n{out}{server_log(proc)}")
        status, body = result["answer"]
        assert status == 200 and len(body["translations"]) == 64
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, server_log(proc)
        assert "shutting down, 1 request(s) in flight" in out and "stopped after 1" in out
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctranslate2_server_runs_without_pytorch(package: Path) -> None:
    proc, port = start_server(package, "engine=ctranslate2")
    try:
        health = get(port, "/health")
        assert health["engine"] == "ctranslate2" and health["pytorch_loaded"] is False
        status, body = post(port, {"text": SENTENCES})
        assert status == 200 and len(body["translations"]) == 3
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == 0, server_log(proc)
    finally:
        if proc.poll() is None:
            proc.kill()


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of a process: (niceness, CPU ticks spent)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        # after the name: state is field 3 of stat(5), utime 14, stime 15, nice 19
        out[int(task.name)] = (int(fields[16]), int(fields[11]) + int(fields[12]))
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux's /proc shows threads")
@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_the_decoding_runs_on_threads_less_urgent_than_the_event_loop(
    package: Path, engine: str
) -> None:
    """``decode_nice``: the threads that load and decode (the OpenMP team or CTranslate2's
    workers included) run at a higher niceness than the event loop's, so that the loop is
    scheduled first when a request arrives while the decodes keep the cores busy."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    proc, port = start_server(package, f"engine={engine}", "threads=2", "decode_nice=4")
    try:
        # decode until the lowered threads have spent enough CPU time to compare (a tick
        # is 10 ms, and a small model's batch can take less than one)
        deadline = time.monotonic() + 60
        while True:
            status, body = post(port, {"text": SENTENCES * 4, "beam": 3})
            assert status == 200 and len(body["translations"]) == 4 * len(SENTENCES)
            threads = _threads(proc.pid)
            if engine == "torch":  # our search runs in a process of its own
                threads |= _threads(decoding_process(proc.pid))
            spent = sum(t[1] for t in threads.values() if t[0] == min(19, base + 4))
            if spent >= 20 or time.monotonic() > deadline:
                break
        assert get(port, "/health")["pytorch_loaded"] is False  # in the server's process
    finally:
        assert stop_server(proc) == 0, server_log(proc)
    assert threads[proc.pid][0] == base  # the event loop's thread
    lowered = {tid: t for tid, t in threads.items() if t[0] == min(19, base + 4)}
    others = {tid: t for tid, t in threads.items() if tid != proc.pid and tid not in lowered}
    assert lowered, threads
    # the decoding's work (and the model's loading) was done on the lowered threads
    assert sum(t[1] for t in lowered.values()) > 4 * sum(t[1] for t in others.values()), threads
