"""Who may use ``nmt-serve``: API keys (stored hashed, 403 without or with a wrong one, 429
past a key's limit), the refusal to listen beyond loopback without keys, and CORS for the
listed origins only."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient

from nmt.config import ConfigError
from nmt.serve.access import check_origins, is_loopback
from nmt.serve.app import make_app
from nmt.serve.backend import load_backend
from nmt.serve.keys import KeyRing, add_key

from .helpers import REPO
from .test_serve import package, run_app, serve_config, server_log, start_server  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

BODY = {"text": ["Ein Hund rennt."]}


def make_key(path: Path, *options: str) -> str:
    """A key made by the command, as a person makes one: printed once."""
    made = subprocess.run(
        [sys.executable, "-m", "nmt.serve.keys", "add", str(path), *options],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert len(key) >= 40 and "\n" not in key
    return key


def test_the_keys_file_holds_digests_never_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.jsonl"
    alice = make_key(path, "--name", "alice", "--rpm", "60")
    bob = make_key(path)
    text = path.read_text()
    assert alice not in text and bob not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines == [
        {"sha256": hashlib.sha256(alice.encode()).hexdigest(), "name": "alice", "rpm": 60},
        {"sha256": hashlib.sha256(bob.encode()).hexdigest()},
    ]
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner only
    ring = KeyRing.load(path)
    assert ring.find(alice).name == "alice" and ring.find(bob).rpm is None
    assert ring.find(alice + "x") is None and ring.check(bob) is None


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("not json", "not a JSON object"),
        ('["a"]', "not a JSON object"),
        ('{"sha256": "abc"}', "'sha256' must be the 64 hex digits"),
        ('{"sha256": "' + "g" * 64 + '"}', "'sha256' must be 64 hex digits"),
        ('{"name": "x"}', "'sha256' must be"),
        ('{"sha256": "' + "a" * 64 + '", "rpm": 0}', "'rpm' must be"),
        ('{"sha256": "' + "a" * 64 + '", "rpm": "60"}', "'rpm' must be"),
        ('{"sha256": "' + "a" * 64 + '", "name": 3}', "'name' must be a string"),
        ('{"sha256": "' + "a" * 64 + '", "key": "secret"}', "unknown key(s) ['key']"),
        ('{"sha256": "' + "b" * 64 + '"}', "the same key as line 2"),
    ],
)
def test_a_bad_line_of_the_keys_file_is_named(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "keys.jsonl"
    good = '{"sha256": "' + "b" * 64 + '"}'
    path.write_text(f"# our keys\n{good}\n\n{line}\n")
    with pytest.raises(ConfigError) as e:
        KeyRing.load(path)
    assert f"{path}, line 4" in str(e.value) and words in str(e.value)
    with pytest.raises(ConfigError, match="cannot be read"):
        KeyRing.load(tmp_path / "missing.jsonl")
    (tmp_path / "empty").write_text("# none yet\n")
    with pytest.raises(ConfigError, match="holds no key"):
        KeyRing.load(tmp_path / "empty")


def test_a_keys_limit_refuses_then_refills(tmp_path: Path) -> None:
    """rpm=2: two requests at once, then 429 with the seconds until the next one may come."""
    path = tmp_path / "keys.jsonl"
    key = add_key(path, "carol", rpm=2)
    now = [100.0]
    ring = KeyRing.load(path, clock=lambda: now[0])
    assert ring.check(key) is None and ring.check(key) is None
    refusal = ring.check(key)
    assert refusal is not None and refusal.status == 429 and refusal.retry_after == 30
    assert "carol" in refusal.message and "2 requests per minute" in refusal.message
    now[0] += 29.0
    assert ring.check(key).status == 429
    now[0] += 1.0
    assert ring.check(key) is None  # one more after 30 s
    assert ring.check(key).retry_after == 30
    now[0] += 3600.0  # an hour idle refills the bucket to its size, no more
    after = [ring.check(key) for _ in range(3)]
    assert after[:2] == [None, None] and after[2].status == 429


def test_requests_need_a_key_of_the_file(package: Path, tmp_path: Path) -> None:  # noqa: F811
    keys = tmp_path / "keys.jsonl"
    good, limited = add_key(keys, "dave"), add_key(keys, "erin", rpm=2)
    cfg = serve_config(package, "engine=torch", f"api_keys_file={keys}")
    app = make_app(load_backend(cfg), cfg)

    async def scenario(client: TestClient) -> None:
        for path in ("/v1/translate",):  # LibreTranslate's /translate: tests/test_serve_libre.py
            response = await client.post(path, json=BODY)
            assert response.status == 403
            assert "an API key is needed" in (await response.json())["error"]
            for headers in ({"Authorization": "Bearer nope"}, {"X-API-Key": good + "x"}):
                response = await client.post(path, json=BODY, headers=headers)
                assert response.status == 403, headers
                assert (await response.json())["error"] == "Invalid API key"
            for headers in ({"Authorization": f"Bearer {good}"}, {"X-API-Key": good}):
                response = await client.post(path, json=BODY, headers=headers)
                assert response.status == 200, await response.text()
                assert len((await response.json())["translations"]) == 1
        for path in ("/", "/health"):  # no key asked
            assert (await client.get(path)).status == 200, path
        statuses = []
        for _ in range(3):
            response = await client.post(
                "/v1/translate", json=BODY, headers={"Authorization": f"Bearer {limited}"}
            )
            statuses.append(response.status)
        assert statuses == [200, 200, 429]
        retry = int(response.headers["Retry-After"])
        assert 1 <= retry <= 30 and "erin" in (await response.json())["error"]

    run_app(app, scenario)


def test_cors_headers_only_for_a_listed_origin(package: Path, tmp_path: Path) -> None:  # noqa: F811
    listed, other = "https://app.example", "https://evil.example"
    keys = tmp_path / "keys.jsonl"
    key = add_key(keys)
    cfg = serve_config(
        package, "engine=torch", f"cors_origins=['{listed}']", f"api_keys_file={keys}"
    )
    app = make_app(load_backend(cfg), cfg)
    preflight = {"Access-Control-Request-Method": "POST"}
    auth = {"Authorization": f"Bearer {key}"}

    async def scenario(client: TestClient) -> None:
        answer = await client.options(
            "/v1/translate",
            headers={
                "Origin": listed,
                **preflight,
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert answer.status == 204  # no key asked of a preflight
        assert answer.headers["Access-Control-Allow-Origin"] == listed
        assert "POST" in answer.headers["Access-Control-Allow-Methods"]
        allowed = answer.headers["Access-Control-Allow-Headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
        answer = await client.options("/v1/translate", headers={"Origin": other, **preflight})
        assert answer.status == 403 and "Access-Control-Allow-Origin" not in answer.headers
        answer = await client.post("/v1/translate", json=BODY, headers={"Origin": listed, **auth})
        assert answer.status == 200 and answer.headers["Access-Control-Allow-Origin"] == listed
        assert "Origin" in answer.headers.getall("Vary")
        answer = await client.post("/v1/translate", json=BODY, headers={"Origin": listed})
        assert answer.status == 403  # an error a listed page can read
        assert answer.headers["Access-Control-Allow-Origin"] == listed
        answer = await client.get("/nothing", headers={"Origin": listed})
        assert answer.status in (403, 404)
        assert answer.headers["Access-Control-Allow-Origin"] == listed
        answer = await client.post("/v1/translate", json=BODY, headers={"Origin": other, **auth})
        assert answer.status == 200 and "Access-Control-Allow-Origin" not in answer.headers

    run_app(app, scenario)
    plain = serve_config(package, "engine=torch")  # no cors_origins: no CORS at all

    async def no_cors(client: TestClient) -> None:
        answer = await client.post("/v1/translate", json=BODY, headers={"Origin": listed})
        assert answer.status == 200 and "Access-Control-Allow-Origin" not in answer.headers
        answer = await client.options("/v1/translate", headers={"Origin": listed, **preflight})
        assert answer.status == 405

    run_app(make_app(load_backend(plain), plain), no_cors)


def test_origins_and_hosts() -> None:
    assert check_origins(["https://a.example", "http://localhost:3000", "http://[::1]:80"])
    for bad in ("*", "https://a.example/", "a.example", "ftp://a.example", "https://a b"):
        with pytest.raises(ConfigError, match=r"cors_origins\[1\]="):
            check_origins(["https://a.example", bad])
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "192.168.1.10", "example.org"):
        assert not is_loopback(host), host


def urlopen(port: int, path: str, body: dict | None = None, key: str = "") -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 0, server_log(proc)


@pytest.mark.slow(seconds=8)
def test_a_server_beyond_loopback_needs_keys_or_allow_open(
    package: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "nmt.serve", f"model={package}", "host=0.0.0.0", "port=0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert refused.returncode != 0 and refused.stdout == ""
    message = refused.stderr
    assert "host=0.0.0.0" in message and "api_keys_file" in message and "allow_open" in message
    proc, port = start_server(package, "engine=ctranslate2", "host=0.0.0.0", "allow_open=true")
    try:
        assert urlopen(port, "/v1/translate", BODY)[0] == 200  # open, as asked
        stop(proc)
        keys = tmp_path / "keys.jsonl"
        key = add_key(keys)
        proc, port = start_server(
            package, "engine=ctranslate2", "host=0.0.0.0", f"api_keys_file={keys}"
        )
        assert urlopen(port, "/v1/translate", BODY)[0] == 403
        status, answer = urlopen(port, "/v1/translate", BODY, key)
        assert status == 200 and len(answer["translations"]) == 1
        assert urlopen(port, "/health")[0] == 200
        stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    keys.write_text("{oops\n")
    bad = subprocess.run(
        [sys.executable, "-m", "nmt.serve", f"model={package}", f"api_keys_file={keys}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert bad.returncode != 0 and f"{keys}, line 1" in bad.stderr
