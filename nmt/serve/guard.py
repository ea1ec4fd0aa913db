"""What every translation request (``POST /v1/translate``, ``POST /translate``) goes through
around its handler, each check in one place: the reading of its body within
``max_body_bytes`` (JSON or a form), the query string and charset it may not carry, its
deadline (``request_timeout``), the count of requests in flight and refused, and the answer
of each refusal (4xx, 503 with ``Retry-After``, 504, a key's 403 or 429, a failed decode's
500)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nmt.serve import libre
from nmt.serve.access import Refused, refusal_response
from nmt.serve.batcher import Overloaded
from nmt.serve.keys import Refusal
from nmt.serve.native import BadRequest, Limits, load_json

JSON_TYPES = ("application/json",)
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")

# a translate handler: the request and its deadline (the event loop's time) to its answer
Handle = Callable[[Any, float], Awaitable[Any]]


class DecodeFailed(Exception):
    """The engine failed on a request's sentences: a 500 with the reason."""


def no_query(request: Any) -> None:
    if request.query_string:
        keys = sorted(request.query.keys())[:10]
        raise BadRequest(
            400, f"the query string ({keys}) is not read here: send the fields in the body"
        )


def utf8_only(request: Any) -> None:
    charset = request.charset
    if charset and charset.lower().replace("_", "-") not in ("utf-8", "utf8"):
        raise BadRequest(415, f"the body's charset is {charset[:40]}; JSON is read as UTF-8")


class Guard:
    """The checks of the translation requests of one application under ``limits``, with
    ``timeout`` seconds for each (``request_timeout``), and its counters: the requests being
    handled (``in_flight``) and those refused (``rejected``: a 4xx, 503 or 504 of a translate
    endpoint; a failed decode is not one)."""

    def __init__(self, web: Any, limits: Limits, timeout: float) -> None:
        self.web = web
        self.limits = limits
        self.timeout = timeout
        self.in_flight = 0
        self.rejected = 0

    def endpoint(self, handle: Handle, failed: str) -> Callable[[Any], Awaitable[Any]]:
        """The endpoint of ``handle``: counted in flight, given its deadline, and each
        refusal it raises answered as ``{"error": message}`` (:class:`BadRequest`,
        :class:`Overloaded`, ``TimeoutError`` past the deadline, :class:`Refused`);
        a :class:`DecodeFailed` is a 500 whose message begins with ``failed``."""

        async def endpoint(request: Any) -> Any:
            deadline = asyncio.get_running_loop().time() + self.timeout
            self.in_flight += 1
            try:
                return await handle(request, deadline)
            except BadRequest as e:
                return self.refuse(Refusal(e.status, str(e)))
            except Overloaded as e:
                return self.refuse(Refusal(503, str(e), e.retry_after))
            except TimeoutError:
                late = f"not translated within request_timeout={self.timeout:g} s"
                return self.refuse(Refusal(504, late))
            except Refused as e:
                return self.refuse(e.refusal)
            except DecodeFailed as e:  # counted in /metrics, not among the refused requests
                return self.web.json_response({"error": f"{failed}: {e}"}, status=500)
            finally:
                self.in_flight -= 1

        return endpoint

    def refuse(self, refusal: Refusal) -> Any:
        self.rejected += 1
        return refusal_response(self.web, refusal)

    async def _within_limit(self, request: Any, read: Callable[[], Awaitable[Any]]) -> Any:
        """What ``read`` makes of a body of at most ``max_body_bytes``: refused (413) at once
        when its Content-Length says more, or when reading finds more (a chunked body)."""
        most = self.limits.max_body_bytes
        size = request.content_length
        if size is not None and size > most:
            raise BadRequest(413, f"the body has {size} bytes; at most {most}")
        try:
            return await read()
        except self.web.HTTPRequestEntityTooLarge:
            raise BadRequest(413, f"the body is larger than {most} bytes") from None

    async def body(self, request: Any) -> bytes:
        return await self._within_limit(request, request.read)

    async def json_body(self, request: Any) -> bytes:
        """The bytes of a JSON body: no query string beside it, no charset but UTF-8."""
        no_query(request)
        utf8_only(request)
        return await self.body(request)

    async def form(self, request: Any) -> Any:
        """The fields of a form (urlencoded or multipart)."""

        async def post() -> Any:
            try:
                return await request.post()
            except self.web.HTTPRequestEntityTooLarge:
                raise
            except Exception as e:  # whatever a malformed form makes the reader raise
                raise BadRequest(400, f"the form could not be read: {str(e)[:200]}") from None

        return await self._within_limit(request, post)

    async def libre_fields(self, request: Any) -> Any:
        """The fields of a LibreTranslate request: a JSON object, or a form (urlencoded or
        multipart) with the query string's fields, as LibreTranslate reads them."""
        kind = request.content_type
        if kind in JSON_TYPES or kind.endswith("+json"):
            return load_json(await self.json_body(request))  # parse_libre wants an object
        if kind in FORM_TYPES:
            form = await self.form(request)
            items = [*request.query.items(), *form.items()]
        elif "Content-Type" not in request.headers and not await self.body(request):
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
