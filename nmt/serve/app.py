"""The aiohttp application: the endpoints over a backend and its batcher.

* ``GET /``: the page (:mod:`nmt.serve.page`);
* ``GET /health``: the engine, model, limits and counters; ``GET /ready``: whether the queue
  has room; ``GET /metrics``: Prometheus' text format (:mod:`nmt.serve.metrics`);
* ``POST /v1/translate``: our own API (:mod:`nmt.serve.native`);
* ``POST /translate``, ``GET /languages``: LibreTranslate's API (:mod:`nmt.serve.libre`);
* ``GET /openapi.json``: the OpenAPI 3 document of them all (:mod:`nmt.serve.openapi`).

Every request body is read as hostile (:func:`nmt.serve.native.load_json`): a malformed one
gets a 4xx with ``{"error": message}`` and the server goes on serving. A translation that finds
the queue full gets 503 with ``Retry-After``, one not answered by its deadline 504.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from nmt.config import ConfigError
from nmt.data.tokenizer import EOS_ID
from nmt.decode.languages import forced_tokens, tagged_sources
from nmt.serve import libre
from nmt.serve.access import (
    OPEN_PATHS,
    check_origins,
    cors_middleware,
    key_middleware,
    refusal_response,
)
from nmt.serve.backend import Backend
from nmt.serve.batcher import Batcher, Overloaded
from nmt.serve.keys import KeyRing, Refusal, request_key
from nmt.serve.languages import AUTO
from nmt.serve.metrics import Metrics
from nmt.serve.native import BadRequest, Limits, attention_view, load_json, parse_request
from nmt.serve.openapi import openapi_document
from nmt.serve.page import page_headers, render_page

JSON_TYPES = ("application/json",)
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")

# LibreTranslate's paths: its /translate takes the key in the body, its /languages needs none
LIBRE_PATHS = ("/translate", "/languages")

# a request of more sentences than this, or with attention or n-best lists, is tokenized and its
# answer built on a thread of its own: 64 long sentences take ~10 ms to tokenize and attention
# weights seconds to write, which on the event loop's thread would stall every other request
INLINE_SENTENCES = 4


class DecodeFailed(Exception):
    """The engine failed on a request's sentences: a 500 with the reason."""


def require_aiohttp() -> Any:
    try:
        from aiohttp import web
    except ImportError:
        raise ConfigError(
            "nmt-serve needs aiohttp, which comes with the optional extra: pip install 'nmt[serve]'"
        ) from None
    return web


def limits_of(cfg: DictConfig) -> Limits:
    return Limits(
        cfg.max_sentences, cfg.max_chars, cfg.max_body_bytes, cfg.max_beam, cfg.max_segments
    )


