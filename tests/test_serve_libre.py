"""LibreTranslate's API on ``nmt-serve`` (``POST /translate``, ``GET /languages``): the answers
of its JSON and form bodies, its errors, html, and the real ``libretranslatepy`` client against
the real process; and the refusal of a sentence longer than the model's position table."""

from __future__ import annotations

import json
import urllib.error
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from nmt.decode.options import DecodeOptions
from nmt.serve.app import make_app
from nmt.serve.backend import load_backend
from nmt.serve.keys import add_key
from nmt.serve.languages import Languages
from nmt.serve.libre import answer, parse_libre, plan
from nmt.serve.native import Limits
from nmt.store.package import read_package

from .serving import SENTENCES, get, run_app, serve_config, server_log, start_server, stop_server

pytestmark = pytest.mark.usefixtures("one_thread")
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
def app_of(serve_package: Path) -> Any:
    """A fresh application (its batcher lives in one event loop) over one loaded backend."""
    cfg = serve_config(serve_package, "engine=torch")
    backend = load_backend(cfg)

    def make(*extra: str, **kw: Any) -> Any:
        return make_app(backend, serve_config(serve_package, "engine=torch", *extra), **kw)

    return make


async def ours(client: TestClient, text: list[str], **search: Any) -> dict:
    response = await client.post("/v1/translate", json={"text": text, **search})
    assert response.status == 200, await response.text()
    return await response.json()


async def libre(client: TestClient, status: int = 200, **kw: Any) -> dict:
    response = await client.post("/translate", **kw)
    body = await response.json()
    assert response.status == status, body
    return body


def test_json_and_form_bodies_translate_as_our_api_does(app_of: Any) -> None:
    async def scenario(client: TestClient) -> None:
        expected = (await ours(client, SENTENCES))["translations"]
        one = {"q": SENTENCES[0], "source": "de", "target": "en"}
        assert await libre(client, json=one) == {"translatedText": expected[0]}
        many = await libre(client, json={**one, "q": SENTENCES})
        assert many == {"translatedText": expected}
        form = await libre(client, data=one)  # application/x-www-form-urlencoded
        assert form == {"translatedText": expected[0]}
        multipart = aiohttp.FormData({**one, "api_key": "k"})
        multipart.add_field("format", "text")
        multipart._is_multipart = True  # as a browser's FormData sends it
        assert await libre(client, data=multipart) == {"translatedText": expected[0]}
        in_the_url = await libre(client, params=one, skip_auto_headers=["Content-Type"])
        assert in_the_url == {"translatedText": expected[0]}  # as LibreTranslate reads a form
        auto = await libre(client, json={**one, "source": "auto"})
        assert auto["detectedLanguage"] == {"confidence": 100.0, "language": "de"}
        autos = await libre(client, json={**one, "q": SENTENCES[:2], "source": "auto"})
        assert autos["detectedLanguage"] == [{"confidence": 100.0, "language": "de"}] * 2
        # each line a sentence; empty lines and empty items are kept as they are
        lines = await libre(client, json={**one, "q": [f"{SENTENCES[0]}\n\n{SENTENCES[2]}", ""]})
        assert lines["translatedText"] == [f"{expected[0]}\n\n{expected[2]}", ""]
        assert (await ours(client, SENTENCES))["translations"] == expected  # nothing moved

    run_app(app_of(), scenario)


def test_alternatives_are_the_n_best_beyond_the_best(app_of: Any) -> None:
    async def scenario(client: TestClient) -> None:
        n_best = (await ours(client, SENTENCES, beam=4, n_best=4))["n_best"]
        request = {"q": SENTENCES, "source": "de", "target": "en", "alternatives": 3}
        body = await libre(client, json=request)
        assert body["translatedText"] == [hyps[0]["text"] for hyps in n_best]
        for alternatives, hyps in zip(body["alternatives"], n_best, strict=True):
            texts = [h["text"] for h in hyps]
            assert alternatives == list(dict.fromkeys(t for t in texts[1:] if t != texts[0]))
        single = await libre(client, data={**request, "q": SENTENCES[1], "alternatives": "3"})
        assert single["alternatives"] == body["alternatives"][1]
        assert "alternatives" not in await libre(client, json={**request, "alternatives": 0})

    run_app(app_of(), scenario)


