"""API keys: the file of keys a server accepts, stored as SHA-256 digests, each with an
optional name and an optional limit of requests per minute.

The file (``api_keys_file``) holds one JSON object a line, blank lines and ``#`` comments
aside::

    {"sha256": "9f86d0...", "name": "alice", "rpm": 60}

``python -m nmt.serve.keys add FILE [--name NAME] [--rpm N]`` makes a random key, prints it
once and appends its line: the file never holds a key itself. A server loads the file into a
:class:`KeyRing` and asks :meth:`KeyRing.check` about each request's key, wherever the request
carries it (a header for our endpoint, a body field for another).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from nmt.config import ConfigError

ENTRY_KEYS = ("sha256", "name", "rpm")
MISSING_KEY = "an API key is needed: send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
INVALID_KEY = "Invalid API key"


class Refusal(NamedTuple):
    """Why a request is refused: its HTTP status, the message of its ``{"error"}`` body and,
    for 429, the seconds to wait (``Retry-After``)."""

    status: int
    message: str
    retry_after: int | None = None


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass
class KeyEntry:
    """One key of the file: its digest, name, limit and its bucket of requests (a token
    bucket that holds ``rpm`` requests and refills at ``rpm`` a minute)."""

    sha256: bytes
    name: str
    rpm: int | None
    tokens: float = 0.0
    updated: float = 0.0


def _entry(line: str, where: str) -> KeyEntry:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not a JSON object ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f'{where}: not a JSON object such as {{"sha256": "..."}}')
    unknown = sorted(set(obj) - set(ENTRY_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {list(ENTRY_KEYS)}")
    hex_digest = obj.get("sha256")
    if not isinstance(hex_digest, str) or len(hex_digest) != 64:
        raise ConfigError(f"{where}: 'sha256' must be the 64 hex digits of the key's SHA-256")
    try:
        raw = bytes.fromhex(hex_digest)
    except ValueError:
        raise ConfigError(f"{where}: 'sha256' must be 64 hex digits, not {hex_digest!r}") from None
    name = obj.get("name", "")
    if not isinstance(name, str):
        raise ConfigError(f"{where}: 'name' must be a string")
    rpm = obj.get("rpm")
    if rpm is not None and (isinstance(rpm, bool) or not isinstance(rpm, int) or rpm < 1):
        raise ConfigError(f"{where}: 'rpm' must be a whole number of requests per minute >= 1")
    return KeyEntry(raw, name, rpm)


class KeyRing:
    """The keys a server accepts. ``clock`` (seconds, monotonic) measures the limits."""

    def __init__(
        self, entries: Sequence[KeyEntry], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.entries = list(entries)
        self.clock = clock
        self.lock = threading.Lock()
        now = clock()
        for entry in self.entries:
            entry.tokens = float(entry.rpm or 0)
            entry.updated = now

    @classmethod
    def load(cls, path: str | Path, clock: Callable[[], float] = time.monotonic) -> KeyRing:
        """The keys of a file; :class:`ConfigError` naming the file and line of a bad one."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"api_keys_file={path}: cannot be read ({e})") from None
        entries, seen = [], {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            where = f"{path}, line {number}"
            entry = _entry(line, where)
            if entry.sha256 in seen:
                raise ConfigError(f"{where}: the same key as line {seen[entry.sha256]}")
            seen[entry.sha256] = number
            entries.append(entry)
        if not entries:
            raise ConfigError(
                f"api_keys_file={path} holds no key: add one with python -m nmt.serve.keys add"
            )
        return cls(entries, clock)

    def find(self, key: str) -> KeyEntry | None:
        """The entry of ``key``: its digest is compared with every entry's, each comparison in
        constant time, so that the time taken tells nothing of the digests held."""
        wanted, found = digest(key), None
        for entry in self.entries:
            if hmac.compare_digest(wanted, entry.sha256):
                found = entry
        return found

    def check(self, key: str | None) -> Refusal | None:
        """None when ``key`` may make a request now (the request is counted), else why not:
        403 for no key or an unknown one, 429 past the key's limit with the seconds to wait."""
        if not key:
            return Refusal(403, MISSING_KEY)
        entry = self.find(key)
        if entry is None:
            return Refusal(403, INVALID_KEY)
        if entry.rpm is None:
            return None
        with self.lock:
            now = self.clock()
            rate = entry.rpm / 60.0  # requests a second
            entry.tokens = min(float(entry.rpm), entry.tokens + (now - entry.updated) * rate)
            entry.updated = now
            if entry.tokens >= 1.0:
                entry.tokens -= 1.0
                return None
            wait = max(1, math.ceil((1.0 - entry.tokens) / rate))
        who = f"key '{entry.name}'" if entry.name else "this key"
        return Refusal(
            429,
            f"Slowdown: {who} is over its limit of {entry.rpm} requests per minute; "
            f"retry after {wait} s",
            wait,
        )


def request_key(headers: dict | object) -> str | None:
    """The key of a request to our endpoint: ``Authorization: Bearer KEY`` or ``X-API-Key``."""
    auth = headers.get("Authorization", "")  # type: ignore[attr-defined]
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get("X-API-Key") or None  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- the command


def add_key(path: Path, name: str = "", rpm: int | None = None) -> str:
    """Make a random key, append its digest's line to ``path`` (made, readable by its owner
    only, when missing) and return the key."""
    if rpm is not None and rpm < 1:
        raise ConfigError(f"--rpm {rpm} must be >= 1")
    if path.exists():
        KeyRing.load(path)  # refuse to append to a file the server would refuse
    key = secrets.token_urlsafe(32)
    entry: dict[str, object] = {"sha256": digest(key).hex()}
    if name:
        entry["name"] = name
    if rpm is not None:
        entry["rpm"] = rpm
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        if f.tell() > 0 and not path.read_bytes().endswith(b"\n"):
            f.write("\n")
        f.write(json.dumps(entry) + "\n")
    return key


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m nmt.serve.keys",
        description="Keys of nmt-serve's api_keys_file (stored as SHA-256 digests).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="make a key, print it once and store its digest")
    add.add_argument("file", type=Path, help="the keys file (made when missing)")
    add.add_argument("--name", default="", help="who the key is for (in 429 messages)")
    add.add_argument("--rpm", type=int, default=None, help="requests per minute (no limit)")
    args = parser.parse_args(argv)
    try:
        key = add_key(args.file, args.name, args.rpm)
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")
    print(key)


if __name__ == "__main__":
    main()
