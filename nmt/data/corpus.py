"""Finding, fetching and reading parallel text.

Multi30k task 1 is fetched into ``<root>/multi30k`` (from the directory ``NMT_MULTI30K_MIRROR``,
or downloaded from ``NMT_MULTI30K_URL``, by default the official URL) and every file is checked
against a pinned sha256. User corpora are pairs of files
``<prefix>.<lang>`` (optionally ``.gz``) with one sentence per line, UTF-8.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from nmt.atomic import atomic_file, sha256_file
from nmt.cli import Advance, UserError, no_progress
from nmt.environment import MULTI30K_MIRROR, MULTI30K_URL, Multi30kSource

log = logging.getLogger(__name__)

MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
# the later shared tasks' test sets, fetched only when named (data.test, nmt-eval test=[...]):
# 2017's have no Czech side
MULTI30K_HELD_OUT = ("test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")
MULTI30K_LANGS = ("en", "de", "fr", "cs")
MULTI30K_SHA256 = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "test_2018_flickr.cs.gz": "7d0a9db904f94c554a8c58049a9f3a5357c27f46cc3d710d70cb0b4a2585b8c2",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
}
DOWNLOAD_TIMEOUT_S = 60.0
_CHUNK = 1 << 20
_BOM = b"\xef\xbb\xbf"


class DataError(UserError):
    """Bad or missing input data; the message names the file (and line) and the problem."""


# --------------------------------------------------------------------------- Multi30k


def fetch_multi30k(
    root: Path, langs: Iterable[str], splits: Iterable[str], source: Multi30kSource | None
) -> Path:
    """Make verified Multi30k files ``<split>.<lang>.gz`` available; return ``root/multi30k``.

    A file already present with the right sha256 is used as is. Otherwise it is copied from
    ``source.mirror`` or, without one, downloaded from ``source.url`` (the commands' source is
    :func:`nmt.environment.multi30k_source`); with no ``source`` a missing file is an error.
    Files are written under a temporary name, verified, then renamed, so a failed or partial
    transfer never appears under the final name; temporary files that a killed transfer left
    are deleted first.
    """
    langs, splits = list(langs), list(splits)
    _check_choices("split", splits, MULTI30K_SPLITS + MULTI30K_HELD_OUT)
    _check_choices("language", langs, MULTI30K_LANGS)
    for split in splits:
        has = multi30k_languages(split)
        missing = [lang for lang in langs if lang not in has]
        if missing:
            raise DataError(
                f"Multi30k's {split} has no {', '.join(missing)} side; it has {', '.join(has)}"
            )
    dest_dir = Path(root) / "multi30k"
    dest_dir.mkdir(parents=True, exist_ok=True)
    for split in splits:
        for lang in langs:
            _ensure_file(dest_dir, f"{split}.{lang}.gz", split, lang, source)
    return dest_dir


def multi30k_languages(split: str) -> list[str]:
    """The languages of a Multi30k split (the held-out sets of 2017 have no Czech side)."""
    return [lang for lang in MULTI30K_LANGS if f"{split}.{lang}.gz" in MULTI30K_SHA256]


def _check_choices(kind: str, values: Sequence[str], valid: Sequence[str]) -> None:
    bad = [v for v in values if v not in valid]
    if bad:
        raise DataError(
            f"unknown Multi30k {kind}(s) {', '.join(map(repr, bad))}; valid: {', '.join(valid)}"
        )


def _ensure_file(
    dest_dir: Path, name: str, split: str, lang: str, source: Multi30kSource | None
) -> None:
    """Leave a verified copy of ``name`` in ``dest_dir``."""
    dest = dest_dir / name
    expected = MULTI30K_SHA256[name]
    if dest.is_file():
        actual = sha256_file(dest)
        if actual == expected:
            return
        log.warning("%s has sha256 %s, expected %s: fetching it again", dest, actual, expected)
        dest.unlink()
    if source is None:
        raise DataError(f"{dest} is missing, and no Multi30k source was given to fetch it from")
    if source.mirror is not None:
        _copy_from_mirror(source.mirror, dest, expected)
    else:
        _download(multi30k_url(source, split, lang), dest, expected)


def multi30k_url(source: Multi30kSource, split: str, lang: str) -> str:
    """The URL of ``<split>.<lang>.gz`` under ``source.url``."""
    if not urllib.parse.urlsplit(source.url).scheme:
        raise DataError(
            f"{MULTI30K_URL}={source.url!r} is not a URL: give the base URL of the Multi30k "
            "files, e.g. https://host/multi30k (they are fetched as <base>/<split>.<lang>.gz)"
        )
    return source.file_url(split, lang)


def _copy_from_mirror(mirror: Path, dest: Path, expected: str) -> None:
    if not mirror.is_dir():
        raise DataError(f"{MULTI30K_MIRROR}={str(mirror)!r} is not a directory")
    src = mirror / dest.name
    if not src.is_file():
        raise DataError(f"{MULTI30K_MIRROR}={str(mirror)!r} has no file {dest.name!r} ({src})")
    log.info("copying %s -> %s", src, dest)
    with open(src, "rb") as fin:
        _write_verified(fin, dest, expected, origin=str(src))


def _download(url: str, dest: Path, expected: str) -> None:
    log.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            size = resp.headers.get("Content-Length")
            _write_verified(resp, dest, expected, origin=url, size=int(size) if size else None)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        raise DataError(
            f"could not download {url}: {err}. Without internet access, put the Multi30k "
            f"files (<split>.<lang>.gz) in a directory and set {MULTI30K_MIRROR} to that "
            f"directory, or set {MULTI30K_URL} to the base URL of an HTTP mirror serving them "
            "as <base>/<split>.<lang>.gz"
        ) from err


def _write_verified(
    stream: BinaryIO, dest: Path, expected: str, origin: str, size: int | None = None
) -> None:
    """Copy ``stream`` to a temporary file beside ``dest``, check sha256, rename into place.

    ``size``: the announced byte count; a shorter stream raises ConnectionError.
    """
    with atomic_file(dest) as fout:
        h = hashlib.sha256()
        received = 0
        while chunk := stream.read(_CHUNK):
            h.update(chunk)
            fout.write(chunk)
            received += len(chunk)
        if size is not None and received != size:
            raise ConnectionError(f"transfer ended after {received} of {size} bytes")
        actual = h.hexdigest()
        if actual != expected:
            raise DataError(
                f"{origin}: sha256 mismatch for {dest.name}: expected {expected}, got {actual}; "
                "the bad copy was deleted"
            )


# --------------------------------------------------------------------------- reading


def resolve_pair(prefix: str | Path, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """Find ``<prefix>.<lang>`` or ``<prefix>.<lang>.gz`` for both languages."""
    found: list[Path] = []
    for lang in (src_lang, tgt_lang):
        tried = [Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")]
        path = next((p for p in tried if p.is_file()), None)
        if path is None:
            raise DataError(
                f"no {lang} file for corpus prefix {str(prefix)!r}: tried "
                + ", ".join(str(p) for p in tried)
            )
        found.append(path)
    return found[0], found[1]


BLOCK_BYTES = 1 << 20  # bytes read at a time when streaming a text file


def _open_binary(path: Path) -> tuple[BinaryIO, BinaryIO]:
    """The file to read (decompressing a ``.gz``) and the file on disk beneath it, whose
    position is the number of bytes read from disk."""
    try:
        disk = open(path, "rb")  # noqa: SIM115 (closed by the caller)
    except FileNotFoundError as err:
        raise DataError(f"{path}: file not found") from err
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err})") from err
    if path.suffix == ".gz":
        return gzip.GzipFile(fileobj=disk, mode="rb"), disk  # type: ignore[return-value]
    return disk, disk


def _read_block(f: BinaryIO, path: Path, size: int) -> bytes:
    try:
        return f.read(size)
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise DataError(f"{path}: not a valid gzip file ({err})") from err
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err})") from err


def _decode_lines(data: bytes, path: Path, first_line: int) -> list[str]:
    """Lines of ``data`` (complete lines, no final newline); ``first_line``: 1-based number."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + data.count(b"\n", 0, err.start)
        raise DataError(f"{path}:{line}: invalid UTF-8 ({err.reason})") from err
    if "\0" in text:
        text = text.replace("\0", " ")
    lines = text.split("\n")
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    return lines


