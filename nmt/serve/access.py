"""Who may use the server: API keys on the endpoints that translate, the refusal to listen
beyond loopback without keys, and CORS for the web origins the configuration lists."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from omegaconf import DictConfig

from nmt.config import ConfigError
from nmt.serve.keys import KeyRing, Refusal, request_key

# what needs no key: the page, the server's state and the description of the API
OPEN_PATHS = frozenset({"/", "/health", "/ready", "/metrics", "/openapi.json"})
ORIGIN = re.compile(
    r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?"
)
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, X-API-Key"
CORS_MAX_AGE = "600"

Handler = Callable[[Any], Awaitable[Any]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address


def check_exposure(cfg: DictConfig) -> None:
    """Refuse to listen beyond loopback with no keys, unless ``allow_open`` says so."""
    if cfg.api_keys_file or cfg.allow_open or is_loopback(str(cfg.host)):
        return
    raise ConfigError(
        f"host={cfg.host} is not a loopback address and no api_keys_file is given: anyone who "
        "can reach the port could use the model. Give api_keys_file=FILE (keys made with "
        "python -m nmt.serve.keys add FILE), or allow_open=true to serve without keys"
    )


def check_origins(origins: Iterable[str]) -> list[str]:
    """The ``cors_origins``, each a web origin such as ``https://example.org:8443``."""
    checked = []
    for i, origin in enumerate(origins):
        origin = str(origin)
        if not ORIGIN.fullmatch(origin):
            raise ConfigError(
                f"cors_origins[{i}]={origin!r} is not a web origin such as "
                "https://example.org or http://localhost:3000 (scheme, host and port only)"
            )
        checked.append(origin)
    return checked


def key_middleware(web: Any, ring: KeyRing, open_paths: Iterable[str] = OPEN_PATHS) -> Any:
    """Every request but those to ``open_paths`` needs a key of ``ring`` (CORS preflights
    are answered before, by :func:`cors_middleware`): 403 without one or with a wrong one,
    429 with ``Retry-After`` past its limit."""
    free = frozenset(open_paths)

    @web.middleware
    async def require_key(request: Any, handler: Handler) -> Any:
        if request.path not in free:
            try:
                authorize(ring, request.headers)
            except Refused as e:
                return refusal_response(web, e.refusal)
        return await handler(request)

    return require_key


class Refused(Exception):
    """A request whose key the key ring refused (:func:`authorize`)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def authorize(ring: KeyRing, headers: Any, key: str | None = None) -> None:
    """:class:`Refused` unless the request's key is one of ``ring``'s and within its limit:
    ``key`` (a field of its body) when given, else the key of its ``headers``."""
    refusal = ring.check(key or request_key(headers))
    if refusal is not None:
        raise Refused(refusal)


def refusal_response(web: Any, refusal: Refusal) -> Any:
    """The answer to a request the key ring refused: ``{"error"}`` with its status and, past a
    key's limit, ``Retry-After``."""
    headers = {}
    if refusal.retry_after is not None:
        headers["Retry-After"] = str(refusal.retry_after)
    return web.json_response({"error": refusal.message}, status=refusal.status, headers=headers)


def cors_middleware(web: Any, origins: Iterable[str]) -> Any:
    """CORS for the listed origins only: their preflights (OPTIONS with
    Access-Control-Request-Method) are answered 204 with what they may send, and every answer
    to them, errors included, names the origin; other origins get no CORS header (and 403 for
    a preflight), so their pages cannot read the answers."""
    allowed = frozenset(origins)

    def allow(response: Any, origin: str) -> Any:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = "Retry-After"
        response.headers.add("Vary", "Origin")
        return response

    @web.middleware
    async def cors(request: Any, handler: Handler) -> Any:
        origin = request.headers.get("Origin")
        preflight = (
            request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
        )
        if preflight:
            if origin not in allowed:
                return web.json_response(
                    {"error": f"origin {origin!r} may not call this server (cors_origins)"},
                    status=403,
                    headers={"Vary": "Origin"},
                )
            response = web.Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = CORS_METHODS
            response.headers["Access-Control-Allow-Headers"] = CORS_HEADERS
            response.headers["Access-Control-Max-Age"] = CORS_MAX_AGE
            return allow(response, origin)
        try:
            response = await handler(request)
        except web.HTTPException as e:  # 404, 405 ... raised by the router
            response = e
        if origin in allowed:
            allow(response, origin)
        elif allowed:
            response.headers.add("Vary", "Origin")
        if isinstance(response, web.HTTPException):
            raise response
        return response

    return cors
