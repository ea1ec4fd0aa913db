"""TensorBoard end to end: the attention images of real training runs, as a person sees them.

``tensorboard --logdir`` (the command ``make tensorboard`` runs) serves the session's two tiny
trained runs on a free loopback port, for as long as this module runs and never longer. Its own
HTTP API must list the attention image tags and return the very PNGs the trainer wrote; in
headless Chromium the Images dashboard must draw an attention card for each model.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from .helpers import save_screenshot

STARTUP_SECONDS = 90.0  # bound on TensorBoard's start and first load of the event files
STOP_SECONDS = 15.0
TAG = "attention/cross/sent0"  # drawn for both models at every validation
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# loopback requests must not go through a proxy that the environment may name
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class TensorBoard:
    url: str  # http://127.0.0.1:<port>
    process: subprocess.Popen
    log: Path

    def get(self, path: str, **query: str | int) -> bytes:
        """The body of a GET of ``path`` with ``query``."""
        address = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with _OPENER.open(address, timeout=30) as response:
            return response.read()

    def json(self, path: str, **query: str | int) -> object:
        return json.loads(self.get(path, **query))


def free_port() -> int:
    """A loopback port nobody listens on now (TensorBoard binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensorboard_command() -> list[str]:
    """The ``tensorboard`` script beside this Python, as ``make tensorboard`` runs it."""
    script = Path(sys.executable).with_name("tensorboard")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "tensorboard.main"]


def stop(process: subprocess.Popen) -> None:
    """Terminate, then kill if it lingers; always reap."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_tags(board: TensorBoard, runs: list[str]) -> None:
    """Until TensorBoard lists TAG for every run, its process dies, or STARTUP_SECONDS pass."""
    deadline = time.monotonic() + STARTUP_SECONDS
    seen: object = None
    while time.monotonic() < deadline:
        if board.process.poll() is not None:
            tail = board.log.read_text(errors="replace")[-2000:]
            pytest.fail(f"tensorboard exited with {board.process.returncode}:\n{tail}")
        try:
            seen = board.json("/data/plugin/images/tags")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            seen = None  # not serving yet
        if isinstance(seen, dict) and all(TAG in seen.get(run, {}) for run in runs):
            return
        time.sleep(0.5)
    tail = board.log.read_text(errors="replace")[-2000:]
    pytest.fail(f"tensorboard listed no {TAG} for {runs} in {STARTUP_SECONDS:.0f}s: {seen}\n{tail}")


@pytest.fixture(scope="module")
def runs(trained_runs: dict[str, Path]) -> dict[str, str]:
    """TensorBoard's run name of each model's event files, by arch."""
    return {arch: f"{arch}/tb" for arch in trained_runs}


@pytest.fixture(scope="module")
def tensorboard(
    trained_runs: dict[str, Path], runs: dict[str, str], tmp_path_factory
) -> Iterator[TensorBoard]:
    """``tensorboard --logdir <the runs' folder>`` on a free loopback port, stopped at the end."""
    (logdir,) = {run.parent for run in trained_runs.values()}
    log = tmp_path_factory.mktemp("tensorboard") / "tensorboard.log"
    port = free_port()
    command = [*tensorboard_command(), "--logdir", str(logdir), "--host", "127.0.0.1"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    board = TensorBoard(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_for_tags(board, list(runs.values()))
        yield board
    finally:
        stop(process)


def test_tensorboard_serves_the_attention_images(
    tensorboard: TensorBoard, trained_runs: dict[str, Path], runs: dict[str, str]
) -> None:
    """Through TensorBoard's HTTP API: the attention tags of each model, one image per
    validation step, and each image decodes to the PNG the trainer wrote in its event file."""
    tags = tensorboard.json("/data/plugin/images/tags")
    assert isinstance(tags, dict)
    attention = {run: {t for t in tags[run] if t.startswith("attention/")} for run in runs.values()}
    assert attention[runs["gru_bahdanau"]] == {TAG}  # the GRU's one alignment
    transformer = attention[runs["transformer"]]  # the alignment and each decoder layer's
    assert {
        TAG,
        "attention/cross_layer0/sent0",
        "attention/cross_layer1_heads/sent0",
    } <= transformer
    for arch, run in runs.items():
        events = EventAccumulator(str(trained_runs[arch] / "tb"), size_guidance={"images": 0})
        written = {e.step: e.encoded_image_string for e in events.Reload().Images(TAG)}
        images = tensorboard.json("/data/plugin/images/images", run=run, tag=TAG, sample=0)
        assert isinstance(images, list)
        assert [image["step"] for image in images] == sorted(written) == [30, 60]
        for image in images:
            served = tensorboard.get("/data/plugin/images/individualImage?" + image["query"])
            assert served.startswith(PNG_SIGNATURE)
            assert served == written[image["step"]]
            picture = Image.open(io.BytesIO(served))
            picture.load()
            assert min(picture.size) >= 300
            assert len(picture.convert("L").getcolors(maxcolors=1 << 16)) > 10  # drawn, not blank


# Each image card of the dashboard: its text (inside nested shadow roots: tag, run, step) and
# the natural width of its image once loaded (0 before).
CARDS = """loaders => loaders.map(loader => {
    const text = node => (node.shadowRoot ? text(node.shadowRoot) : "") + Array.from(
        node.childNodes, c => c.nodeType === Node.TEXT_NODE ? c.textContent
            : c.nodeType === Node.ELEMENT_NODE && c.tagName !== "STYLE" ? text(c) : "").join(" ");
    const img = (loader.shadowRoot || loader).querySelector("img");
    return {text: text(loader).replace(/\\s+/g, " ").trim(),
            width: img && img.complete ? img.naturalWidth : 0};
})"""


@pytest.mark.browser
def test_images_dashboard_draws_an_attention_card_per_model(
    tensorboard: TensorBoard, runs: dict[str, str], browser, tmp_path: Path
) -> None:
    """Chromium opens the Images dashboard filtered to TAG: one card per model, each with its
    run name, the tag and a loaded image; every request stays on the TensorBoard server."""
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    try:
        page = context.new_page()
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(f"{tensorboard.url}/#images&tagFilter={urllib.parse.quote(TAG, safe='')}")
        page.wait_for_selector("tf-image-loader img", timeout=STARTUP_SECONDS * 1000)
        deadline, cards = time.monotonic() + STARTUP_SECONDS, []
        while time.monotonic() < deadline:
            cards = page.locator("tf-image-loader").evaluate_all(CARDS)
            drawn = [c for c in cards if f"tag: {TAG} step 60" in c["text"] and c["width"] > 0]
            if all(any(run in c["text"] for c in drawn) for run in runs.values()):
                break
            time.sleep(0.25)
        else:
            pytest.fail(f"no drawn {TAG} card for each of {list(runs.values())}: {cards}")
        save_screenshot(page, tmp_path, "tensorboard-attention.png", full_page=False)
        assert all(url.startswith(tensorboard.url) for url in requests), requests
    finally:
        context.close()
