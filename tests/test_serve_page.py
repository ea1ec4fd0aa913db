"""The page of ``nmt-serve`` (``GET /``) in headless Chromium (tests marked ``browser``),
against the real server on loopback: typed and sent from the keyboard, it shows the server's
translation, alternatives and attention (the explorer's heatmap), shows the server's errors,
asks for a key when the server does, and makes no request but to its server."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nmt.serve.keys import add_key

from .helpers import save_screenshot
from .test_serve import package, server_log, start_server  # noqa: F401
from .test_serve_multilingual import ENGLISH, runs  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCE = "Ein Hund rennt über die Wiese."
MAX_CHARS = 200


def api(port: int, body: dict, key: str = "") -> dict:
    """What the server answers our endpoint directly."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/translate", json.dumps(body).encode(), headers
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


class Opened:
    """A page of the server and what it did: console errors and warnings (a script or style
    the policy blocked shows there), uncaught errors and every request."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: list[str] = []
        self.requests: list[str] = []
        self.sent: list[dict] = []  # the bodies of its translation requests
        page.on(
            "console",
            lambda m: (
                self.problems.append(f"{m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e}"))
        page.on("request", self.on_request)

    def on_request(self, request: Any) -> None:
        self.requests.append(request.url)
        if request.url.endswith("/v1/translate"):
            self.sent.append(json.loads(request.post_data))


@pytest.fixture
def server(package: Path) -> Iterator[Any]:  # noqa: F811
    """``server(*overrides)``: a server process on loopback, stopped after the test."""
    procs: list[subprocess.Popen] = []

    def _start(*extra: str) -> int:
        proc, port = start_server(package, *extra)
        procs.append(proc)
        return port

    yield _start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
            assert proc.returncode == 0, server_log(proc)


def open_server_page(browser: Any, port: int) -> tuple[Opened, Any]:
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    opened = Opened(context.new_page())
    response = opened.page.goto(f"http://127.0.0.1:{port}/")
    assert response.status == 200
    opened.page.wait_for_selector("#target:not(:empty)", timeout=10_000)  # the script ran
    return opened, response


def focused(page: Any) -> str:
    return page.evaluate("document.activeElement.id")


def translations_shown(page: Any) -> list[str]:
    return page.eval_on_selector_all("#translations li .text", "els => els.map(e => e.textContent)")


@pytest.mark.browser
@pytest.mark.slow(seconds=10)
@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_the_page_translates_from_the_keyboard(
    engine: str, browser, server, tmp_path: Path
) -> None:
    port = server(f"engine={engine}", f"max_chars={MAX_CHARS}")
    opened, response = open_server_page(browser, port)
    page = opened.page
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "script-src 'sha256-" in policy and "unsafe" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert page.text_content("#target") == "English (en)"
    assert "German (de) \u2192 English (en)" in page.text_content("#meta")
    assert page.is_hidden("#key-box")  # this server asks no key
    # one direction: no language to choose
    assert page.is_hidden("#source-box") and page.is_hidden("#target-select")

    page.keyboard.press("Tab")  # the first stop: the text box, focus drawn
    assert focused(page) == "text"
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") == "solid"
    page.keyboard.type(SENTENCE)
    page.keyboard.press("Enter")
    page.wait_for_selector("#translations li")
    assert page.input_value("#text") == SENTENCE  # Enter sent it, added no line

    beam, n_best = int(page.input_value("#beam")), int(page.input_value("#nbest"))
    assert n_best == 3 and beam >= 3
    body = {"text": [SENTENCE], "beam": beam, "n_best": n_best, "attention": True}
    assert opened.sent == [{**body, "target": "en"}]  # no source named
    expected = api(port, body)
    assert translations_shown(page) == expected["translations"]
    alternatives = page.eval_on_selector_all(
        "#alternatives li .text", "els => els.map(e => e.textContent)"
    )
    assert alternatives == [h["text"] for h in expected["n_best"][0]] and len(alternatives) == 3
    att = expected["attention"][0]
    cells = page.eval_on_selector_all(
        "#heatmap td", "tds => tds.map(td => [+td.dataset.q, +td.dataset.k, +td.dataset.weight])"
    )
    assert (
        len(cells)
        == len(att["target"]) * len(att["source"])
        == len(att["weights"]) * len(att["source"])
    )
    for q, k, weight in cells:
        assert abs(weight - att["weights"][q][k]) <= 5e-5 + 1e-9  # printed to 4 decimals
    columns = page.eval_on_selector_all("#heatmap thead th:not(.corner)", "t => t.length")
    assert columns == len(att["source"])
    rows = page.eval_on_selector_all("#heatmap tbody th", "ths => ths.map(th => th.textContent)")
    assert rows == att["target"]
    assert page.text_content("#status") == "Translated 1 sentence."
    # the heatmap is reached by the keyboard, and arrows move in it
    for _ in range(6):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.tagName") == "TD":
            break
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.dataset.k") == "1"
    assert "\u2192" in page.text_content("#readout")
    save_screenshot(page, tmp_path, f"serve-page-{engine}.png")
    assert opened.problems == []  # the policy let the page's script and style run

    page.fill("#text", "a" * (MAX_CHARS + 1))  # the server refuses it: 413
    page.focus("#text")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("#error:not([hidden])")
    error = page.text_content("#error")
    assert "413" in error and f"at most {MAX_CHARS}" in error
    assert page.get_attribute("#error", "role") == "alert"
    assert [p.split(" (")[0] for p in opened.problems] == [
        "error: Failed to load resource: the server responded with a status of 413"
    ]  # Chromium's own line for an answer of 4xx
    origin = f"http://127.0.0.1:{port}/"
    assert opened.requests and all(url.startswith(origin) for url in opened.requests)
    assert opened.requests.count(f"{origin}v1/translate") == 2


@pytest.mark.browser
@pytest.mark.slow(seconds=5)
def test_the_page_asks_for_the_key_the_server_needs(browser, server, tmp_path: Path) -> None:
    keys = tmp_path / "keys.jsonl"
    key = add_key(keys, "page")
    port = server("engine=ctranslate2", f"api_keys_file={keys}")
    opened, _ = open_server_page(browser, port)  # the page itself needs no key
    page = opened.page
    assert page.is_visible("#key")
    page.keyboard.press("Tab")
    assert focused(page) == "key"
    page.keyboard.press("Tab")
    assert focused(page) == "text"
    page.keyboard.type(SENTENCE)
    page.keyboard.press("Enter")
    page.wait_for_selector("#error:not([hidden])")
    assert "403" in page.text_content("#error") and "API key" in page.text_content("#error")
    assert opened.problems == [
        "error: Failed to load resource: the server responded with a status of 403 (Forbidden)"
    ]
    page.focus("#key")
    page.keyboard.type(key)
    page.keyboard.press("Enter")  # Enter in the key field sends the form too
    page.wait_for_selector("#translations li")
    assert page.is_hidden("#error")
    beam, n_best = int(page.input_value("#beam")), int(page.input_value("#nbest"))
    body = {"text": [SENTENCE], "beam": beam, "n_best": n_best, "attention": True}
    expected = api(port, body, key)
    assert translations_shown(page) == expected["translations"]
    kept = page.evaluate("localStorage.length + sessionStorage.length + document.cookie.length")
    assert kept == 0 and page.context.cookies() == []
    assert len(opened.problems) == 1


@pytest.mark.browser
@pytest.mark.slow(seconds=5)
def test_each_line_is_a_sentence_with_its_own_attention(browser, server) -> None:
    port = server("engine=ctranslate2")
    opened, _ = open_server_page(browser, port)
    page = opened.page
    page.focus("#text")
    lines = [SENTENCE, "Zwei Männer spielen Fußball."]
    page.keyboard.type(lines[0])
    page.keyboard.press("Shift+Enter")  # a new line, not a request
    page.keyboard.type(lines[1])
    assert page.input_value("#text") == "\n".join(lines) and opened.requests[1:] == []
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("#translations li:nth-child(2)")
    beam, n_best = int(page.input_value("#beam")), int(page.input_value("#nbest"))
    expected = api(port, {"text": lines, "beam": beam, "n_best": n_best, "attention": True})
    assert translations_shown(page) == expected["translations"]
    assert page.is_visible("#sentence")
    for i, att in enumerate(expected["attention"]):
        page.select_option("#sentence", str(i))
        rows = page.eval_on_selector_all("#heatmap tbody th", "t => t.map(th => th.textContent)")
        columns = page.eval_on_selector_all("#heatmap thead th:not(.corner)", "t => t.length")
        assert rows == att["target"] and columns == len(att["source"]), i
        alternatives = page.eval_on_selector_all(
            "#alternatives li .text", "els => els.map(e => e.textContent)"
        )
        assert alternatives == [h["text"] for h in expected["n_best"][i]], i
    assert opened.problems == []


@pytest.mark.browser
@pytest.mark.slow(seconds=10)
def test_the_page_offers_a_multilingual_models_target_languages(
    runs: Any,  # noqa: F811
    browser: Any,
) -> None:
    run = runs("source")
    proc, port = start_server(run, "engine=torch", key="run")
    try:
        page = browser.new_context().new_page()
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(str(e)))
        assert page.goto(f"http://127.0.0.1:{port}/").status == 200
        page.wait_for_selector("#target-select option", state="attached")  # the script ran
        options = page.eval_on_selector_all("#target-select option", "os => os.map(o => o.value)")
        assert options == ["de", "en", "fr"] and page.is_hidden("#target")
        page.select_option("#target-select", "fr")
        page.focus("#text")
        page.keyboard.type(ENGLISH[0])
        page.keyboard.press("Enter")
        page.wait_for_selector("#translations li")
        shown = page.eval_on_selector_all(
            "#translations li .text", "els => els.map(e => [e.textContent, e.lang])"
        )
        beam = int(page.input_value("#beam"))
        body = {"text": [ENGLISH[0]], "target": "fr", "beam": beam, "n_best": 3}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/translate",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as r:
            answer = json.loads(r.read())
        assert shown == [[answer["translations"][0], "fr"]]
        columns = page.eval_on_selector_all(
            "#heatmap thead th:not(.corner)", "ths => ths.map(th => th.textContent)"
        )
        assert columns[0] == "<2fr>"  # the model read the tag first
        assert problems == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0, server_log(proc)


def options(page: Any, select: str) -> list[str]:
    return page.eval_on_selector_all(f"{select} option", "os => os.map(o => o.value)")


@pytest.mark.browser
@pytest.mark.slow(seconds=10)
def test_a_multilingual_models_source_and_target_are_chosen_from_the_keyboard(
    runs: Any,  # noqa: F811
    browser: Any,
    tmp_path: Path,
) -> None:
    """A model of several sources (MULTI_DIRECTIONS: de-en, en-de, en-fr, fr-en): the page
    offers each source (or none named), and for a named one only the targets it has."""
    run = runs("source")
    proc, port = start_server(run, "engine=torch", key="run")
    try:
        opened = Opened(browser.new_context().new_page())
        page = opened.page
        assert page.goto(f"http://127.0.0.1:{port}/").status == 200
        page.wait_for_selector("#target-select option", state="attached")  # the script ran
        assert page.is_visible("#source-select") and page.is_visible("#target-select")
        # each selector is labelled: found by its label's text, as assistive technology names it
        assert page.get_by_label("From").evaluate("e => e.id") == "source-select"
        assert page.get_by_label("Into").evaluate("e => e.id") == "target-select"
        assert options(page, "#source-select") == ["auto", "de", "en", "fr"]
        assert options(page, "#target-select") == ["de", "en", "fr"]  # any source: every target
        assert page.get_attribute("#text", "lang") is None

        page.focus("#text")
        page.keyboard.type(ENGLISH[0])
        page.keyboard.press("Tab")
        assert focused(page) == "source-select"
        page.keyboard.press("ArrowDown")  # German: translated into English only
        assert page.input_value("#source-select") == "de"
        assert options(page, "#target-select") == ["en"]
        page.keyboard.press("ArrowDown")  # English: into German or French
        assert page.input_value("#source-select") == "en"
        assert options(page, "#target-select") == ["de", "fr"]
        assert page.get_attribute("#text", "lang") == "en"
        assert page.text_content("#text-label") == "Text in English (en)"
        page.keyboard.press("Tab")
        assert focused(page) == "target-select"
        page.keyboard.press("ArrowDown")
        assert page.input_value("#target-select") == "fr"
        for _ in range(3):  # beam, alternatives, the button
            page.keyboard.press("Tab")
        assert focused(page) == "go"
        page.keyboard.press("Enter")
        page.wait_for_selector("#translations li")

        beam, n_best = int(page.input_value("#beam")), int(page.input_value("#nbest"))
        body = {"text": [ENGLISH[0]], "source": "en", "target": "fr", "beam": beam,
                "n_best": n_best, "attention": True}  # fmt: skip
        assert opened.sent == [body]
        expected = api(port, body)
        shown = page.eval_on_selector_all(
            "#translations li .text", "els => els.map(e => [e.textContent, e.lang])"
        )
        assert shown == [[expected["translations"][0], "fr"]]
        columns = page.eval_on_selector_all(
            "#heatmap thead th:not(.corner)", "ths => ths.map(th => th.textContent)"
        )
        assert columns == expected["attention"][0]["source"] and columns[0] == "<2fr>"
        save_screenshot(page, tmp_path, "serve-page-multilingual.png")

        page.focus("#source-select")
        page.keyboard.press("ArrowDown")  # French: into English only, chosen for the person
        assert page.input_value("#source-select") == "fr"
        assert options(page, "#target-select") == ["en"]
        assert page.input_value("#target-select") == "en"
        page.keyboard.press("Home")  # back to naming none: every target again
        assert page.input_value("#source-select") == "auto"
        assert options(page, "#target-select") == ["de", "en", "fr"]
        assert page.get_attribute("#text", "lang") is None
        assert opened.problems == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0, server_log(proc)
