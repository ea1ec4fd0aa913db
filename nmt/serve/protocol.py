"""Requests that are not HTTP enough to reach a handler still get the JSON error of every other
refusal.

aiohttp answers a request line, header or chunk it cannot parse (and a handler that fails outside
our middleware) with a plain-text body before any handler runs. The runner here builds its
connections with a request handler whose error page is ``{"error": message}`` with the same
status, so that a client reads one format from every answer of the server.

aiohttp has no documented hook for this page: the parser's errors never reach the application
(its middlewares and signals), and neither ``AppRunner`` nor ``web.Server`` takes a handler
class. What this relies on is as little as aiohttp allows, and no private attribute: the runner's
public ``setup()`` and ``server``, the server being the connections' factory (``__call__``), and
``RequestHandler.handle_error(request, status, exc, message)`` making the error answer; the
server and each connection's handler are given a subclass that changes nothing else (no state of
its own). ``tests/test_serve_hostile.py`` sends malformed bytes over a raw socket to a bare
aiohttp server and to this one (same status, JSON body), so a change of aiohttp that bypasses it
fails there.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.web import RequestHandler

# the parser's message can quote the offending bytes: enough of them to see what was wrong
MAX_MESSAGE = 200


class JsonErrorHandler(RequestHandler):
    """A connection's handler whose error pages are JSON."""

    __slots__ = ()  # aiohttp's handler, its layout unchanged

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if an answer began
        if status >= 500:
            text = "internal server error" if status == 500 else f"HTTP {status}"
        else:
            detail = (message or getattr(exc, "message", "") or str(exc or "")).strip()
            text = f"malformed HTTP request: {detail[:MAX_MESSAGE]}".rstrip(": ")
        response = web.Response(
            status=status,
            text=json.dumps({"error": text}),
            content_type="application/json",
        )
        response.force_close()
        return response


class JsonErrorServer(web.Server):
    """aiohttp's low-level server, its connections handled by :class:`JsonErrorHandler`."""

    def __call__(self) -> RequestHandler:
        handler = super().__call__()  # made by aiohttp, with the runner's arguments
        handler.__class__ = JsonErrorHandler
        return handler


class JsonErrorRunner(web.AppRunner):
    """``web.AppRunner`` whose server answers malformed HTTP with a JSON error."""

    async def setup(self) -> None:
        await super().setup()
        server = self.server
        if server is None:  # pragma: no cover - setup() made it
            raise RuntimeError("the runner has no server after setup()")
        # the same object and state, before any site listens; only its factory differs
        server.__class__ = JsonErrorServer