def make_app(
    backend: Backend,
    cfg: DictConfig,
    state: dict[str, Any] | None = None,
    executor: Executor | None = None,
) -> Any:
    """The aiohttp application over ``backend``, decoding on ``executor`` (where the backend
    was loaded: :func:`nmt.serve.backend.start_backend`), with the keys of ``api_keys_file``
    and CORS for ``cors_origins``.
    ``state`` (filled here) gives the caller the batcher, the metrics and the counters of
    requests in flight and rejected; ``state["stopping"] = True`` makes /ready answer 503."""
    web = require_aiohttp()
    limits = limits_of(cfg)
    origins = check_origins(cfg.cors_origins)
    ring = KeyRing.load(cfg.api_keys_file) if cfg.api_keys_file else None
    metrics = Metrics()
    batcher = Batcher(
        backend,
        cfg.batch_wait_ms / 1000.0,
        cfg.max_batch_sentences,
        executor,
        max_queued=cfg.max_queued_sentences,
        hooks=metrics,
    )
    state = {} if state is None else state
    state.update(in_flight=0, rejected=0, batcher=batcher, metrics=metrics, stopping=False)
    metrics.watch(batcher, state)
    src_tok, tgt_tok = backend.tokenizers.src, backend.tokenizers.tgt
    document = openapi_document(limits, backend)
    # tokenizing big requests and writing big answers (INLINE_SENTENCES)
    helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-text")

    def error(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
        state["rejected"] += 1
        return web.json_response({"error": message}, status=status, headers=headers)

    async def health(request: Any) -> Any:
        return web.json_response(
            {
                "status": "ok",
                "engine": backend.engine,
                "model": backend.model,
                "step": backend.step,
                "languages": backend.languages.info(),
                "decode": {
                    "beam": backend.defaults.beam,
                    "length_penalty": backend.defaults.length_penalty,
                },
                "limits": {**asdict(limits), "max_positions": backend.max_positions},
                "requests": batcher.requests,
                "batches": batcher.batches,
                "sentences": batcher.sentences,
                "rejected": state["rejected"],
                "cancelled": batcher.cancelled,
                "in_flight": state["in_flight"],
                "queued": len(batcher.jobs),
                "queued_sentences": batcher.waiting,
                "max_queued_sentences": batcher.max_queued,
                "pytorch_loaded": "torch" in sys.modules,
            }
        )

    async def ready(request: Any) -> Any:
        reason = None
        if state["stopping"]:
            reason = "the server is shutting down"
        elif batcher.task is None or batcher.task.done():
            reason = "the model is not serving"
        elif batcher.room() <= 0:
            reason = f"the queue is full: {batcher.waiting} sentences wait"
        if reason is None:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready", "reason": reason}, status=503)

    async def metrics_text(request: Any) -> Any:
        body, content_type = metrics.text()
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def off_loop(heavy: bool, fn: Callable, *args: Any) -> Any:
        if not heavy:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(helper, fn, *args)

    def too_large() -> BadRequest:
        return BadRequest(413, f"the body is larger than {limits.max_body_bytes} bytes")

    async def read_body(request: Any) -> bytes:
        size = request.content_length
        if size is not None and size > limits.max_body_bytes:
            raise BadRequest(413, f"the body has {size} bytes; at most {limits.max_body_bytes}")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_large() from None

    def utf8_only(request: Any) -> None:
        charset = request.charset
        if charset and charset.lower().replace("_", "-") not in ("utf-8", "utf8"):
            raise BadRequest(415, f"the body's charset is {charset[:40]}; JSON is read as UTF-8")

    def no_query(request: Any) -> None:
        if request.query_string:
            keys = sorted(request.query.keys())[:10]
            raise BadRequest(
                400, f"the query string ({keys}) is not read here: send the fields in the body"
            )

    def encode(
        texts: list[str], where: list[str], target: str, prefix: str = ""
    ) -> tuple[list[list[int]], list[int] | None]:
        """Source ids as the model reads them for ``target`` (with its tag where the model
        takes one), each within the model's position table (EOS included), and the first
        output token of each when the model is made to begin with the target's tag."""
        direction = backend.languages.target(target)
        ids = tagged_sources(src_tok.encode_batch(texts), direction)
        first = forced_tokens(len(ids), direction)
        forced = None if first is None else first.tolist()
        most = backend.max_positions
        for name, sentence in zip(where, ids, strict=True):
            if most is not None and len(sentence) + 1 > most:
                raise BadRequest(
                    413 if not prefix else 400,
                    f"{prefix}{name} is {len(sentence)} subword pieces long; this model reads at "
                    f"most {most - 1} (model.max_positions={most} counts the end of sentence)",
                )
        return ids, forced

    def counted(handle: Callable) -> Callable:
        """A translate endpoint: counted in flight, a :class:`BadRequest` as its 4xx answer."""

        async def endpoint(request: Any) -> Any:
            deadline = asyncio.get_running_loop().time() + cfg.request_timeout
            state["in_flight"] += 1
            try:
                return await handle(request, deadline)
            except BadRequest as e:
                return error(e.status, str(e))
            except Overloaded as e:
                return error(503, str(e), {"Retry-After": str(e.retry_after)})
            except TimeoutError:
                late = f"not translated within request_timeout={cfg.request_timeout:g} s"
                return error(504, late)
            finally:
                state["in_flight"] -= 1

        return endpoint

    async def decode(
        deadline: float,
        encoded: tuple[list[list[int]], list[int] | None],
        beam: int,
        alpha: float,
        attention: bool,
    ) -> list:
        """The outputs of ``encoded`` (:func:`encode`'s), by the request's deadline;
        :class:`DecodeFailed` when the engine fails (:class:`Overloaded` and ``TimeoutError``
        reach :func:`counted`)."""
        opts = replace(backend.defaults, beam=beam, length_penalty=alpha)
        sources, forced = encoded
        try:
            return await batcher.submit(sources, opts, attention, deadline, forced)
        except (Overloaded, TimeoutError):
            raise
        except Exception as e:  # counted in /metrics, not among the refused requests
            raise DecodeFailed(str(e)) from e

    def prepare_v1(raw: bytes) -> tuple[dict[str, Any], tuple]:
        req = parse_request(raw, limits, backend.defaults)
        _, target = backend.languages.check(req["source"], req["target"])
        batcher.check_room(len(req["text"]))  # refused before the work of tokenizing
        where = [f"text[{i}]" for i in range(len(req["text"]))]
        return req, encode(req["text"], where, target)

    def answer_v1(req: dict[str, Any], encoded: tuple, outputs: list) -> bytes:
        sources = encoded[0]
        body: dict[str, Any] = {
            "translations": [tgt_tok.decode(o.tokens) for o in outputs],
            "scores": [float(o.score) for o in outputs],
        }
        n_best = req["n_best"]
        if n_best > 1:
            body["n_best"] = [
                [{"text": tgt_tok.decode(t), "score": float(s)} for t, s in o.nbest[:n_best]]
                for o in outputs
            ]
        if req["attention"]:
            body["attention"] = [
                attention_view(src_tok.pieces([*ids, EOS_ID]), tgt_tok.pieces(o.tokens), o)
                for ids, o in zip(sources, outputs, strict=True)
            ]
        return json.dumps(body).encode()

    async def translate_v1(request: Any, deadline: float) -> Any:
        no_query(request)
        utf8_only(request)  # our API reads any Content-Type as JSON (curl -d sends a form's)
        raw = await read_body(request)
        # a body of more than a few short sentences is parsed and tokenized off the loop
        req, encoded = await off_loop(len(raw) > 2048, prepare_v1, raw)
        try:
            outputs = await decode(
                deadline, encoded, req["beam"], req["length_penalty"], req["attention"]
            )
        except DecodeFailed as e:
            return web.json_response({"error": f"decoding failed: {e}"}, status=500)
        heavy = len(outputs) > INLINE_SENTENCES or req["attention"] or req["n_best"] > 1
        body = await off_loop(heavy, answer_v1, req, encoded, outputs)
        return web.Response(body=body, content_type="application/json")

    async def libre_fields(request: Any) -> Any:
        """The fields of a LibreTranslate request: a JSON object, or a form (urlencoded or
        multipart) with the query string's fields, as LibreTranslate reads them."""
        kind = request.content_type
        if kind in JSON_TYPES or kind.endswith("+json"):
            no_query(request)
            utf8_only(request)
            return load_json(await read_body(request))  # parse_libre wants an object
        if kind in FORM_TYPES:
            size = request.content_length
            if size is not None and size > limits.max_body_bytes:
                raise BadRequest(413, f"the body has {size} bytes; at most {limits.max_body_bytes}")
            try:
                form = await request.post()
            except web.HTTPRequestEntityTooLarge:
                raise too_large() from None
            except Exception as e:  # whatever a malformed form makes the reader raise
                raise BadRequest(400, f"the form could not be read: {str(e)[:200]}") from None
            items = [*request.query.items(), *form.items()]
        elif "Content-Type" not in request.headers and not await read_body(request):
            items = list(request.query.items())  # a bare POST with its fields in the URL
        else:
            raise BadRequest(
                415,
                f"Content-Type {kind[:60]} is not read: send application/json, "
                "application/x-www-form-urlencoded or multipart/form-data",
            )
        fields: dict[str, Any] = {}
        for key, value in items:
            if key in fields:
                raise libre.invalid(f"{key[:40]} parameter is given twice")
            if not isinstance(value, str):
                raise libre.invalid(f"{key[:40]} parameter must be a form field, not a file")
            fields[key] = value
        return fields

    async def translate_libre(request: Any, deadline: float) -> Any:
        req = libre.parse_libre(await libre_fields(request), limits, backend.languages)
        # LibreTranslate's clients send their key in the body (our header is read too)
        if ring is not None:
            refusal = ring.check(req.api_key or request_key(request.headers))
            if refusal is not None:
                return refused(refusal)
        plan = libre.plan(req, limits)
        batcher.check_room(len(plan.sentences))  # refused before the work of tokenizing
        heavy = len(plan.sentences) > INLINE_SENTENCES
        encoded = await off_loop(
            heavy, encode, plan.sentences, plan.where, req.target, "Invalid request: "
        )
        count = req.alternatives + 1 if req.format == "text" else 1  # none for html
        beam = max(backend.defaults.beam, count)
        hypotheses: list[list[str]] = []
        if encoded[0]:
            try:
                outputs = await decode(
                    deadline, encoded, beam, backend.defaults.length_penalty, False
                )
            except DecodeFailed as e:
                return web.json_response({"error": f"Cannot translate text: {e}"}, status=500)
            for o in outputs:
                best = [tgt_tok.decode(o.tokens)]
                hypotheses.append(best + [tgt_tok.decode(t) for t, _ in o.nbest[1:count]])
        source = backend.languages.check(req.source, req.target)[0]
        detected = None if source == AUTO else source  # a multilingual model detects nothing
        return web.json_response(libre.answer(req, plan, hypotheses, detected))

    async def languages(request: Any) -> Any:
        return web.json_response(libre.language_list(backend.languages))

    async def openapi(request: Any) -> Any:
        return web.json_response(document)

    def refused(refusal: Refusal) -> Any:
        state["rejected"] += 1
        return refusal_response(web, refusal)

    langs = backend.languages
    sources, choices = langs.sources, langs.source_choices
    html, policy = render_page(
        {
            "model": Path(backend.model).name,
            "step": backend.step,
            "engine": backend.engine,
            # one source language is named; a multilingual model reads any of its sources
            "src_lang": sources[0] if len(sources) == 1 else None,
            "targets": langs.targets,
            # the sources a request may name (several: the page offers them), and the targets
            # of each
            "sources": choices,
            "pairs": {source: langs.targets_of(source) for source in choices},
            "beam": backend.defaults.beam,
            "max_beam": limits.max_beam,
            "keys": ring is not None,
        }
    )

    async def page(request: Any) -> Any:
        return web.Response(
            text=html, content_type="text/html", charset="utf-8", headers=page_headers(policy)
        )

    async def on_startup(app: Any) -> None:
        batcher.start()

    async def on_cleanup(app: Any) -> None:
        await batcher.stop()
        helper.shutdown(wait=True)

    middlewares = [metrics.middleware(web)]
    if origins:
        middlewares.append(cors_middleware(web, origins))
    if ring is not None:
        middlewares.append(key_middleware(web, ring, OPEN_PATHS | set(LIBRE_PATHS)))
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=middlewares)
    app.router.add_get("/", page)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics_text)
    app.router.add_post("/v1/translate", counted(translate_v1))
    app.router.add_post("/translate", counted(translate_libre))
    app.router.add_get("/languages", languages)
    app.router.add_get("/openapi.json", openapi)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