def test_html_keeps_the_markup_and_translates_the_text_nodes(app_of: Any) -> None:
    page = (
        '<p class="x">Ein Hund rennt.<br/><b>Eine Frau liest.</b> <!-- Ein Hund -->'
        "<script>var s = 'Ein Hund';</script></p>"
    )

    async def scenario(client: TestClient) -> None:
        dog, woman = (await ours(client, ["Ein Hund rennt.", "Eine Frau liest."]))["translations"]
        request = {"q": page, "source": "de", "target": "en", "format": "html"}
        body = await libre(client, json={**request, "alternatives": 2})
        escape = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
        dog, woman = ("".join(escape.get(c, c) for c in t) for t in (dog, woman))
        assert body["translatedText"] == (
            f'<p class="x">{dog}<br/><b>{woman}</b> <!-- Ein Hund -->'
            "<script>var s = 'Ein Hund';</script></p>"
        )
        assert body["alternatives"] == []  # none for html, as LibreTranslate
        assert (await libre(client, json={**request, "q": "<br/>"}))["translatedText"] == "<br/>"

    run_app(app_of(), scenario)


def test_languages_are_the_packages_with_their_names(app_of: Any, serve_package: Path) -> None:
    _, train_cfg, _ = read_package(serve_package)
    assert (train_cfg.data.src_lang, train_cfg.data.tgt_lang) == ("de", "en")

    async def scenario(client: TestClient) -> None:
        response = await client.get("/languages")
        assert response.status == 200
        assert await response.json() == [
            {"code": "de", "name": "German", "targets": ["en"]},
            {"code": "en", "name": "English", "targets": []},
        ]

    run_app(app_of(), scenario)


def libre_errors() -> list[tuple[str, dict[str, Any], int, str]]:
    """(kind, aiohttp post arguments, status, the error message or its start)."""
    one = {"q": "Ein Hund.", "source": "de", "target": "en"}
    missing = "Invalid request: missing {} parameter"
    return [
        ("no q", {"json": {"source": "de", "target": "en"}}, 400, missing.format("q")),
        ("empty q", {"data": {**one, "q": ""}}, 400, missing.format("q")),
        ("no source", {"json": {**one, "source": None}}, 400, missing.format("source")),
        ("no target", {"data": {"q": "a", "source": "de"}}, 400, missing.format("target")),
        ("source", {"json": {**one, "source": "fr"}}, 400, "fr is not supported"),
        ("target", {"json": {**one, "target": "de"}}, 400, "de is not supported"),
        ("format", {"json": {**one, "format": "pdf"}}, 400, "pdf format is not supported"),
        ("alt", {"data": {**one, "alternatives": "x"}}, 400, "Invalid request: alternatives"),
        (
            "alt max",
            {"json": {**one, "alternatives": 16}},
            400,
            "Invalid request: alternatives parameter must be <= 15",
        ),
        ("batch", {"json": {**one, "q": ["a"] * 65}}, 400, "request (65) exceeds text limit (64)"),
        ("chars", {"json": {**one, "q": "a" * 1001}}, 400, "request (1001) exceeds text limit"),
        ("q items", {"json": {**one, "q": ["a", 1]}}, 400, "q must be a string or a list"),
        ("not object", {"json": ["a"]}, 400, "Invalid JSON format"),
        ("ours", {"json": {"text": ["a"]}}, 400, "Invalid request: missing q parameter; this"),
        ("type", {"data": b"q=a", "headers": {"Content-Type": "text/plain"}}, 415, "Content"),
        ("query", {"json": one, "params": {"q": "b"}}, 400, "the query string (['q'])"),
        ("twice", {"data": [("q", "a"), ("q", "b"), ("source", "de")]}, 400, "q parameter is"),
        (
            "charset",
            {"data": b"{}", "headers": {"Content-Type": "application/json; charset=latin-1"}},
            415,
            "the body's charset is latin-1",
        ),  # fmt: skip
    ]


