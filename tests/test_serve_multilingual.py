"""``nmt-serve`` over a multilingual model (both tag placements): a request names its target
language on both APIs and is translated as ``nmt-eval`` decodes that direction, requests into
different languages share the server, the languages are listed (``/languages``, ``/health``,
the OpenAPI document; the page's selector is tested in test_serve_page), LibreTranslate's
client package asks for each target, and a language or pair the model was not trained for gets
a 400 naming what it has (zero-shot pairs only with ``allow_zero_shot=true``)."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.error
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient

from nmt.data.tagged import tagged_dataset
from nmt.decode.languages import forced_tokens, tagged_sources
from nmt.decode.options import DecodeOptions
from nmt.decode.search import decode_dataset
from nmt.serve.app import make_app
from nmt.serve.backend import load_backend
from nmt.serve.languages import Languages
from nmt.serve.native import BadRequest
from nmt.store.loading import load_trained

from .helpers import MULTI_DIRECTIONS, compose_config
from .serving import run_app, server_log, start_server

pytestmark = pytest.mark.usefixtures("one_thread")

DIRECTIONS = MULTI_DIRECTIONS
GERMAN = ["Ein Hund rennt über die Wiese.", "Zwei Männer spielen Fußball."]
ENGLISH = ["A dog runs across the meadow.", "Two men play soccer."]


@pytest.fixture(scope="module")
def runs(multilingual_runs: Any) -> Any:
    """``runs(placement)``: the session's tiny multilingual run of MULTI_DIRECTIONS."""
    return multilingual_runs


def config(run: Path, *extra: str) -> Any:
    return compose_config(
        "serve", [f"run={run}", "engine=torch", "device=cpu", "threads=1", *extra]
    )


def expected(run: Path, texts: list[str], target: str) -> list[str]:
    """How nmt-eval decodes ``texts`` into ``target`` (greedy), with the run's tag placement."""
    trained = load_trained(run / "checkpoints" / "best.pt", torch.device("cpu"))
    tag = trained.tokenizers.src.tags[target]
    placement = trained.cfg.data.tag_placement
    data = tagged_dataset(trained.tokenizers, texts, texts, tag, placement)
    hyps = decode_dataset(trained.model, data, DecodeOptions(beam=1), torch.device("cpu"))
    return [trained.tokenizers.tgt.decode(h.tokens) for h in hyps]


@pytest.mark.parametrize("placement", ["source", "target"])
def test_each_target_is_translated_as_nmt_eval_decodes_that_direction(
    runs: Any, placement: str
) -> None:
    run = runs(placement)
    cfg = config(run, "beam=1")
    backend = load_backend(cfg)
    assert backend.languages.targets == ["de", "en", "fr"]
    wanted = {"en": (GERMAN, expected(run, GERMAN, "en"))}
    wanted["fr"] = (ENGLISH, expected(run, ENGLISH, "fr"))
    wanted["de"] = (ENGLISH, expected(run, ENGLISH, "de"))

    async def scenario(client: TestClient) -> None:
        async def ask(target: str) -> dict:
            body = {"text": wanted[target][0], "target": target, "attention": True}
            response = await client.post("/v1/translate", json=body)
            assert response.status == 200, await response.text()
            return await response.json()

        # requests into three languages at once share the server (and may share a decode)
        answers = await asyncio.gather(*(ask(t) for t in ("en", "fr", "de", "fr", "en")))
        for target, answer in zip(("en", "fr", "de", "fr", "en"), answers, strict=True):
            assert answer["translations"] == wanted[target][1], target
            assert all("<2" not in t for t in answer["translations"])  # no tag in the text
            first = answer["attention"][0]
            if placement == "source":  # the model read the tag first
                assert first["source"][0] == f"<2{target}>"
            else:  # the decode began with it
                assert first["target"][0] == f"<2{target}>"
        libre = {"q": "\n".join(ENGLISH), "source": "en", "target": "fr"}
        response = await client.post("/translate", json=libre)
        assert response.status == 200, await response.text()
        assert (await response.json())["translatedText"] == "\n".join(wanted["fr"][1])

    run_app(make_app(backend, cfg), scenario)


def test_languages_are_listed_and_the_untrained_ones_refused(runs: Any) -> None:
    run = runs("source")
    cfg = config(run)
    backend = load_backend(cfg)

    async def scenario(client: TestClient) -> None:
        async def status(path: str, body: dict) -> tuple[int, str]:
            response = await client.post(path, json=body)
            return response.status, (await response.json()).get("error", "")

        listed = await (await client.get("/languages")).json()
        assert {lang["code"]: lang["targets"] for lang in listed} == {
            "de": ["en"],
            "en": ["de", "fr"],
            "fr": ["en"],
        }
        health = await (await client.get("/health")).json()
        assert health["languages"]["directions"] == DIRECTIONS
        assert health["languages"]["targets"] == ["de", "en", "fr"]
        document = await (await client.get("/openapi.json")).json()
        ours = document["paths"]["/v1/translate"]["post"]["requestBody"]["content"]
        assert ours["application/json"]["schema"]["properties"]["target"]["enum"] == [
            "de",
            "en",
            "fr",
        ]
        code, error = await status("/v1/translate", {"text": ["Ein Hund."]})
        assert code == 400 and "'target' is missing" in error and "de, en, fr" in error
        code, error = await status("/v1/translate", {"text": ["Ein Hund."], "target": "cs"})
        assert code == 400 and "'cs'" in error and "(de, en, fr)" in error
        code, error = await status(
            "/v1/translate", {"text": ["Ein Hund."], "source": "cs", "target": "en"}
        )
        assert code == 400 and "source language 'cs'" in error
        code, error = await status(
            "/v1/translate", {"text": ["Ein Hund."], "source": "de", "target": "fr"}
        )
        assert code == 400 and "de-fr is not a direction" in error and "allow_zero_shot" in error
        libre = {"q": "Ein Hund.", "source": "de", "target": "cs"}
        assert await status("/translate", libre) == (400, "cs is not supported")
        code, error = await status("/translate", {**libre, "target": "fr"})
        assert code == 400 and error.startswith("de-fr is not supported")
        # source auto: any source into a trained target; nothing detected, nothing reported
        response = await client.post("/translate", json={**libre, "source": "auto", "target": "fr"})
        assert response.status == 200 and "detectedLanguage" not in await response.json()

    run_app(make_app(backend, cfg), scenario)

    zero = config(run, "allow_zero_shot=true")
    backend = load_backend(zero)

    async def zero_shot(client: TestClient) -> None:
        body = {"text": ["Ein Hund."], "source": "de", "target": "fr"}
        response = await client.post("/v1/translate", json=body)
        assert response.status == 200, await response.text()
        listed = await (await client.get("/languages")).json()
        assert {lang["code"]: lang["targets"] for lang in listed}["de"] == ["en", "fr"]

    run_app(make_app(backend, zero), zero_shot)


