"""Every byte of a request is hostile: malformed bodies of each kind get a 4xx with a JSON
``{"error"}`` on both APIs and the server goes on serving; generated bodies (hypothesis) never
get a 5xx, neither from the parsers nor from the live server; the OpenAPI document follows the
limits the server enforces, and schemathesis finds every answer of the live server in it."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.decode.options import DecodeOptions
from nmt.serve.app import make_app
from nmt.serve.backend import load_backend
from nmt.serve.languages import Languages
from nmt.serve.libre import parse_libre, plan
from nmt.serve.markup import MarkupError, join_html, split_html, text_nodes
from nmt.serve.native import BadRequest, Limits, load_json, parse_request

from .serving import get, run_app, serve_config, server_log, start_server, stop_server

pytestmark = pytest.mark.usefixtures("one_thread")

LIMITS = Limits(max_sentences=4, max_chars=80, max_body_bytes=20_000, max_beam=3, max_segments=8)
SERVER = [f"max_sentences={LIMITS.max_sentences}", f"max_chars={LIMITS.max_chars}",
          f"max_body_bytes={LIMITS.max_body_bytes}", f"max_beam={LIMITS.max_beam}",
          f"max_segments={LIMITS.max_segments}", "max_output_len_a=0",
          "max_output_len_b=8"]  # fmt: skip
NATIVE = b'{"text": ["Ein Hund rennt."]}'
LIBRE = b'{"q": "Ein Hund rennt.", "source": "de", "target": "en"}'


def hostile_bodies() -> list[tuple[str, bytes, bytes, str]]:
    """(kind, a body for our API, one for LibreTranslate's, words of the error)."""
    deep = b"[" * 5000 + b"]" * 5000
    both = [
        ("deep arrays", b'{"text": ' + deep + b"}", b'{"q": ' + deep + b"}", "nested"),
        (
            "huge integer",
            b'{"beam": ' + b"9" * 5000 + b"}",
            b'{"alternatives": ' + b"9" * 5000 + b"}",
            "5000 digits",
        ),  # fmt: skip
        ("inf", b'{"length_penalty": 1e999}', b'{"alternatives": 1e999}', "out of range"),
        ("nan", b'{"length_penalty": NaN}', b'{"alternatives": NaN}', "NaN is not JSON"),
        ("twice", b'{"text": ["a"], "text": ["b"]}', b'{"q": "a", "q": "b"}', "given twice"),
        (
            "surrogate",
            b'{"text": ["\\ud800"]}',
            b'{"q": "\\udc00", "source": "de", "target": "en"}',
            "surrogate",
        ),
        (
            "nul",
            b'{"text": ["a\\u0000"]}',
            b'{"q": ["a\\u0000"], "source": "de", "target": "en"}',
            "NUL",
        ),
        ("raw nul", b'{"text": ["a\x00"]}', b'{"q": "a\x00"}', "not valid JSON"),
        (
            "latin-1",
            '{"text": ["Müller"]}'.encode("latin-1"),
            '{"q": "Müller"}'.encode("latin-1"),
            "UTF-8",
        ),  # fmt: skip
        ("utf-16", '{"text": ["a"]}'.encode("utf-16"), '{"q": "a"}'.encode("utf-16"), "UTF-8"),
        ("empty", b"", b"", "not valid JSON"),
    ]
    return both


@pytest.fixture(scope="module")
def app_of(serve_package: Path) -> Any:
    cfg = serve_config(serve_package, "engine=torch", *SERVER)
    backend = load_backend(cfg)
    return lambda: make_app(backend, cfg)


def test_each_hostile_body_gets_a_4xx_json_error_on_both_apis(app_of: Any) -> None:
    async def post(client: TestClient, path: str, body: bytes, **kw: Any) -> tuple[int, str]:
        response = await client.post(path, data=body, **kw)
        assert response.content_type == "application/json", await response.text()
        error = (await response.json())["error"]
        assert isinstance(error, str)
        return response.status, error

    json_type = {"headers": {"Content-Type": "application/json"}}

    async def scenario(client: TestClient) -> None:
        for kind, native, libre, words in hostile_bodies():
            for path, body in (("/v1/translate", native), ("/translate", libre)):
                status, error = await post(client, path, body, **json_type)
                assert 400 <= status < 500 and words in error, (kind, path, status, error)
        cases = [  # (path, body, post arguments, status, words)
            ("/v1/translate", b'{"text": ["a", 1]}', {}, 400, "list of strings"),
            ("/v1/translate", b'{"text": [" \\t\\n"]}', {}, 400, "text[0] is empty or only"),
            ("/v1/translate", b'{"text": [""]}', {}, 400, "text[0] is empty"),
            ("/v1/translate", NATIVE, {"params": {"beam": "2"}}, 400, "query string"),
            (
                "/v1/translate",
                NATIVE,
                {"headers": {"Content-Type": "application/json; charset=utf-16"}},
                415,
                "charset is utf-16",
            ),  # fmt: skip
            ("/translate", LIBRE, {"headers": {"Content-Type": "text/plain"}}, 415, "Content"),
            ("/translate", LIBRE, {"params": {"q": "x"}, **json_type}, 400, "query string"),
            (
                "/translate",
                b"q=\xff\xfe&source=de&target=en",
                {"headers": {"Content-Type": "application/x-www-form-urlencoded"}},
                400,
                "form could not be read",
            ),  # fmt: skip
            (
                "/translate",
                b"--x\r\nbroken",
                {"headers": {"Content-Type": "multipart/form-data; boundary=x"}},
                400,
                "",
            ),  # fmt: skip
            (
                "/translate",
                b'{"q": ["a", null], "source": "de", "target": "en"}',
                json_type,
                400,
                "list of strings",
            ),  # fmt: skip
        ]
        bare = {"skip_auto_headers": ["Content-Type"]}
        cases.append(("/translate", b"q=a" * 10_000, bare, 413, "bytes; at most 20000"))
        for path, body, kwargs, status, words in cases:
            got, error = await post(client, path, body, **kwargs)
            assert got == status and words in error, (path, body, got, error)
        # still serving, both APIs
        assert (await client.post("/v1/translate", data=NATIVE)).status == 200
        assert (await client.post("/translate", data=LIBRE, **json_type)).status == 200

    run_app(app_of(), scenario)


# every way a translate endpoint reads a body: our API reads any Content-Type as JSON,
# LibreTranslate's a JSON object, either form, or a bare body with the fields in the URL
BODY_READINGS = [
    ("/v1/translate", "application/json"),
    ("/v1/translate", "application/x-www-form-urlencoded"),
    ("/translate", "application/json"),
    ("/translate", "application/x-www-form-urlencoded"),
    ("/translate", "multipart/form-data; boundary=x"),
    ("/translate", None),
]


def sized_body(path: str, kind: str | None, size: int) -> bytes:
    """A body of ``size`` bytes that ``path`` reads as ``kind``, well formed but for its size."""
    if path == "/v1/translate" or kind == "application/json":
        start, end, pad = (NATIVE if path == "/v1/translate" else LIBRE), b"", b" "
    elif kind is not None and kind.startswith("multipart/"):
        start = b'--x\r\nContent-Disposition: form-data; name="q"\r\n\r\n'
        end, pad = b"\r\n--x--\r\n", b"a"
    else:
        start, end, pad = b"q=", b"", b"a"
    return start + pad * (size - len(start) - len(end)) + end


def test_a_body_over_the_limit_gets_the_same_413_on_both_apis(app_of: Any) -> None:
    """Whichever way a body is read, one over max_body_bytes is refused with the same 413 and
    message: at once when its Content-Length says so, and when only reading finds it (a chunked
    body); one of max_body_bytes exactly is read."""
    most = LIMITS.max_body_bytes

    async def chunked(data: bytes):  # no Content-Length: only reading finds the size
        for start in range(0, len(data), 4096):
            yield data[start : start + 4096]

    async def scenario(client: TestClient) -> None:
        for path, kind in BODY_READINGS:
            headers = {} if kind is None else {"Content-Type": kind}
            bare = ["Content-Type"] if kind is None else []
            over = sized_body(path, kind, most + 1)
            for data, error in (
                (over, f"the body has {most + 1} bytes; at most {most}"),
                (chunked(over), f"the body is larger than {most} bytes"),
            ):
                response = await client.post(
                    path, data=data, headers=headers, skip_auto_headers=bare
                )
                assert response.status == 413, (path, kind, await response.text())
                assert (await response.json()) == {"error": error}, (path, kind)
            response = await client.post(
                path, data=sized_body(path, kind, most), headers=headers, skip_auto_headers=bare
            )
            assert response.status != 413, (path, kind, await response.text())

    run_app(app_of(), scenario)


# ---------------------------------------------------------------- generated bodies

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
FIELDS = st.sampled_from(["text", "beam", "length_penalty", "n_best", "attention", "q",
                          "source", "target", "format", "alternatives", "api_key"])  # fmt: skip
OBJECTS = st.dictionaries(FIELDS, JSON_VALUES, max_size=6)


def _mutate(raw: bytes, data: st.DataObject) -> bytes:
    """A valid body with bytes cut, flipped or put in."""
    body = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(body)))
        how = data.draw(st.sampled_from(["cut", "flip", "put"]))
        if how == "cut":
            del body[at : at + data.draw(st.integers(1, 5))]
        elif how == "flip" and at < len(body):
            body[at] ^= data.draw(st.integers(1, 255))
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    return bytes(body)


