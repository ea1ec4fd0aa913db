"""What the tests of ``nmt-serve`` share: its config, the application under aiohttp's test
client, and the real process on a free port of the loopback."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from benchmarks.memory import cmdline, descendants

from .helpers import REPO, compose_config

SENTENCES = ["Ein Hund rennt über die Wiese.", "Zwei Männer spielen Fußball.", "Eine Frau liest."]


def serve_config(package: Path, *extra: str):
    return compose_config("serve", [f"model_dir={package}", "device=cpu", "threads=1", *extra])


def fake_ct2_gpus(monkeypatch: Any, gpus: int) -> dict[str, Any]:
    """Make CTranslate2 see ``gpus`` CUDA devices and build no model: the returned dict gets
    the keyword arguments of each ``ctranslate2.Translator`` made."""
    import ctranslate2

    seen: dict[str, Any] = {}

    class Translator:
        def __init__(self, model_path: str, **kwargs: Any) -> None:
            seen.update(kwargs)

        def translate_batch(self, *args: Any, **kwargs: Any) -> list[Any]:
            return []  # the engine's first product on a CPU

    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: gpus)
    monkeypatch.setattr(ctranslate2, "Translator", Translator)
    return seen


async def until(check: Callable[[], Awaitable[bool]], what: str, tries: int = 2000) -> None:
    """Wait for a condition (polled every 10 ms, at most ``tries`` times)."""
    for _ in range(tries):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def run_app(app: Any, scenario: Callable[[TestClient], Awaitable[None]]) -> None:
    async def main() -> None:
        async with TestClient(TestServer(app)) as client:
            await scenario(client)

    asyncio.run(main())


def start_server(package: Path, *extra: str, key: str = "model") -> tuple[subprocess.Popen, int]:
    """The server of ``package`` (``key="run"``: of a run directory) in a process of its own;
    its log (a line per request) goes to a file, which cannot fill up and stall it as an unread
    pipe would."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "nmt.serve", f"{key}={package}", "port=0", "threads=1", *extra]
    fd, name = tempfile.mkstemp(suffix=".log", dir=package.parent)  # in pytest's tmp folder
    log = Path(name)
    with os.fdopen(fd, "w") as err:  # the server keeps its own descriptor
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
    proc.log = log  # type: ignore[attr-defined]
    line = proc.stdout.readline()
    assert "nmt-serve:" in line, line + server_log(proc)
    return proc, int(line.rsplit(":", 1)[1])


def stop_server(proc: subprocess.Popen) -> int:
    """SIGTERM, and the exit status (the process is killed if it has not stopped in 60 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    return proc.returncode


def decoding_process(pid: int) -> int:
    """The process in which the server ``pid`` runs our search (Linux: read from /proc): its
    child started by multiprocessing's spawn that is not the resource tracker."""
    found = [
        p
        for p in descendants(pid)[1:]
        if "spawn_main" in cmdline(p) and "resource_tracker" not in cmdline(p)
    ]
    assert len(found) == 1, f"the server {pid} has decoding processes {found}"
    return found[0]


def server_log(proc: subprocess.Popen) -> str:
    return proc.log.read_text()  # type: ignore[attr-defined]


def get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
        return json.loads(r.read())


def post(port: int, body: dict, path: str = "/v1/translate") -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return r.status, json.loads(r.read())