def test_each_libretranslate_error_is_its_400_with_its_message(app_of: Any) -> None:
    async def scenario(client: TestClient) -> None:
        for kind, kwargs, status, message in libre_errors():
            body = await libre(client, status, **kwargs)
            assert message in body["error"], (kind, body)
        ours_hint = await libre(client, 400, json={"text": ["a"]})
        assert "POST /v1/translate" in ours_hint["error"]
        as_curl_sends_it = await libre(client, 400, data=b'{"text": ["a"]}', headers=FORM)
        assert "Content-Type: application/json" in as_curl_sends_it["error"]
        assert "POST /v1/translate" in as_curl_sends_it["error"]
        files = aiohttp.FormData({"source": "de", "target": "en"})
        files.add_field("q", b"Ein Hund.", filename="q.txt")
        assert "not a file" in (await libre(client, 400, data=files))["error"]
        assert await libre(client, json={"q": "Ein Hund.", "source": "de", "target": "en"})

    run_app(app_of(), scenario)


def test_lines_and_text_nodes_are_capped_by_max_segments_alone(app_of: Any) -> None:
    """max_segments caps the lines (or html text nodes) of one request, counted over all its
    texts, with LibreTranslate's 400; max_batch_sentences (a decode's size) has no say."""
    app = app_of("max_segments=3", "max_batch_sentences=2")

    async def scenario(client: TestClient) -> None:
        def body(q: Any, fmt: str = "text") -> dict:
            return {"json": {"q": q, "source": "de", "target": "en", "format": fmt}}

        refused = [
            body("\n".join(SENTENCES[:2] * 2)),  # four lines
            body([SENTENCES[0], "\n".join(SENTENCES[:2]), SENTENCES[1]]),  # four in three texts
            body("<p>" + "</p><p>".join(SENTENCES[:2] * 2) + "</p>", "html"),  # four nodes
        ]
        for kw in refused:
            error = (await libre(client, 400, **kw))["error"]
            assert error == (
                "Invalid request: request (4 lines or text nodes) exceeds segment limit "
                "(max_segments=3)"
            ), kw
        three = await libre(client, **body("\n\n".join(SENTENCES[:2] + SENTENCES[:1])))
        assert three["translatedText"].count("\n\n") == 2  # blank lines are not segments
        health = await (await client.get("/health")).json()
        assert health["limits"]["max_segments"] == 3
        document = await (await client.get("/openapi.json")).json()
        form = document["paths"]["/translate"]["post"]["requestBody"]["content"]
        q = form["application/json"]["schema"]["properties"]["q"]
        assert "at most 3 in a request" in q["description"]

    run_app(app, scenario)


def test_the_api_key_of_each_body_is_checked_by_the_key_ring(app_of: Any, tmp_path: Path) -> None:
    """LibreTranslate's clients send ``api_key`` in a JSON or form body; our header works too;
    /languages needs no key."""
    keys = tmp_path / "keys.jsonl"
    good = add_key(keys, name="client")
    one = {"q": "Ein Hund.", "source": "de", "target": "en"}

    async def scenario(client: TestClient) -> None:
        assert (await libre(client, 403, json={**one, "api_key": "bad"})) == {
            "error": "Invalid API key"
        }
        await libre(client, 403, json=one)
        assert "translatedText" in await libre(client, data={**one, "api_key": good})
        assert "translatedText" in await libre(client, json={**one, "api_key": good})
        headed = await client.post(
            "/translate", json=one, headers={"Authorization": f"Bearer {good}"}
        )
        assert headed.status == 200
        assert (await client.get("/languages")).status == 200

    run_app(app_of(f"api_keys_file={keys}"), scenario)


