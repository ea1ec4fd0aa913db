"""A measured choice kept per machine in a JSON cache (nmt.runtime.measured)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from nmt.runtime.measured import Choice, ChoiceCache, cache_file

MACHINE = {"machine": {"cpu": "A", "threads": 2}, "options": {"beam": 5}}


class Stopwatch:
    """A measurement whose answer is given, counting how often it runs."""

    def __init__(self, winner: str, trusted: bool = True) -> None:
        self.winner, self.trusted, self.calls = winner, trusted, 0

    def __call__(self) -> Choice:
        self.calls += 1
        figures = {"fast": 2.0, "slow": 1.0}
        if self.winner == "slow":
            figures = {"fast": 1.0, "slow": 2.0}
        return Choice(self.winner, figures, self.trusted)


def faster_is_named(choice: Choice) -> None:
    if choice.winner != max(choice.figures, key=lambda name: choice.figures[name]):
        raise ValueError("its figures do not match its choice")


CACHE = ChoiceCache("speed", "per_second", ("fast", "slow"), faster_is_named)


def test_a_cached_choice_is_not_measured_again(tmp_path: Path) -> None:
    first = Stopwatch("fast")
    choice = CACHE.choose(tmp_path, MACHINE, first)
    assert (choice.winner, choice.source, first.calls) == ("fast", None, 1)
    again = Stopwatch("slow")  # a measurement now would say otherwise
    choice = CACHE.choose(tmp_path, MACHINE, again)
    assert again.calls == 0
    assert choice == Choice(
        "fast", {"fast": 2.0, "slow": 1.0}, source=cache_file(tmp_path, MACHINE)
    )


def test_the_entry_keeps_its_name_and_layout(tmp_path: Path) -> None:
    """Caches written before stay valid: the file is named by the key's digest and holds the
    key, the winner and the figures under the names given."""
    CACHE.choose(tmp_path, MACHINE, Stopwatch("slow"))
    digest = hashlib.sha256(json.dumps(MACHINE, sort_keys=True).encode()).hexdigest()[:16]
    assert [p.name for p in tmp_path.iterdir()] == [f"{digest}.json"]
    entry = json.loads((tmp_path / f"{digest}.json").read_text())
    assert entry == {"key": MACHINE, "speed": "slow", "per_second": {"fast": 1.0, "slow": 2.0}}


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: "{ not json",
        lambda e: "",
        lambda e: json.dumps([1, 2]),
        lambda e: json.dumps({**e, "speed": "slow"}),  # contradicts its figures
        lambda e: json.dumps({**e, "speed": "warp"}),  # not an option
        lambda e: json.dumps({**e, "per_second": [2.0, 1.0]}),
        lambda e: json.dumps({k: v for k, v in e.items() if k != "per_second"}),
        lambda e: json.dumps({**e, "key": {**e["key"], "options": {"beam": 1}}}),
    ],
)
def test_a_damaged_entry_is_measured_again_and_rewritten(tmp_path: Path, damage, caplog) -> None:
    CACHE.choose(tmp_path, MACHINE, Stopwatch("fast"))
    file = cache_file(tmp_path, MACHINE)
    file.write_text(damage(json.loads(file.read_text())))
    again = Stopwatch("slow")
    with caplog.at_level(logging.WARNING, logger="nmt.runtime.measured"):
        assert CACHE.choose(tmp_path, MACHINE, again).winner == "slow"
    assert again.calls == 1
    assert "ignoring the speed cache" in caplog.text and str(file) in caplog.text
    assert json.loads(file.read_text())["speed"] == "slow"
    assert list(tmp_path.iterdir()) == [file]  # written through a temporary file, none left


def test_the_key_separates_machines(tmp_path: Path) -> None:
    CACHE.choose(tmp_path, MACHINE, Stopwatch("fast"))
    other = {**MACHINE, "machine": {"cpu": "B", "threads": 2}}
    elsewhere = Stopwatch("slow")
    assert CACHE.choose(tmp_path, other, elsewhere).winner == "slow"
    assert elsewhere.calls == 1
    assert len(list(tmp_path.glob("*.json"))) == 2
    assert CACHE.choose(tmp_path, MACHINE, Stopwatch("slow")).winner == "fast"  # both kept


def test_an_untrusted_or_uncached_measurement_is_used_and_not_kept(tmp_path: Path) -> None:
    noisy = Stopwatch("slow", trusted=False)
    for _ in range(2):
        assert CACHE.choose(tmp_path, MACHINE, noisy).winner == "slow"
    assert noisy.calls == 2 and not list(tmp_path.iterdir())
    nowhere = Stopwatch("fast")
    for _ in range(2):
        assert CACHE.choose(None, MACHINE, nowhere).winner == "fast"
    assert nowhere.calls == 2


def test_an_unwritable_cache_warns_and_still_answers(tmp_path: Path, caplog) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache directory should be
    with caplog.at_level(logging.WARNING, logger="nmt.runtime.measured"):
        assert CACHE.choose(blocked / "cache", MACHINE, Stopwatch("fast")).winner == "fast"
    assert "could not write the speed cache" in caplog.text
