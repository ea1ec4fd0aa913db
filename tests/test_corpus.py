"""Multi30k fetching (copy from a mirror, download, sha256 verification, stale temporaries)
and corpus reading (plain and gzip files, encodings, line alignment)."""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.atomic import atomic_write_bytes, sha256_file
from nmt.data import corpus
from nmt.data.corpus import (
    MULTI30K_SPLITS,
    DataError,
    clean_pairs,
    fetch_multi30k,
    multi30k_url,
    read_lines,
    read_parallel,
    resolve_pair,
)
from nmt.environment import (
    MULTI30K_MIRROR,
    MULTI30K_OFFICIAL_URL,
    MULTI30K_URL,
    Multi30kSource,
    multi30k_source,
)

from .helpers import write_file as write

FAST = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served over HTTP on localhost; yields (directory, base URL)."""
    served = tmp_path / "served"
    served.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# --------------------------------------------------------------------------- fetching


def test_fetch_gives_full_splits(multi30k_root: Path) -> None:
    base = multi30k_root / "multi30k"
    for split, n in zip(MULTI30K_SPLITS, (29_000, 1_014, 1_000), strict=True):
        de, en = read_parallel(base / f"{split}.de.gz", base / f"{split}.en.gz")
        assert len(de) == len(en) == n


def test_fetch_again_copies_nothing(multi30k_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = sorted((multi30k_root / "multi30k").iterdir())
    before = {p.name: p.stat().st_mtime_ns for p in files}

    def fail(*args, **kwargs):
        raise AssertionError("fetched a file that was already there")

    monkeypatch.setattr(corpus, "_copy_from_mirror", fail)
    monkeypatch.setattr(corpus, "_download", fail)
    got = fetch_multi30k(multi30k_root, ["de", "en"], MULTI30K_SPLITS, Multi30kSource())
    assert got == multi30k_root / "multi30k"
    assert {p.name: p.stat().st_mtime_ns for p in files} == before


def test_corrupted_local_file_is_replaced(
    tmp_path: Path, multi30k: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Multi30kSource(mirror=multi30k)
    base = fetch_multi30k(tmp_path, ["de"], ["val"], source)
    target = base / "val.de.gz"
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))
    fetch_multi30k(tmp_path, ["de"], ["val"], source)
    assert sha256_file(target) == corpus.MULTI30K_SHA256["val.de.gz"]


def test_mirror_with_wrong_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad_mirror = tmp_path / "mirror"
    bad_mirror.mkdir()
    write(bad_mirror / "val.de.gz", b"not the real file\n")
    source = Multi30kSource(mirror=bad_mirror)
    with pytest.raises(DataError, match=r"val\.de\.gz.*expected f0cba2f9.*got") as err:
        fetch_multi30k(tmp_path / "root", ["de"], ["val"], source)
    assert str(bad_mirror / "val.de.gz") in str(err.value)
    assert list((tmp_path / "root" / "multi30k").iterdir()) == []


def test_mirror_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = Multi30kSource(mirror=tmp_path)
    with pytest.raises(DataError, match=r"no file 'val\.de\.gz'"):
        fetch_multi30k(tmp_path / "root", ["de"], ["val"], source)


def test_unreachable_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = Multi30kSource(url="http://127.0.0.1:9")
    with pytest.raises(DataError, match="could not download") as err:
        fetch_multi30k(tmp_path, ["en"], ["val"], source)
    for part in ("http://127.0.0.1:9/val.en.gz", MULTI30K_MIRROR, MULTI30K_URL):
        assert part in str(err.value)
    assert list((tmp_path / "multi30k").iterdir()) == []


def test_the_source_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTI30K_URL, raising=False)
    monkeypatch.delenv(MULTI30K_MIRROR, raising=False)
    assert multi30k_source() == Multi30kSource(None, MULTI30K_OFFICIAL_URL)
    assert multi30k_url(multi30k_source(), "val", "de") == MULTI30K_OFFICIAL_URL + "/val.de.gz"
    assert MULTI30K_OFFICIAL_URL.startswith("https://")
    monkeypatch.setenv(MULTI30K_URL, "http://mirror.example/m30k/")
    monkeypatch.setenv(MULTI30K_MIRROR, "/some/dir")
    assert multi30k_source().mirror == Path("/some/dir")
    assert (
        multi30k_url(multi30k_source(), "test_2016_flickr", "en")
        == "http://mirror.example/m30k/test_2016_flickr.en.gz"
    )
    monkeypatch.setenv(MULTI30K_URL, "mirror.example/m30k")
    with pytest.raises(DataError, match=r"NMT_MULTI30K_URL='mirror\.example/m30k' is not a URL"):
        multi30k_url(multi30k_source(), "val", "de")


def test_without_a_source_only_files_already_there_are_used(
    tmp_path: Path, multi30k_root: Path
) -> None:
    assert fetch_multi30k(multi30k_root, ["de"], ["val"], None) == multi30k_root / "multi30k"
    with pytest.raises(DataError, match=r"val\.de\.gz is missing, and no Multi30k source"):
        fetch_multi30k(tmp_path, ["de"], ["val"], None)


def test_held_out_test_sets_are_fetched_when_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The later shared tasks' test sets are valid split names (fetched like the others, from
    the mirror or the URL, and verified); a side the set does not have is named."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for lang, line in (("en", "A dog runs."), ("de", "Ein Hund rennt.")):
        data = gzip.compress(f"{line}\n".encode())
        (mirror / f"test_2017_mscoco.{lang}.gz").write_bytes(data)
        name = f"test_2017_mscoco.{lang}.gz"
        monkeypatch.setitem(corpus.MULTI30K_SHA256, name, hashlib.sha256(data).hexdigest())
    source = Multi30kSource(mirror=mirror)
    base = fetch_multi30k(tmp_path / "root", ["en", "de"], ["test_2017_mscoco"], source)
    got = read_parallel(base / "test_2017_mscoco.en.gz", base / "test_2017_mscoco.de.gz")
    assert got == (["A dog runs."], ["Ein Hund rennt."])
    with pytest.raises(DataError, match="test_2017_flickr has no cs side; it has en, de, fr"):
        fetch_multi30k(tmp_path / "root", ["en", "cs"], ["test_2017_flickr"], source)
    with pytest.raises(DataError, match="unknown Multi30k split.*'test_2019'.*test_2018_flickr"):
        fetch_multi30k(tmp_path / "root", ["en"], ["test_2019"], source)
    for split in corpus.MULTI30K_HELD_OUT:  # every held-out set has a pinned English side
        assert f"{split}.en.gz" in corpus.MULTI30K_SHA256


def test_download_verifies_and_renames(
    tmp_path: Path, multi30k: Path, http_dir: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh root filled through NMT_MULTI30K_URL (an HTTP mirror) gets verified files."""
    served, url = http_dir
    for name in ("val.de.gz", "val.en.gz"):
        (served / name).write_bytes((multi30k / name).read_bytes())
    source = Multi30kSource(url=url)
    base = fetch_multi30k(tmp_path / "root", ["de", "en"], ["val"], source)
    for name in ("val.de.gz", "val.en.gz"):
        assert sha256_file(base / name) == corpus.MULTI30K_SHA256[name]
    assert sorted(p.name for p in base.iterdir()) == ["val.de.gz", "val.en.gz"]
    de, en = read_parallel(base / "val.de.gz", base / "val.en.gz")
    assert len(de) == len(en) == 1014


