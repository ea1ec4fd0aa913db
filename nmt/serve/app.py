"""The aiohttp application: the endpoints over a backend and its batcher."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from typing import Any

from omegaconf import DictConfig

from nmt.config import ConfigError
from nmt.data.tokenizer import EOS_ID
from nmt.serve.backend import Backend
from nmt.serve.batcher import Batcher, Overloaded
from nmt.serve.metrics import Metrics
from nmt.serve.native import BadRequest, Limits, attention_view, parse_request

# a request of more sentences than this, or with attention or n-best lists, is tokenized and its
# answer built on a thread of its own: 64 long sentences take ~10 ms to tokenize and attention
# weights seconds to write, which on the event loop's thread would stall every other request
INLINE_SENTENCES = 4


def require_aiohttp() -> Any:
    try:
        from aiohttp import web
    except ImportError:
        raise ConfigError(
            "nmt-serve needs aiohttp, which comes with the optional extra: pip install 'nmt[serve]'"
        ) from None
    return web


def make_app(
    backend: Backend,
    cfg: DictConfig,
    state: dict[str, Any] | None = None,
    executor: ThreadPoolExecutor | None = None,
) -> Any:
    """The aiohttp application: /health, /ready, /metrics and /translate over ``backend``,
    decoding on ``executor`` (the thread that loaded the backend). ``state`` (filled here)
    gives the caller the batcher, the metrics and the counters of requests in flight and
    rejected; ``state["stopping"] = True`` makes /ready answer 503."""
    web = require_aiohttp()
    limits = Limits(cfg.max_sentences, cfg.max_chars, cfg.max_body_bytes, cfg.max_beam)
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
                "decode": {
                    "beam": backend.defaults.beam,
                    "length_penalty": backend.defaults.length_penalty,
                },
                "limits": asdict(limits),
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

    def prepare(raw: bytes) -> tuple[dict[str, Any], list[list[int]]]:
        req = parse_request(raw, limits, backend.defaults)
        batcher.check_room(len(req["text"]))  # refused before the work of tokenizing
        return req, src_tok.encode_batch(req["text"])

    def answer(req: dict[str, Any], sources: list[list[int]], outputs: list) -> bytes:
        body: dict[str, Any] = {
            "translations": [tgt_tok.decode(o.tokens) for o in outputs],
            "scores": [float(o.score) for o in outputs],
        }
        if req["n_best"] > 1:
            body["n_best"] = [
                [
                    {"text": tgt_tok.decode(t), "score": float(s)}
                    for t, s in o.nbest[: req["n_best"]]
                ]
                for o in outputs
            ]
        if req["attention"]:
            body["attention"] = [
                attention_view(src_tok.pieces([*ids, EOS_ID]), tgt_tok.pieces(o.tokens), o)
                for ids, o in zip(sources, outputs, strict=True)
            ]
        return json.dumps(body).encode()

    async def off_loop(heavy: bool, fn: Callable, *args: Any) -> Any:
        if not heavy:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(helper, fn, *args)

    async def translate(request: Any) -> Any:
        deadline = asyncio.get_running_loop().time() + cfg.request_timeout
        state["in_flight"] += 1
        try:
            if (
                request.content_length is not None
                and request.content_length > limits.max_body_bytes
            ):
                return error(
                    413,
                    f"the body has {request.content_length} bytes; at most {limits.max_body_bytes}",
                )
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return error(413, f"the body is larger than {limits.max_body_bytes} bytes")
            try:
                # a body of more than a few short sentences is parsed and tokenized off the loop
                req, sources = await off_loop(len(raw) > 2048, prepare, raw)
                opts = replace(
                    backend.defaults, beam=req["beam"], length_penalty=req["length_penalty"]
                )
                outputs = await batcher.submit(sources, opts, req["attention"], deadline)
            except BadRequest as e:
                return error(e.status, str(e))
            except Overloaded as e:
                return error(503, str(e), {"Retry-After": str(e.retry_after)})
            except TimeoutError:
                return error(
                    504, f"not translated within request_timeout={cfg.request_timeout:g} s"
                )
            except Exception as e:  # counted in /metrics, not among the refused requests
                return web.json_response({"error": f"decoding failed: {e}"}, status=500)
            heavy = len(outputs) > INLINE_SENTENCES or req["attention"] or req["n_best"] > 1
            body = await off_loop(heavy, answer, req, sources, outputs)
            return web.Response(body=body, content_type="application/json")
        finally:
            state["in_flight"] -= 1

    async def on_startup(app: Any) -> None:
        batcher.start()

    async def on_cleanup(app: Any) -> None:
        await batcher.stop()
        helper.shutdown(wait=True)

    app = web.Application(
        client_max_size=limits.max_body_bytes, middlewares=[metrics.middleware(web)]
    )
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics_text)
    app.router.add_post("/translate", translate)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