def iter_line_blocks(
    path: str | Path, block_bytes: int = BLOCK_BYTES, advance: Advance = no_progress
) -> Iterator[list[str]]:
    """The lines of a UTF-8 text file (``.gz``: gzip-compressed), a block at a time.

    Reads about ``block_bytes`` at a time, so memory stays bounded by the block size (and the
    longest line). The lines are those of :func:`read_lines`, with the same errors.
    ``advance`` is called with the bytes read from disk (compressed ones for a ``.gz``), which
    add up to the file's size.
    """
    path = Path(path)
    f, disk = _open_binary(path)
    read_so_far = 0

    def read() -> bytes:
        nonlocal read_so_far
        data = _read_block(f, path, block_bytes)
        position = disk.tell()
        advance(position - read_so_far)
        read_so_far = position
        return data

    with disk, f:
        data = b""
        while len(data) < len(_BOM):  # the byte-order mark is looked for at the start only
            more = read()
            if not more:
                break
            data += more
        if data.startswith(_BOM):
            data = data[len(_BOM) :]
        pending: list[bytes] = []  # bytes read since the last newline
        line_no = 1  # number of the next line
        while True:
            cut = data.rfind(b"\n")
            if cut < 0:
                pending.append(data)
            else:
                block = b"".join([*pending, data[:cut]])
                pending = [data[cut + 1 :]]
                lines = _decode_lines(block, path, line_no)
                line_no += len(lines)
                yield lines
            data = read()
            if not data:
                break
        rest = b"".join(pending)
        if rest:  # a last line without a newline
            yield _decode_lines(rest, path, line_no)


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (gzip-compressed if the name ends in ``.gz``).

    Lines are split on ``\\n`` only (other Unicode separators stay inside their line); a
    trailing ``\\r`` and a leading byte-order mark are removed; NUL characters are replaced by
    spaces. Invalid UTF-8 raises :class:`DataError` naming the file and 1-based line.
    """
    return [line for block in iter_line_blocks(path) for line in block]


def iter_parallel_blocks(
    src_path: str | Path,
    tgt_path: str | Path,
    block_bytes: int = BLOCK_BYTES,
    advance: Advance = no_progress,
) -> Iterator[tuple[list[str], list[str]]]:
    """Aligned blocks of line pairs from two files, read a block at a time.

    Line ``i`` of one file is paired with line ``i`` of the other; when one file ends before
    the other, the rest of the longer one is counted and :class:`DataError` names both files
    and their line counts. ``advance``: as :func:`iter_line_blocks`'s, for both files.
    """
    sides = (
        iter_line_blocks(src_path, block_bytes, advance),
        iter_line_blocks(tgt_path, block_bytes, advance),
    )
    bufs: tuple[list[str], list[str]] = ([], [])
    counts = [0, 0]
    open_ = [True, True]
    while True:
        for k in (0, 1):  # refill the shorter buffer(s)
            while open_[k] and len(bufs[k]) <= len(bufs[1 - k]):
                block = next(sides[k], None)
                if block is None:
                    open_[k] = False
                else:
                    bufs[k].extend(block)
                    counts[k] += len(block)
        n = min(len(bufs[0]), len(bufs[1]))
        if n:
            yield bufs[0][:n], bufs[1][:n]
            del bufs[0][:n], bufs[1][:n]
        if not (open_[0] and open_[1]):
            break
    for k in (0, 1):  # drain whichever side goes on: its line count goes into the error
        for block in sides[k]:
            counts[k] += len(block)
    if counts[0] != counts[1]:
        raise DataError(
            f"parallel files differ in length: {src_path} has {counts[0]} lines, "
            f"{tgt_path} has {counts[1]} lines"
        )


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Both sides of a parallel corpus; their line counts must match."""
    src: list[str] = []
    tgt: list[str] = []
    for s, t in iter_parallel_blocks(src_path, tgt_path):
        src += s
        tgt += t
    return src, tgt


def strip_lines(lines: Iterable[str]) -> list[str]:
    """Lines without leading/trailing whitespace."""
    return [line.strip() for line in lines]


def clean_pairs(src: Sequence[str], tgt: Sequence[str]) -> tuple[list[str], list[str], dict]:
    """Strip both sides and drop pairs with an empty side (training split only).

    Returns the kept sides and ``{"read", "dropped_empty", "kept"}`` counts.
    """
    if len(src) != len(tgt):
        raise DataError(f"clean_pairs: {len(src)} source vs {len(tgt)} target lines")
    kept_src: list[str] = []
    kept_tgt: list[str] = []
    for s, t in zip(strip_lines(src), strip_lines(tgt), strict=True):
        if s and t:
            kept_src.append(s)
            kept_tgt.append(t)
    stats = {"read": len(src), "dropped_empty": len(src) - len(kept_src), "kept": len(kept_src)}
    return kept_src, kept_tgt, stats