def test_libretranslatepy_asks_for_each_target(runs: Any) -> None:
    """LibreTranslate's client package against the real process."""
    from libretranslatepy import LibreTranslateAPI

    run = runs("source")
    proc, port = start_server(run, "engine=torch", "beam=1", key="run")
    try:
        client = LibreTranslateAPI(f"http://127.0.0.1:{port}/")
        codes = {lang["code"]: lang["targets"] for lang in client.languages()}
        assert codes["en"] == ["de", "fr"]
        assert client.translate(ENGLISH[0], "en", "fr") == expected(run, ENGLISH[:1], "fr")[0]
        assert client.translate(ENGLISH[0], "en", "de") == expected(run, ENGLISH[:1], "de")[0]
        with pytest.raises(urllib.error.HTTPError) as refused:  # the client raises urllib's
            client.translate(ENGLISH[0], "en", "cs")
        assert refused.value.code == 400
        assert json.loads(refused.value.read()) == {"error": "cs is not supported"}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0, server_log(proc)


@pytest.mark.parametrize("placement", ["source", "target"])
def test_the_ctranslate2_engine_answers_each_target_as_the_torch_engine(
    runs: Any, placement: str, tmp_path: Path
) -> None:
    """A multilingual package served by CTranslate2 (the tag as a source token, or as
    target_prefix) gives our search's greedy translations into every language."""
    from nmt.ship.export import export_package
    from nmt.store.paths import checkpoint_path

    run = runs(placement)
    package = export_package(checkpoint_path(run, None), tmp_path / "pkg", fmt="ctranslate2")
    answers: dict[str, list] = {}
    for engine in ("torch", "ctranslate2"):
        cfg = compose_config(
            "serve",
            [f"model_dir={package}", f"engine={engine}", "device=cpu", "threads=1", "beam=1"],
        )
        backend = load_backend(cfg)
        assert backend.engine == engine and backend.languages.targets == ["de", "en", "fr"]

        async def scenario(client: TestClient, engine: str = engine) -> None:
            for target in ("de", "en", "fr"):
                body = {"text": GERMAN + ENGLISH, "target": target}
                response = await client.post("/v1/translate", json=body)
                assert response.status == 200, await response.text()
                answers.setdefault(target, []).append((await response.json())["translations"])

        run_app(make_app(backend, cfg), scenario)
    for target, (by_torch, by_ct2) in answers.items():
        assert by_ct2 == by_torch, target


@pytest.mark.parametrize(
    "placement,read,forced",
    [("source", [[6, 1, 2], [6, 3]], None), ("target", [[1, 2], [3]], [6, 6]), (None, None, None)],
)
def test_the_ids_a_request_is_decoded_from(placement: str | None, read: Any, forced: Any) -> None:
    """The target's tag first in each source at source placement, as the first output token
    of each at target placement, and no tag for a bilingual model."""
    sources = [[1, 2], [3]]
    if placement is None:
        languages = Languages((("de", "en"),))
        assert languages.check(None, None) == ("de", "en")
    else:
        languages = Languages((("de", "en"), ("en", "fr")), placement, {"en": 5, "fr": 6})
        with pytest.raises(BadRequest, match="'target' is missing: .* en, fr"):
            languages.check("de", None)
        assert languages.check(None, "fr") == ("auto", "fr")
    direction = languages.target("fr" if placement else "en")
    first = forced_tokens(len(sources), direction)
    assert tagged_sources(sources, direction) == (read or sources)
    assert (None if first is None else first.tolist()) == forced


def test_a_model_whose_sources_carry_their_language_needs_the_source() -> None:
    """At ``both`` placement (M2M100's and NLLB's) each source starts with its own language's
    tag and each output with the target's; a request that names no source is refused when
    the model reads several languages."""
    tags = {"de": 4, "en": 5, "fr": 6}
    languages = Languages((("de", "en"), ("en", "fr"), ("fr", "en")), "both", tags)
    with pytest.raises(BadRequest, match="'source' is missing: this model reads de, en, fr"):
        languages.check(None, "en")
    assert languages.check("fr", "en") == ("fr", "en")
    direction = languages.target("en", "fr")
    assert tagged_sources([[1, 2], [3]], direction) == [[6, 1, 2], [6, 3]]
    assert forced_tokens(2, direction).tolist() == [5, 5]
    one = Languages((("de", "en"), ("de", "fr")), "both", tags)
    assert one.check(None, "fr") == ("de", "fr")  # a single source language needs no naming