def test_a_sentence_longer_than_the_position_table_is_refused_on_both_engines(
    serve_package: Path,
) -> None:
    """Each engine cuts such a source to the table (what a decode does with it); the server
    refuses it instead, naming the sentence and the limit, on both APIs."""
    _, train_cfg, _ = read_package(serve_package)
    limit = train_cfg.model.max_positions
    long = " ".join(["Hund"] * limit)  # a piece or more per word, and its spaces
    for engine in ("torch", "ctranslate2"):
        cfg = serve_config(serve_package, f"engine={engine}", f"max_chars={len(long)}")
        backend = load_backend(cfg)
        assert backend.max_positions == limit
        ids = backend.tokenizers.src.encode_batch([long])[0]
        assert len(ids) + 1 > limit
        short = DecodeOptions(beam=1, max_output_len_a=0, max_output_len_b=4)
        cut, whole = backend.decode([ids[: limit - 1], ids], short, False)  # both decode
        assert cut.tokens == whole.tokens  # the longer one was cut to the table

        async def scenario(client: TestClient, n: int = len(ids)) -> None:
            response = await client.post("/v1/translate", json={"text": ["Ein Hund.", long]})
            assert response.status == 413
            assert (await response.json())["error"] == (
                f"text[1] is {n} subword pieces long; this model reads at most {limit - 1} "
                f"(model.max_positions={limit} counts the end of sentence)"
            )
            body = await libre(client, 400, json={"q": long, "source": "de", "target": "en"})
            assert body["error"].startswith(f"Invalid request: q is {n} subword pieces long")
            assert (await ours(client, ["Ein Hund."]))["translations"]  # still serving

        run_app(make_app(replace(backend), cfg), scenario)


# ------------------------------------------------------------------------- real clients


def test_the_libretranslatepy_client_against_the_real_server(serve_package: Path) -> None:
    """The client package LibreTranslate's users install, on loopback (it sends forms; it
    has no list of texts to send)."""
    from libretranslatepy import LibreTranslateAPI

    proc, port = start_server(serve_package, "engine=ctranslate2")
    try:
        expected = get_translations(port, SENTENCES[:1])
        client = LibreTranslateAPI(f"http://127.0.0.1:{port}")
        assert client.translate(SENTENCES[0], "de", "en") == expected[0]
        assert client.translate(SENTENCES[0], "auto", "en") == expected[0]
        assert client.languages() == get(port, "/languages")
        assert [lang["code"] for lang in client.languages()] == ["de", "en"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            client.translate(SENTENCES[0], "fr", "en")
        assert refused.value.code == 400
        assert json.loads(refused.value.read()) == {"error": "fr is not supported"}
        keyed = LibreTranslateAPI(f"http://127.0.0.1:{port}", api_key="some-key")
        assert keyed.translate(SENTENCES[0], "de", "en") == expected[0]
    finally:
        assert stop_server(proc) == 0, server_log(proc)


def get_translations(port: int, texts: list[str]) -> list[str]:
    from .serving import post

    status, body = post(port, {"text": texts})
    assert status == 200
    return body["translations"]


def test_alternatives_leave_out_the_best_and_repeats_line_by_line() -> None:
    """Hypotheses that decode to the same text (pieces differ, words do not) are one
    alternative; a text of several lines takes each line's k-th hypothesis (or its last)."""
    limits = Limits(max_sentences=4, max_chars=100, max_body_bytes=1000, max_beam=4)
    fields = {"q": "Ein Hund.\n\nEine Frau.", "source": "de", "target": "en", "alternatives": "3"}
    req = parse_libre(fields, limits, Languages((("de", "en"),)))
    lines = plan(req, limits)
    assert lines.sentences == ["Ein Hund.", "Eine Frau."]
    hypotheses = [["A dog.", "A dog.", "The dog.", "The dog."], ["A woman."]]
    body = answer(req, lines, hypotheses, "de")
    assert body == {
        "translatedText": "A dog.\n\nA woman.",
        "alternatives": ["The dog.\n\nA woman."],
    }
