"""Choices settled by measuring, once per machine: the winner kept in a small JSON cache.

An entry is ``<cache dir>/<digest of its key>.json`` and holds ``{"key": key, <what>: the
winner, <figures>: what it was chosen by}``. The key (the machine, the versions and whatever
else the measurement depends on) is stored whole and compared on reading, so a file written
for another machine or setting is never taken for this one's answer. An entry that cannot be
read, or does not hold a consistent answer, is measured again and rewritten; entries are written
atomically (:mod:`nmt.atomic`), so a crash leaves the old entry or the new one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt.atomic import atomic_write_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    """A winner and the figures it was chosen by."""

    winner: str
    figures: dict[str, Any]  # kept in the cache entry beside the winner
    trusted: bool = True  # worth caching (False: used once, measured again next time)
    source: Path | None = None  # the cache file it was read from; None: measured now


@dataclass(frozen=True)
class ChoiceCache:
    """How one kind of measured choice is kept: ``what`` names the entry's field holding the
    winner (and the cache, in messages), ``figures`` the field holding the figures."""

    what: str
    figures: str
    options: Collection[str]  # the winners an entry may name
    # raises ValueError (or TypeError, KeyError) where a read entry's figures contradict it
    check: Callable[[Choice], None] | None = None

    def choose(
        self, cache_dir: Path | None, key: dict[str, Any], measure: Callable[[], Choice]
    ) -> Choice:
        """The choice cached for ``key`` in ``cache_dir``, else ``measure()`` (cached when
        trusted). ``cache_dir`` None: measured, nothing read or written."""
        path = cache_file(cache_dir, key) if cache_dir is not None else None
        cached = self.read(path, key) if path is not None else None
        if cached is not None:
            return cached
        choice = measure()
        if choice.trusted and path is not None:
            self.write(path, key, choice)
        return choice

    def read(self, path: Path, key: dict[str, Any]) -> Choice | None:
        """The choice stored in ``path`` for ``key``; None when absent, or (with a warning)
        unusable."""
        if not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            if entry.get("key") != key:
                raise ValueError("it was written for another machine or setting")
            choice = Choice(entry[self.what], entry[self.figures], source=path)
            if choice.winner not in self.options or not isinstance(choice.figures, dict):
                raise ValueError(f"it names no {self.what} to choose")
            if self.check is not None:
                self.check(choice)
            return choice
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("ignoring the %s cache %s (%s); measuring again", self.what, path, e)
            return None

    def write(self, path: Path, key: dict[str, Any], choice: Choice) -> None:
        entry = {"key": key, self.what: choice.winner, self.figures: choice.figures}
        try:
            atomic_write_bytes(path, (json.dumps(entry, indent=2) + "\n").encode())
        except OSError as e:
            log.warning("could not write the %s cache %s: %s", self.what, path, e)


def cache_file(cache_dir: Path, key: dict[str, Any]) -> Path:
    """Where the entry for ``key`` lives: named by a digest of the key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir / f"{digest}.json"