def test_download_with_wrong_bytes_is_refused(
    tmp_path: Path, multi30k: Path, http_dir: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    served, url = http_dir
    (served / "val.en.gz").write_bytes((multi30k / "val.en.gz").read_bytes())
    (served / "val.de.gz").write_bytes(gzip.compress(b"Ein Hund.\n"))
    source = Multi30kSource(url=url + "/")
    with pytest.raises(DataError, match=r"sha256 mismatch for val\.de\.gz") as err:
        fetch_multi30k(tmp_path, ["en", "de"], ["val"], source)
    assert f"{url}/val.de.gz" in str(err.value)
    assert sorted(p.name for p in (tmp_path / "multi30k").iterdir()) == ["val.en.gz"]


def _hold(path: Path) -> int:
    """Open ``path`` and take its lock, as a running transfer holds its temporary file."""
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_stale_temporary_files_are_deleted_before_fetching(
    tmp_path: Path, multi30k: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "multi30k"
    base.mkdir()
    stale = [base / ".val.de.gz.k3x_9q2a.tmp", base / ".val.de.gz.0abcdefg.tmp"]
    others = [
        base / ".val.en.gz.k3x_9q2a.tmp",  # another file's
        base / ".val.de.gz.tmp",  # not a temporary-file name
        base / "val.de.gz.k3x_9q2a.tmp",
        base / ".val.de.gz.old.k3x_9q2a.tmp",  # the temporary file of "val.de.gz.old"
    ]
    live = base / ".val.de.gz.running1.tmp"  # a transfer in progress elsewhere
    for path in [*stale, *others, live]:
        path.write_bytes(b"half a file")
    source = Multi30kSource(mirror=multi30k)
    fd = _hold(live)
    try:
        fetch_multi30k(tmp_path, ["de"], ["val"], source)
    finally:
        os.close(fd)
    assert sha256_file(base / "val.de.gz") == corpus.MULTI30K_SHA256["val.de.gz"]
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in [*others, live])


def test_atomic_write_deletes_its_stale_temporary_files(tmp_path: Path) -> None:
    stale = tmp_path / ".spm.model.x1y2z3w4.tmp"
    stale.write_bytes(b"half")
    atomic_write_bytes(tmp_path / "spm.model", b"whole")
    assert (tmp_path / "spm.model").read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model"]


def test_truncated_download_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Truncating(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.wfile.write(b"x" * 1000)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Truncating)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        source = Multi30kSource(url=f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(DataError, match="could not download"):
            fetch_multi30k(tmp_path, ["en"], ["val"], source)
    finally:
        server.shutdown()
        server.server_close()
    assert list((tmp_path / "multi30k").iterdir()) == []


def test_unknown_split_or_language(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="valid: train, val, test_2016_flickr"):
        fetch_multi30k(tmp_path, ["de"], ["test_2099"], None)
    with pytest.raises(DataError, match="'xx'.*valid: en, de, fr, cs"):
        fetch_multi30k(tmp_path, ["xx"], ["val"], None)


# --------------------------------------------------------------------------- reading


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        read_lines(tmp_path / "nope.de")
    write(tmp_path / "c.de", b"a\n")
    with pytest.raises(DataError, match=r"c\.en.*c\.en\.gz"):
        resolve_pair(tmp_path / "c", "de", "en")


def test_resolve_pair_plain_and_gz(tmp_path: Path) -> None:
    write(tmp_path / "c.de", b"a\n")
    write(tmp_path / "c.en.gz", b"b\n")
    assert resolve_pair(str(tmp_path / "c"), "de", "en") == (
        tmp_path / "c.de",
        tmp_path / "c.en.gz",
    )


def test_line_counts_differ(tmp_path: Path) -> None:
    src = write(tmp_path / "x.de", b"a\nb\nc\n")
    tgt = write(tmp_path / "x.en", b"a\nb\n")
    with pytest.raises(DataError, match=r"x\.de has 3 lines.*x\.en has 2 lines"):
        read_parallel(src, tgt)


@pytest.mark.parametrize("name", ["bad.txt", "bad.txt.gz"])
def test_invalid_utf8_names_file_and_line(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name, "one\ntwo\nthr\xe9e\n".encode("latin-1"))
    with pytest.raises(DataError, match=rf"{name}:3: invalid UTF-8"):
        read_lines(path)


def test_corrupt_gzip(tmp_path: Path) -> None:
    path = tmp_path / "x.gz"
    path.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(DataError, match=r"x\.gz"):
        read_lines(path)


def test_bom_crlf_nul_and_separators(tmp_path: Path) -> None:
    text = "\ufeffa b\r\nc\u2028d\x0be\x0cf\x1cg\x85h\r\ni\0j\n\nlast"
    src = write(tmp_path / "p.de.gz", text.encode())
    tgt = write(tmp_path / "p.en", b"1\n2\n3\n4\n5\n")
    de, en = read_parallel(src, tgt)
    assert de == ["a b", "c\u2028d\x0be\x0cf\x1cg\x85h", "i j", "", "last"]
    assert len(de) == len(en)


def test_empty_file(tmp_path: Path) -> None:
    assert read_lines(write(tmp_path / "e.txt", b"")) == []
    assert read_lines(write(tmp_path / "b.txt", b"\xef\xbb\xbf")) == []


@FAST
@given(data=st.binary(max_size=200))
def test_read_lines_random_bytes(tmp_path: Path, data: bytes) -> None:
    path = write(tmp_path / "r.txt", data)
    try:
        lines = read_lines(path)
    except DataError as err:
        assert "r.txt" in str(err)
        return
    assert all("\n" not in line for line in lines)


@FAST
@given(
    lines=st.lists(
        st.text(
            alphabet=st.characters(blacklist_characters="\n\r\0\ufeff", blacklist_categories=["Cs"])
        )
    )
)
def test_read_lines_round_trip(tmp_path: Path, lines: list[str]) -> None:
    path = write(tmp_path / "t.txt.gz", "".join(x + "\n" for x in lines).encode())
    assert read_lines(path) == lines


def test_clean_pairs() -> None:
    src, tgt, stats = clean_pairs([" a ", "", "b", " \t", "c"], ["x", "y", "  ", "z", " w\t"])
    assert (src, tgt) == (["a", "c"], ["x", "w"])
    assert stats == {"read": 5, "dropped_empty": 3, "kept": 2}