@st.composite
def bodies(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["bytes", "value", "object", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "value":
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == "object":
        return json.dumps(draw(OBJECTS)).encode()
    return _mutate(draw(st.sampled_from([NATIVE, LIBRE])), draw(st.data()))


@given(raw=bodies())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_parsers_raise_nothing_but_a_4xx(raw: bytes) -> None:
    defaults = DecodeOptions(beam=2)
    for parse in (
        lambda: parse_request(raw, LIMITS, defaults),
        lambda: plan(parse_libre(load_json(raw), LIMITS, Languages((("de", "en"),))), LIMITS),
    ):
        try:
            parse()
        except BadRequest as e:
            assert 400 <= e.status < 500 and str(e)


@given(markup=st.text(max_size=200) | st.lists(st.sampled_from(
    ["<p>", "</p>", "<b x='1'>", "<br/>", "<!--", "-->", "<![CDATA[", "]]>", "<!DOCTYPE html>",
     "<?pi?>", "<script>", "</script>", "&amp;", "&#x;", "&", "<", ">", "Ein Hund", " "]
), max_size=30).map("".join))  # fmt: skip
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_html_is_split_and_joined_without_a_crash(markup: str) -> None:
    """Any text: its parts, or a MarkupError; text without markup comes back as it was."""
    try:
        parts = split_html(markup)
    except MarkupError:
        return
    nodes = text_nodes(parts)
    assert all(node and node == node.strip() for node in nodes)
    if not any(c in markup for c in "<&>"):
        assert join_html(parts, nodes) == markup
    assert join_html(parts, ["a < b & c"] * len(nodes)).count("&lt;") >= len(nodes)


@pytest.fixture(scope="module")
def live(serve_package: Path) -> Iterator[int]:
    """The real process, with small limits (the answers of generated requests come fast)."""
    proc, port = start_server(serve_package, "engine=ctranslate2", *SERVER)
    yield port
    assert stop_server(proc) == 0, server_log(proc)


def raw_post(port: int, path: str, body: bytes, content_type: str) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", path, body, {"Content-Type": content_type})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


@given(
    raw=bodies(),
    path=st.sampled_from(["/v1/translate", "/translate"]),
    content_type=st.sampled_from(
        [
            "application/json",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=b",
            "text/plain",
            "application/json; charset=latin-1",
        ]  # fmt: skip
    ),
)
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_the_live_server_answers_generated_bodies_without_a_5xx(
    live: int, raw: bytes, path: str, content_type: str
) -> None:
    status, kind, body = raw_post(live, path, raw, content_type)
    assert status < 500, (status, body)
    if status >= 400:
        assert kind.startswith("application/json"), (status, kind, body)
        assert isinstance(json.loads(body)["error"], str)


# ------------------------------------------------------------------------ OpenAPI


def test_the_openapi_document_follows_the_servers_limits(live: int) -> None:
    document = get(live, "/openapi.json")
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    expected = {"/health", "/ready", "/metrics", "/", "/v1/translate", "/translate",
                "/languages", "/openapi.json"}  # fmt: skip
    assert set(paths) == expected
    ours = paths["/v1/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    text = ours["properties"]["text"]
    assert (text["maxItems"], text["items"]["maxLength"]) == (4, 80)
    assert ours["properties"]["beam"]["maximum"] == 3
    libre = paths["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert libre["properties"]["alternatives"]["maximum"] == 2
    assert libre["properties"]["source"]["enum"] == ["auto", "de"]
    for path in ("/v1/translate", "/translate"):
        answers = paths[path]["post"]["responses"]
        assert {"400", "403", "413", "429", "503", "504"} <= set(answers)
        assert "Retry-After" in answers["503"]["headers"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert "text/html" in paths["/"]["get"]["responses"]["200"]["content"]
    # the limits it states are those the server enforces
    over = json.dumps({"text": ["a" * 81]}).encode()
    assert raw_post(live, "/v1/translate", over, "application/json")[0] == 413
    assert raw_post(live, "/v1/translate", b'{"text": ["a"], "beam": 4}', "")[0] == 400
    # max_segments (8 here), apart from max_batch_sentences (its default, 256)
    assert "at most 8 in a request" in libre["properties"]["q"]["description"]
    nine = json.dumps({"q": "\n".join(["a"] * 9), "source": "de", "target": "en"})
    status, _, body = raw_post(live, "/translate", nine.encode(), "application/json")
    assert status == 400 and "(max_segments=8)" in json.loads(body)["error"], body


def test_schemathesis_finds_every_answer_of_the_live_server_in_the_document(live: int) -> None:
    """Generated requests of each operation the server has (positive and negative): no 5xx,
    and each status, content type, header and body as the document says."""
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    base = f"http://127.0.0.1:{live}"
    # the document as served (from_url would leave its own path out)
    schema = schemathesis.openapi.from_dict(get(live, "/openapi.json"))
    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_headers_conformance, response_schema_conformance]  # fmt: skip
    operations = [result.ok() for result in schema.get_all_operations()]
    # the endpoints built elsewhere (readiness, metrics, the page) are tested once they exist
    served = [op for op in operations if routed(live, op.method.upper(), op.path)]
    assert {op.path for op in served} >= {"/health", "/v1/translate", "/translate",
                                          "/languages", "/openapi.json"}  # fmt: skip
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    strategy = st.one_of([op.as_strategy(generation_mode=mode) for op in served for mode in modes])

    @given(case=strategy)
    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    def conforms(case: Any) -> None:
        case.call_and_validate(base_url=base, checks=checks)

    conforms()


def routed(port: int, method: str, path: str) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, b"" if method == "POST" else None)
        response = connection.getresponse()
        response.read()
        return response.status != 404
    finally:
        connection.close()


def raw_exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` as it is and read the answer until the server closes the connection (an
    error answer closes it; the writing side stays open, since a client that has closed it may
    be given no answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return int(lines[0].split()[1]), headers, body


MALFORMED_HTTP = {
    "no request line": b"GARBAGE\r\n\r\n",
    "tls hello": bytes.fromhex("16030100a5010000a10303") + b"\x00" * 40,
    "header without colon": b"GET /health HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n",
    "nul in a header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "header line too long": b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: "
    + b"a" * 70000
    + b"\r\n\r\n",
    "content-length not a number": b"POST /translate HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: ten\r\n\r\n",
    "length and chunked": b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "bad chunk size": b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "http/9": b"GET /health HTTP/9.1\r\nHost: x\r\n\r\n",
    "request line too long": b"GET /" + b"a" * 10240 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "invalid method": b"G(T /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "space in a header name": b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n",
}


@pytest.mark.parametrize("kind", sorted(MALFORMED_HTTP))
def test_malformed_http_gets_a_4xx_json_error_and_serving_goes_on(live: int, kind: str) -> None:
    """What aiohttp's parser refuses before any handler runs is answered as every other
    refusal is: a 4xx with ``{"error": message}``, not a plain-text page."""
    status, headers, body = raw_exchange(live, MALFORMED_HTTP[kind])
    assert 400 <= status < 500, (kind, status, body[:200])
    assert headers["content-type"].startswith("application/json"), (kind, headers, body[:200])
    assert json.loads(body)["error"], (kind, body[:200])
    assert get(live, "/health")["status"] == "ok"


@pytest.fixture(scope="module")
def bare_servers() -> Iterator[dict[str, int]]:
    """The port of one small application served by aiohttp's own runner ("aiohttp") and by
    nmt-serve's (``JsonErrorRunner``, "nmt"), on an event loop in a thread of its own."""
    from aiohttp import web

    from nmt.serve.protocol import JsonErrorRunner

    async def health(request: Any) -> Any:
        return web.json_response({"status": "ok"})

    async def start(runner_class: type) -> Any:
        app = web.Application()
        app.router.add_get("/health", health)
        runner = runner_class(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners = {}
    try:
        for name, runner_class in (("aiohttp", web.AppRunner), ("nmt", JsonErrorRunner)):
            runners[name] = asyncio.run_coroutine_threadsafe(start(runner_class), loop).result(60)
        yield {name: runner.addresses[0][1] for name, runner in runners.items()}
    finally:
        for runner in runners.values():
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        loop.close()


@pytest.mark.parametrize("kind", sorted(MALFORMED_HTTP))
def test_malformed_http_keeps_aiohttps_status_and_words_in_a_json_body(
    bare_servers: dict[str, int], kind: str
) -> None:
    """The same bytes to aiohttp's runner and to nmt-serve's: the status is aiohttp's, the
    body JSON with aiohttp's message in place of its plain text, and both close the
    connection (``raw_exchange`` reads until they do)."""
    status, headers, body = raw_exchange(bare_servers["aiohttp"], MALFORMED_HTTP[kind])
    ours, our_headers, our_body = raw_exchange(bare_servers["nmt"], MALFORMED_HTTP[kind])
    assert ours == status and 400 <= status < 500, (kind, status, ours)
    assert headers["content-type"].startswith("text/plain"), (kind, headers)  # what it replaces
    assert our_headers["content-type"].startswith("application/json"), (kind, our_headers)
    error = json.loads(our_body)["error"]
    first = body.decode("utf-8").splitlines()[0]  # the parser's message, as aiohttp words it
    assert error.startswith(f"malformed HTTP request: {first[:100]}"), (kind, error, first)
    assert get(bare_servers["nmt"], "/health")["status"] == "ok"
