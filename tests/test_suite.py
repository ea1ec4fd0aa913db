"""The suite's own set-up (pyproject.toml, tests/conftest.py): warnings from nmt fail the test
that raised them, the longest tests run first, and each worker of ``make test`` gets its share
of the cores."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from .conftest import pytest_collection_modifyitems, pytest_configure, worker_groups


def test_a_warning_raised_from_nmt_is_an_error() -> None:
    with pytest.raises(DeprecationWarning, match="old call"):
        warnings.warn_explicit("old call", DeprecationWarning, "e.py", 1, "nmt.decode.engines")
    with pytest.raises(UserWarning):
        warnings.warn_explicit("odd input", UserWarning, "nmt/cli.py", 1, "nmt")


def test_a_warning_raised_elsewhere_is_only_reported() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn_explicit("old call", DeprecationWarning, "x.py", 1, "nmtlike.x")
        warnings.warn_explicit("old call", DeprecationWarning, "x.py", 1, "torch.nn")
    assert len(seen) == 2


class Item(SimpleNamespace):
    def get_closest_marker(self, name: str):
        return self.marks.get(name)


def test_the_longest_tests_come_first_and_the_others_keep_their_order() -> None:
    def item(name: str, seconds: float | None = None, slow: bool = False) -> Item:
        marks = {}
        if slow or seconds is not None:
            kwargs = {} if seconds is None else {"seconds": seconds}
            marks["slow"] = pytest.mark.slow(**kwargs).mark
        return Item(name=name, marks=marks)

    items = [item("a"), item("b", 10), item("c"), item("d", 190), item("e", slow=True), item("f")]
    pytest_collection_modifyitems(SimpleNamespace(), items)
    assert [i.name for i in items] == ["d", "b", "a", "c", "e", "f"]


def test_each_worker_takes_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    threads = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        pytest_configure(SimpleNamespace(workerinput={"workercount": 2}))
        share = max(1, (os.cpu_count() or 1) // 2)
        assert torch.get_num_threads() == share
        assert os.environ["OMP_NUM_THREADS"] == str(share)
        torch.set_num_threads(threads)
        pytest_configure(SimpleNamespace())  # not a worker: nothing changes
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(threads)


def test_slow_tests_are_dealt_evenly_and_modules_stay_together() -> None:
    def item(nodeid: str, seconds: float = 0) -> Item:
        marks = {"slow": pytest.mark.slow(seconds=seconds).mark} if seconds else {}
        return Item(nodeid=nodeid, marks=marks)

    items = [
        item("tests/test_a.py::one"),
        item("tests/test_a.py::two"),
        item("tests/test_b.py::long", 190),
        item("tests/test_b.py::short"),
        item("tests/test_c.py::x", 85),
        item("tests/test_c.py::y", 58),
        item("tests/test_d.py::z", 45),
    ]
    groups = worker_groups(items, 2)
    assert groups["tests/test_b.py::long"] == "slow-0"
    assert {groups[f"tests/test_{t}"] for t in ("c.py::x", "c.py::y", "d.py::z")} == {"slow-1"}
    assert groups["tests/test_a.py::one"] == groups["tests/test_a.py::two"] == "tests/test_a.py"
    assert groups["tests/test_b.py::short"] == "tests/test_b.py"


def test_the_tests_of_a_costly_session_fixture_share_a_worker() -> None:
    items = [
        Item(nodeid="tests/test_a.py::one", marks={}, fixturenames=["trained_runs", "tmp_path"]),
        Item(nodeid="tests/test_a.py::two", marks={}, fixturenames=["tmp_path"]),
        Item(nodeid="tests/test_b.py::three", marks={}, fixturenames=["trained_runs"]),
    ]
    groups = worker_groups(items, 2)
    assert groups["tests/test_a.py::one"] == groups["tests/test_b.py::three"] == "trained_runs"
    assert groups["tests/test_a.py::two"] == "tests/test_a.py"


def test_the_slow_tests_of_a_costly_session_fixture_are_dealt_as_one() -> None:
    """One worker makes the fixture for all its tests, slow or not; the other never waits."""

    def item(nodeid: str, seconds: float = 0, *fixtures: str) -> Item:
        marks = {"slow": pytest.mark.slow(seconds=seconds).mark} if seconds else {}
        return Item(nodeid=nodeid, marks=marks, fixturenames=list(fixtures))

    items = [
        item("tests/test_m.py::a", 25, "multilingual_runs"),
        item("tests/test_m.py::b", 10, "multilingual_runs", "tmp_path"),
        item("tests/test_n.py::c", 0, "multilingual_runs"),
        item("tests/test_q.py::long", 30),
        item("tests/test_q.py::short", 20),
        item("tests/test_r.py::both", 0, "trained_runs", "multilingual_runs"),
        item("tests/test_r.py::trained", 5, "trained_runs"),
    ]
    groups = worker_groups(items, 2)
    # the two fixtures' 40 s go as one, the longest first: slow-0; then 30 s and 20 s fill in
    together = ("m.py::a", "m.py::b", "n.py::c", "r.py::both", "r.py::trained")
    assert {groups[f"tests/test_{t}"] for t in together} == {"slow-0"}
    assert groups["tests/test_q.py::long"] == "slow-1"
    assert groups["tests/test_q.py::short"] == "slow-1"


@pytest.mark.slow(seconds=6)
def test_the_installed_pytest_and_xdist_keep_a_group_on_one_worker(tmp_path: Path) -> None:
    """``make test``'s groups reach the scheduler only if pytest keeps the group that xdist's
    workers write into each test's node id (pytest 9.2 does not)."""
    (tmp_path / "test_grouped.py").write_text(
        "import os\n"
        "import pytest\n\n\n"
        "@pytest.mark.xdist_group('together')\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "def test_one(i):\n"
        "    with open(f'ran-{i}', 'w') as f:\n"
        "        f.write(os.environ['PYTEST_XDIST_WORKER'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {p.read_text() for p in tmp_path.glob("ran-*")}
    assert len(list(tmp_path.glob("ran-*"))) == 8
    assert len(workers) == 1, f"the group ran on {sorted(workers)}"
