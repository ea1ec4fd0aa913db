"""Training corpora prepared once into memory-mappable arrays: ``nmt-prepare``.

A preparation streams the training corpora (``data.train``, one or several), cleans them as
:func:`~nmt.data.corpus.clean_pairs` does, trains sentencepiece on ``data.spm_sample`` pairs
drawn uniformly in one pass (unless tokenizers are given), encodes chunks of pairs in
``data.num_workers`` processes, drops pairs over the length limits, and appends the ids to
flat arrays on disk. Memory is bounded by the chunk and sample sizes, not by the corpus.

The result is a directory ``<data.root>/cache/prepared/<key>/``:

* ``{src,tgt}.tokens.npy``: every kept sentence's ids, one after the other (uint16 when the
  vocabulary has at most 65,536 entries, else int32);
* ``{src,tgt}.lengths.npy`` (int32, one per pair) and ``{src,tgt}.offsets.npy`` (int64, one
  more: sentence ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``);
* the sentencepiece model(s), ``spm.model`` (joint) or ``src.model`` and ``tgt.model``;
* ``manifest.json``: format version, the key's inputs (every input file's size and sha256,
  every option that changes the result), counts and cleaning statistics per corpus, the
  tokenizers' sha256, and each array's dtype, shape, size, sha256 and the sha256 of its last
  bytes.

The key is the sha256 of the manifest's inputs, like the sentencepiece cache's. The
directory is built under a temporary name beside it, fully verified, and renamed into place,
so a killed preparation never leaves a directory under a final name. Opening checks sizes,
shapes, counts, offsets and the arrays' last bytes (fast at any size); ``verify=True``
(``nmt-prepare --verify``) also checks every checksum and the arrays' contents. A directory
that fails is reported, naming the file and the problem, and rebuilt.

Nothing here imports torch: the preparing process and its workers stay small.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nmt.atomic import atomic_write_bytes, fsync_dir
from nmt.cli import usable_cores
from nmt.config import train_corpora
from nmt.data.corpus import (
    DataError,
    clean_pairs,
    fetch_multi30k,
    iter_parallel_blocks,
    resolve_pair,
    sha256_file,
)
from nmt.data.tokenizer import _CACHE_VERSION as SPM_RECIPE_VERSION
from nmt.data.tokenizer import Tokenizer, TokenizerPair, train_tokenizers

try:
    import fcntl
except ImportError:  # not POSIX: no locks; concurrent preparations each build, one rename wins
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("nmt.data")

FORMAT = "nmt-prepared/1"  # bump when the layout or the cleaning rules change
SAMPLE_SEED = 20240901  # the sentencepiece sample's random draw (part of the key)
CHUNK_PAIRS = 20_000  # pairs encoded per task
SMALL_INPUT_BYTES = 16 << 20  # data.num_workers=0: inputs this small are encoded in process
HEADER_BYTES = 128  # the .npy header, written with room for any shape
TAIL_BYTES = 1 << 16  # the last bytes of each array, checked at every open
SIDES = ("src", "tgt")
KINDS = ("tokens", "lengths", "offsets")
MANIFEST = "manifest.json"


class CacheError(DataError):
    """A prepared-data directory that cannot be trusted; the message names file and problem."""


# --------------------------------------------------------------------------- corpora


@dataclass
class Split:
    """A parallel split: its display name and its two files."""

    name: str
    src_path: Path
    tgt_path: Path


@dataclass
class TrainSplit(Split):
    """A training corpus and its sampling weight (``data.train``)."""

    weight: float = 1.0


def resolve_splits(cfg: Any, names: Sequence[str]) -> list[Split]:
    """The files of the named splits (fetching Multi30k if needed)."""
    if cfg.corpus == "multi30k":
        base = fetch_multi30k(Path(cfg.root), [cfg.src_lang, cfg.tgt_lang], dict.fromkeys(names))
        prefixes: list[str | Path] = [base / name for name in names]
    elif cfg.corpus == "parallel":
        prefixes = list(names)
    else:
        raise DataError(f"data.corpus={cfg.corpus!r} is not one of: multi30k, parallel")
    return [
        Split(Path(str(p)).name, *resolve_pair(p, cfg.src_lang, cfg.tgt_lang)) for p in prefixes
    ]


def resolve_train(cfg: Any) -> list[TrainSplit]:
    """The training corpora of ``data.train`` with their weights."""
    corpora = train_corpora(cfg.train)
    splits = resolve_splits(cfg, [c.prefix for c in corpora])
    names = [s.name for s in splits]
    unique = len(set(names)) == len(names)
    return [
        TrainSplit(s.name if unique else c.prefix, s.src_path, s.tgt_path, c.weight)
        for s, c in zip(splits, corpora, strict=True)
    ]


def no_data_error(split: Split, stats: dict, cfg: Any) -> DataError:
    """Nothing left of a training corpus after cleaning and filtering."""
    return DataError(
        f"no training pairs left from {split.src_path} / {split.tgt_path}: read "
        f"{stats['read']}, dropped {stats['dropped_empty']} with an empty side, "
        f"{stats.get('dropped_too_long', 0)} longer than data.max_len={cfg.max_len} tokens, "
        f"{stats.get('dropped_ratio', 0)} with a length ratio above "
        f"data.max_len_ratio={cfg.max_len_ratio}"
    )


def filter_by_length(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_len: int, max_len_ratio: float
) -> tuple[np.ndarray, dict]:
    """Indices of pairs within ``max_len`` tokens per side and ``max_len_ratio``; drop counts.

    A pair over the length limit counts as ``dropped_too_long`` only, even if its ratio is bad.
    """
    s = np.asarray(src_lens, dtype=np.int64)  # (N,)
    t = np.asarray(tgt_lens, dtype=np.int64)  # (N,)
    too_long = (s > max_len) | (t > max_len)
    ratio = np.maximum(s, t) / np.maximum(np.minimum(s, t), 1)
    bad_ratio = ~too_long & (ratio > max_len_ratio)
    keep = np.flatnonzero(~(too_long | bad_ratio))
    return keep, {"dropped_too_long": int(too_long.sum()), "dropped_ratio": int(bad_ratio.sum())}


# --------------------------------------------------------------------------- fingerprints


class InputFingerprints:
    """Size and sha256 of input files, remembered by their ``stat`` in a small JSON file.

    A file whose device, inode, size, modification and change times are unchanged is not read
    again (an edit changes its change time, which no tool can set back); ``rehash`` reads
    every file regardless.
    """

    def __init__(self, memo: Path, rehash: bool = False) -> None:
        self.memo, self.rehash = memo, rehash
        self.entries: dict[str, dict] = {}
        self.changed = False
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(memo.read_text())
            if isinstance(loaded, dict):
                self.entries = loaded

    def get(self, path: Path) -> dict:
        """``{"size", "sha256"}`` of ``path``."""
        st = path.stat()
        key = str(path.resolve())
        sig = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        entry = self.entries.get(key)
        if not self.rehash and isinstance(entry, dict) and entry.get("stat") == sig:
            return {"size": st.st_size, "sha256": str(entry["sha256"])}
        digest = sha256_file(path)
        self.entries[key] = {"stat": sig, "sha256": digest}
        self.changed = True
        return {"size": st.st_size, "sha256": digest}

    def save(self) -> None:
        """Write the memo (atomically), keeping only files that still exist."""
        if not self.changed:
            return
        kept = {k: v for k, v in self.entries.items() if Path(k).exists()}
        with contextlib.suppress(OSError):
            atomic_write_bytes(self.memo, json.dumps(kept, indent=0, sort_keys=True).encode())
        self.changed = False


# --------------------------------------------------------------------------- the key


@dataclass
class Spec:
    """Everything that determines a prepared directory's contents, and its key."""

    inputs: list[dict]  # per corpus: name, src/tgt path, size, sha256
    options: dict  # length filter and tokenizer (trained recipe or given models' sha256)

    @property
    def key(self) -> str:
        contents = [{"src": i["src"]["sha256"], "tgt": i["tgt"]["sha256"]} for i in self.inputs]
        sizes = [{"src": i["src"]["size"], "tgt": i["tgt"]["size"]} for i in self.inputs]
        blob = {"format": FORMAT, "inputs": contents, "sizes": sizes, "options": self.options}
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _recipe(cfg: Any) -> dict:
    """The options of a sentencepiece model trained by a preparation."""
    return {
        "trained": {
            "joint": bool(cfg.joint_vocab),
            "vocab_size": int(cfg.vocab_size),
            "model_type": str(cfg.spm_model_type),
            "character_coverage": float(cfg.character_coverage),
            "spm_sample": int(cfg.spm_sample),
            "sample_seed": SAMPLE_SEED,
            "spm_recipe": SPM_RECIPE_VERSION,
        }
    }


def _given(tokenizers: TokenizerPair) -> dict:
    return {"given": _tokenizer_hashes(tokenizers)}


def _tokenizer_hashes(tokenizers: TokenizerPair) -> dict:
    return {
        "joint": tokenizers.joint,
        "src": hashlib.sha256(tokenizers.src.proto).hexdigest(),
        "tgt": hashlib.sha256(tokenizers.tgt.proto).hexdigest(),
    }


def _spec(cfg: Any, corpora: Sequence[TrainSplit], prints: InputFingerprints, tok: dict) -> Spec:
    inputs = [
        {
            "name": c.name,
            "src": {"path": str(c.src_path), **prints.get(c.src_path)},
            "tgt": {"path": str(c.tgt_path), **prints.get(c.tgt_path)},
        }
        for c in corpora
    ]
    options = {
        "max_len": int(cfg.max_len),
        "max_len_ratio": float(cfg.max_len_ratio),
        "tokenizer": tok,
    }
    return Spec(inputs, options)


# --------------------------------------------------------------------------- opened caches


@dataclass
class PreparedCache:
    """An opened prepared directory: its manifest, tokenizers and memory-mapped arrays."""

    path: Path
    manifest: dict
    tokenizers: TokenizerPair
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # "src.tokens" -> memmap
    splits: list[TrainSplit] = field(default_factory=list)  # the files it was asked for

    @property
    def corpora(self) -> list[dict]:
        """Per corpus, in order: ``name``, ``start`` (first pair), ``pairs``, ``stats``."""
        return self.manifest["corpora"]

    @property
    def pairs(self) -> int:
        return int(self.manifest["pairs"])

    def side(self, side: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, offsets, lengths) of ``side`` ("src" or "tgt")."""
        a = self.arrays
        return a[f"{side}.tokens"], a[f"{side}.offsets"], a[f"{side}.lengths"]

    @property
    def stats(self) -> dict:
        """Cleaning statistics summed over the corpora (the keys of one corpus's)."""
        total = dict.fromkeys(
            ("read", "dropped_empty", "dropped_too_long", "dropped_ratio", "kept"), 0
        )
        for c in self.corpora:
            for k in total:
                total[k] += int(c["stats"][k])
        return total


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    """A version 1.0 ``.npy`` header for a 1-D array, padded to HEADER_BYTES."""
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False}
    text = repr({**d, "shape": (n,)}).encode("latin1")
    room = HEADER_BYTES - 10  # magic (6), version (2), header length (2)
    if len(text) + 1 > room:
        raise ValueError(f"npy header for {n} elements does not fit in {HEADER_BYTES} bytes")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", room) + text.ljust(room - 1) + b"\n"


def _file_sha256(path: Path, start: int, end: int | None = None) -> str:
    """sha256 of bytes ``[start, end)`` of a file, read a megabyte at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            chunk = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def _tail_range(info: dict) -> tuple[int, int]:
    end = int(info["bytes"])
    return max(HEADER_BYTES, end - TAIL_BYTES), end


def _load_array(path: Path, info: dict, full: bool) -> np.ndarray:
    """One array, checked against its manifest entry, memory-mapped read-only."""
    try:
        size = path.stat().st_size
    except OSError as err:
        raise CacheError(f"{path}: missing ({err.strerror})") from err
    if size != int(info["bytes"]):
        raise CacheError(f"{path}: {size} bytes, the manifest says {info['bytes']} (truncated?)")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise CacheError(f"{path}: not a readable .npy array ({err})") from err
    if str(arr.dtype.str) != info["dtype"] or list(arr.shape) != list(info["shape"]):
        raise CacheError(
            f"{path}: holds {arr.dtype.str} {list(arr.shape)}, the manifest says "
            f"{info['dtype']} {info['shape']}"
        )
    if _file_sha256(path, *_tail_range(info)) != info["tail_sha256"]:
        raise CacheError(f"{path}: its last bytes do not match the manifest's checksum")
    if full and _file_sha256(path, HEADER_BYTES) != info["sha256"]:
        raise CacheError(f"{path}: sha256 does not match the manifest")
    return arr


def _check_side(cache: PreparedCache, side: str, full: bool) -> None:
    """Offsets, lengths and token counts agree (all of them when ``full``)."""
    tokens, offsets, lengths = cache.side(side)
    n = cache.pairs
    where = cache.path / f"{side}.offsets.npy"
    if offsets.shape != (n + 1,) or lengths.shape != (n,):
        raise CacheError(f"{where}: {offsets.shape[0]} offsets for {n} pairs")
    if int(offsets[0]) != 0 or int(offsets[-1]) != tokens.shape[0]:
        raise CacheError(
            f"{where}: spans [{int(offsets[0])}, {int(offsets[-1])}), "
            f"{side}.tokens.npy holds {tokens.shape[0]} ids"
        )
    if not full:
        return
    vocab = cache.manifest["tokenizers"][side]["vocab_size"]
    max_len = cache.manifest["options"]["max_len"]
    step = 1 << 20
    for a in range(0, n, step):
        b = min(n, a + step)
        span = np.diff(offsets[a : b + 1])
        if not np.array_equal(span, lengths[a:b]) or (span > max_len).any():
            raise CacheError(
                f"{cache.path / f'{side}.lengths.npy'}: lengths disagree with the offsets or "
                f"the length limit in pairs {a}-{b - 1}"
            )
    step = 1 << 24
    for a in range(0, tokens.shape[0], step):
        if int(tokens[a : a + step].max()) >= vocab:
            raise CacheError(
                f"{cache.path / f'{side}.tokens.npy'}: an id >= the vocabulary size {vocab}"
            )


def _load_tokenizers(path: Path, manifest: dict) -> TokenizerPair:
    loaded = {}
    for side in SIDES:
        info = manifest["tokenizers"][side]
        file = path / info["file"]
        if side == "tgt" and manifest["tokenizers"]["joint"]:
            loaded[side] = loaded["src"]
            continue
        try:
            proto = file.read_bytes()
        except OSError as err:
            raise CacheError(f"{file}: missing ({err.strerror})") from err
        if hashlib.sha256(proto).hexdigest() != info["sha256"]:
            raise CacheError(f"{file}: sha256 does not match the manifest")
        loaded[side] = Tokenizer.from_proto(proto, origin=str(file))
    return TokenizerPair(loaded["src"], loaded["tgt"], bool(manifest["tokenizers"]["joint"]))


def open_prepared(path: str | Path, full: bool = False, key: str | None = None) -> PreparedCache:
    """Open a prepared directory after checking it (every checksum too when ``full``).

    ``key``: the key its manifest must name (default: the directory's name). Raises
    :class:`CacheError` naming the file and the problem.
    """
    path = Path(path)
    key = path.name if key is None else key
    man_path = path / MANIFEST
    try:
        manifest = json.loads(man_path.read_text())
    except OSError as err:
        raise CacheError(f"{man_path}: missing ({err.strerror})") from err
    except ValueError as err:
        raise CacheError(f"{man_path}: not valid JSON ({err})") from err
    try:
        if manifest.get("format") != FORMAT:
            raise CacheError(f"{man_path}: format {manifest.get('format')!r}, expected {FORMAT}")
        if manifest.get("key") != key:
            raise CacheError(f"{man_path}: written for key {manifest.get('key')}, not {key}")
        cache = PreparedCache(path, manifest, _load_tokenizers(path, manifest))
        for name, info in manifest["arrays"].items():
            cache.arrays[name] = _load_array(path / info["file"], info, full)
        if sum(int(c["pairs"]) for c in cache.corpora) != cache.pairs:
            raise CacheError(f"{man_path}: the corpora's pair counts do not add up to the total")
        for side in SIDES:
            _check_side(cache, side, full)
    except (KeyError, TypeError, AttributeError) as err:
        raise CacheError(f"{man_path}: incomplete manifest ({type(err).__name__}: {err})") from err
    return cache


# --------------------------------------------------------------------------- building


class Reservoir:
    """A uniform random sample of at most ``size`` pairs from a stream (algorithm R).

    While fewer pairs than ``size`` were offered, the sample is all of them, in order.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size = int(size)
        self.src: list[str] = []
        self.tgt: list[str] = []
        self.seen = 0
        self._rng = np.random.default_rng(seed)

    def add(self, src: Sequence[str], tgt: Sequence[str]) -> None:
        n = len(src)
        room = min(n, self.size - len(self.src))
        if room > 0:
            self.src.extend(src[:room])
            self.tgt.extend(tgt[:room])
        room = max(room, 0)
        if room < n:
            seen = np.arange(self.seen + room, self.seen + n, dtype=np.int64)  # 0-based
            slot = self._rng.integers(0, seen + 1)  # pair j replaces slot r < size: P = size/(j+1)
            for h in np.flatnonzero(slot < self.size).tolist():
                self.src[int(slot[h])] = src[room + h]
                self.tgt[int(slot[h])] = tgt[room + h]
        self.seen += n


def _sample(corpora: Sequence[TrainSplit], size: int, cfg: Any) -> Reservoir:
    """One pass over the cleaned training pairs, keeping a uniform sample of ``size``."""
    sample = Reservoir(size, SAMPLE_SEED)
    for c in corpora:
        stats = {"read": 0, "dropped_empty": 0}
        for src_lines, tgt_lines in iter_parallel_blocks(c.src_path, c.tgt_path):
            src, tgt, st = clean_pairs(src_lines, tgt_lines)
            stats["read"] += st["read"]
            stats["dropped_empty"] += st["dropped_empty"]
            sample.add(src, tgt)
        if stats["read"] == stats["dropped_empty"]:
            raise no_data_error(c, stats, cfg)
    return sample


class Encoder:
    """Cleans, encodes and length-filters one chunk of raw line pairs."""

    def __init__(
        self,
        src_proto: bytes,
        tgt_proto: bytes | None,
        max_len: int,
        max_len_ratio: float,
        dtypes: tuple[str, str],
        threads: int | None,
    ) -> None:
        self.src = Tokenizer.from_proto(src_proto)
        self.tgt = self.src if tgt_proto is None else Tokenizer.from_proto(tgt_proto)
        self.max_len, self.max_len_ratio = max_len, max_len_ratio
        self.dtypes = tuple(np.dtype(d) for d in dtypes)
        self.threads = threads

    def __call__(self, chunk: tuple[list[str], list[str]]) -> dict:
        src, tgt, stats = clean_pairs(*chunk)
        s_ids = self.src.encode_batch(src, self.threads)
        t_ids = self.tgt.encode_batch(tgt, self.threads)
        out: dict[str, Any] = {}
        s_len = np.fromiter(map(len, s_ids), dtype=np.int64, count=len(s_ids))  # (n,)
        t_len = np.fromiter(map(len, t_ids), dtype=np.int64, count=len(t_ids))  # (n,)
        keep, drops = filter_by_length(s_len, t_len, self.max_len, self.max_len_ratio)
        stats.update(drops, kept=len(keep))
        for side, ids, lens, dtype in (("src", s_ids, s_len, self.dtypes[0]),
                                       ("tgt", t_ids, t_len, self.dtypes[1])):  # fmt: skip
            flat = np.fromiter(
                itertools.chain.from_iterable(ids), dtype=dtype, count=int(lens.sum())
            )  # (tokens,)
            mask = np.zeros(len(ids), dtype=bool)
            mask[keep] = True
            out[side] = (flat[np.repeat(mask, lens)], lens[keep].astype(np.int32))
        out["stats"] = stats
        return out


_WORKER: Encoder | None = None


def _init_worker(*args: Any) -> None:
    global _WORKER
    _WORKER = Encoder(*args)


def _encode_in_worker(chunk: tuple[list[str], list[str]]) -> dict:
    assert _WORKER is not None
    return _WORKER(chunk)


def _ordered_map(
    encoder_args: tuple, chunks: Iterable[tuple[list[str], list[str]]], workers: int
) -> Iterator[dict]:
    """Encoded chunks in order: in this process, or in ``workers`` spawned processes with at
    most two chunks each in flight (so reading never runs ahead of encoding)."""
    if workers <= 1:
        encoder = Encoder(*encoder_args)
        yield from map(encoder, chunks)
        return
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ctx.Pool(workers, initializer=_init_worker, initargs=encoder_args) as pool:
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_in_worker, (chunk,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _chunks(split: Split, size: int) -> Iterator[tuple[list[str], list[str]]]:
    """Raw line pairs of a corpus in chunks of about ``size`` pairs."""
    src: list[str] = []
    tgt: list[str] = []
    for s, t in iter_parallel_blocks(split.src_path, split.tgt_path):
        src += s
        tgt += t
        while len(src) >= size:
            yield src[:size], tgt[:size]
            del src[:size], tgt[:size]
    if src:
        yield src, tgt


class _ArrayWriter:
    """Appends to a 1-D ``.npy`` file whose header is written when its length is known."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype = path, np.dtype(dtype)
        self.file = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.file.write(b"\0" * HEADER_BYTES)
        self.n = 0
        self.sha = hashlib.sha256()

    def append(self, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=self.dtype)
        self.file.write(memoryview(data).cast("B"))
        self.sha.update(memoryview(data).cast("B"))
        self.n += len(data)

    def close(self) -> dict:
        """Write the header, flush to disk; the manifest entry."""
        self.file.seek(0)
        self.file.write(_npy_header(self.dtype, self.n))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        info = {
            "file": self.path.name,
            "dtype": self.dtype.str,
            "shape": [self.n],
            "bytes": HEADER_BYTES + self.n * self.dtype.itemsize,
            "sha256": self.sha.hexdigest(),
        }
        info["tail_sha256"] = _file_sha256(self.path, *_tail_range(info))
        return info

    def discard(self) -> None:
        self.file.close()


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def _worker_count(cfg: Any, corpora: Sequence[Split]) -> int:
    n = int(cfg.num_workers)
    if n > 0:
        return n
    size = sum(p.stat().st_size for c in corpora for p in (c.src_path, c.tgt_path))
    return 1 if size < SMALL_INPUT_BYTES else usable_cores()


def _encode(
    tmp: Path, corpora: Sequence[TrainSplit], tokenizers: TokenizerPair, cfg: Any, workers: int
) -> tuple[list[dict], dict[str, dict]]:
    """Encode every corpus into the arrays of ``tmp``; per-corpus records and array entries."""
    dtypes = (_token_dtype(tokenizers.src.vocab_size), _token_dtype(tokenizers.tgt.vocab_size))
    writers: dict[str, _ArrayWriter] = {}
    for side, dtype in zip(SIDES, dtypes, strict=True):
        writers[f"{side}.tokens"] = _ArrayWriter(tmp / f"{side}.tokens.npy", dtype)
        writers[f"{side}.lengths"] = _ArrayWriter(tmp / f"{side}.lengths.npy", np.int32)
        writers[f"{side}.offsets"] = _ArrayWriter(tmp / f"{side}.offsets.npy", np.int64)
        writers[f"{side}.offsets"].append(np.zeros(1, dtype=np.int64))
    totals = {side: 0 for side in SIDES}
    args = (
        tokenizers.src.proto,
        None if tokenizers.joint else tokenizers.tgt.proto,
        int(cfg.max_len),
        float(cfg.max_len_ratio),
        (dtypes[0].str, dtypes[1].str),
        1 if workers > 1 else None,
    )
    records = []
    start = 0
    try:
        for c in corpora:
            stats = dict.fromkeys(
                ("read", "dropped_empty", "dropped_too_long", "dropped_ratio", "kept"), 0
            )
            for out in _ordered_map(args, _chunks(c, CHUNK_PAIRS), workers):
                for k in stats:
                    stats[k] += out["stats"][k]
                for side in SIDES:
                    flat, lens = out[side]
                    writers[f"{side}.tokens"].append(flat)
                    writers[f"{side}.lengths"].append(lens)
                    ends = totals[side] + np.cumsum(lens, dtype=np.int64)
                    writers[f"{side}.offsets"].append(ends)
                    totals[side] += int(flat.shape[0])
            if stats["kept"] == 0:
                raise no_data_error(c, stats, cfg)
            log_corpus(c.name, stats)
            records.append({"name": c.name, "start": start, "pairs": stats["kept"], "stats": stats})
            start += stats["kept"]
        return records, {name: w.close() for name, w in writers.items()}
    finally:
        for w in writers.values():
            if not w.file.closed:
                w.discard()


def log_corpus(name: str, stats: dict) -> None:
    """The cleaning statistics line of one training corpus."""
    log.info(
        "train %s: read %d, dropped empty %d, dropped too long %d, dropped ratio %d, kept %d",
        name, stats["read"], stats["dropped_empty"], stats["dropped_too_long"],
        stats["dropped_ratio"], stats["kept"],
    )  # fmt: skip


def _save_tokenizers(tmp: Path, tokenizers: TokenizerPair) -> dict:
    files = {"src": "spm.model", "tgt": "spm.model"} if tokenizers.joint else {}
    files = files or {"src": "src.model", "tgt": "tgt.model"}
    entry: dict[str, Any] = {"joint": tokenizers.joint}
    for side, tok in (("src", tokenizers.src), ("tgt", tokenizers.tgt)):
        atomic_write_bytes(tmp / files[side], tok.proto)
        entry[side] = {
            "file": files[side],
            "sha256": hashlib.sha256(tok.proto).hexdigest(),
            "vocab_size": tok.vocab_size,
        }
    return entry


def _new_tokenizers(
    corpora: Sequence[TrainSplit], cfg: Any, timings: dict[str, float]
) -> TokenizerPair:
    """Sentencepiece trained on a uniform sample of the cleaned training pairs (the sampling
    and training times go into ``timings``)."""
    tic = time.perf_counter()
    sample = _sample(corpora, int(cfg.spm_sample), cfg)
    timings["sample_seconds"] = time.perf_counter() - tic
    log.info("sentencepiece sample: %d of %d cleaned training pairs", len(sample.src), sample.seen)
    tic = time.perf_counter()
    tokenizers = train_tokenizers(
        sample.src,
        sample.tgt,
        Path(cfg.root) / "cache" / "spm",
        joint=bool(cfg.joint_vocab),
        vocab_size=int(cfg.vocab_size),
        model_type=str(cfg.spm_model_type),
        character_coverage=float(cfg.character_coverage),
    )
    timings["spm_seconds"] = time.perf_counter() - tic
    return tokenizers


def _build(
    final: Path,
    spec: Spec,
    corpora: Sequence[TrainSplit],
    tokenizers: TokenizerPair | None,
    cfg: Any,
) -> None:
    """Prepare into a temporary directory beside ``final``, verify it, rename it into place."""
    start = time.perf_counter()
    tmp = final.parent / f".tmp-{final.name[:16]}-{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        timings: dict[str, float] = {}
        if tokenizers is None:
            tokenizers = _new_tokenizers(corpora, cfg, timings)
        tok_entry = _save_tokenizers(tmp, tokenizers)
        workers = _worker_count(cfg, corpora)
        tic = time.perf_counter()
        records, arrays = _encode(tmp, corpora, tokenizers, cfg, workers)
        timings["encode_seconds"] = time.perf_counter() - tic
        manifest = {
            "format": FORMAT,
            "key": final.name,
            "inputs": spec.inputs,
            "options": spec.options,
            "tokenizers": tok_entry,
            "corpora": records,
            "pairs": sum(r["pairs"] for r in records),
            "arrays": arrays,
            "workers": workers,
            **timings,
            "seconds": time.perf_counter() - start,
        }
        atomic_write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        tic = time.perf_counter()
        open_prepared(tmp, full=True, key=final.name)
        if _move_into_place(tmp, final):
            log.info(
                "prepared %d training pairs in %.1fs (%d encoding process%s, verified in "
                "%.1fs) -> %s",
                manifest["pairs"], time.perf_counter() - start, workers,
                "es" if workers > 1 else "", time.perf_counter() - tic, final,
            )  # fmt: skip
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_into_place(tmp: Path, final: Path) -> bool:
    """Rename the verified ``tmp`` to ``final`` durably; False (and ``tmp`` removed) when
    another process prepared ``final`` meanwhile."""
    fsync_dir(tmp)
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        log.info("%s was prepared meanwhile by another process; using it", final)
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    fsync_dir(final.parent)
    return True


# --------------------------------------------------------------------------- entry point


@contextlib.contextmanager
def _locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """An exclusive lock on ``path`` (created if needed) for the duration of the block; with
    ``wait=False`` the block gets False at once when another process holds it."""
    if fcntl is None:
        yield True
        return
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            log.info("waiting for another process preparing the same data (%s)", path)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)


def _make_dirs(path: Path) -> list[Path]:
    """Create ``path`` and its missing parents; the directories created, outermost first."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def _discard(path: Path, problem: CacheError) -> None:
    """Report an unusable prepared directory and move it out of the way."""
    log.warning("%s; rebuilding %s", problem, path)
    trash = path.with_name(f".bad-{path.name[:16]}-{socket.gethostname()}-{os.getpid()}")
    try:
        os.rename(path, trash)
    except OSError:
        return  # someone else moved it already
    shutil.rmtree(trash, ignore_errors=True)


def _try_open(path: Path, full: bool) -> PreparedCache | None:
    if not path.is_dir():
        return None
    try:
        return open_prepared(path, full=full)
    except CacheError as problem:
        _discard(path, problem)
        return None


def _sweep(base: Path) -> None:
    """Remove what killed preparations on this host left: temporary and discarded directories
    of processes that no longer run, and lock files that nobody holds."""
    host = socket.gethostname()
    for tmp in [*base.glob(f".tmp-*-{host}-*"), *base.glob(f".bad-*-{host}-*")]:
        pid = tmp.name.rsplit("-", 1)[-1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            log.info("removing %s, left by an interrupted preparation", tmp)
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            pass
    for lock in base.glob(".lock-*"):
        with contextlib.suppress(OSError), _locked(lock, wait=False) as held:
            if held:
                lock.unlink()


def ensure_prepared(
    cfg: Any, tokenizers: TokenizerPair | None = None, verify: bool = False
) -> PreparedCache:
    """The prepared training data of a data config: opened if present and sound, else built.

    With ``tokenizers`` the data is encoded with them (the key holds their sha256); a
    directory prepared with a trained tokenizer that equals them serves as well. ``verify``
    checks every checksum of an existing directory and re-reads the inputs' checksums.
    """
    corpora = resolve_train(cfg)
    cache = _ensure(cfg, corpora, tokenizers, verify)
    cache.splits = corpora
    return cache


def _ensure(
    cfg: Any, corpora: list[TrainSplit], tokenizers: TokenizerPair | None, verify: bool
) -> PreparedCache:
    base = Path(cfg.root) / "cache" / "prepared"
    prints = InputFingerprints(base / "inputs.json", rehash=verify)
    trained_spec = _spec(cfg, corpora, prints, _recipe(cfg))
    spec = trained_spec
    if tokenizers is not None:
        cache = _try_open(base / trained_spec.key, verify)
        if cache is not None and _tokenizer_hashes(cache.tokenizers) == _tokenizer_hashes(
            tokenizers
        ):
            return _opened(cache, prints, verify, corpora)
        spec = _spec(cfg, corpora, prints, _given(tokenizers))
    final = base / spec.key
    cache = _try_open(final, verify)
    if cache is not None:
        return _opened(cache, prints, verify, corpora)
    created = _make_dirs(base)
    lock = base / f".lock-{spec.key}"
    try:
        with _locked(lock):
            try:
                cache = _try_open(final, False)  # built while this process waited?
                if cache is None:
                    _sweep(base)
                    _build(final, spec, corpora, tokenizers, cfg)
                    cache = open_prepared(final)
            finally:
                lock.unlink(missing_ok=True)
    except BaseException:
        for d in reversed(created):  # leave nothing behind that this call created
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    prints.save()
    return cache


def _opened(
    cache: PreparedCache, prints: InputFingerprints, verified: bool, corpora: list[TrainSplit]
) -> PreparedCache:
    _sweep(cache.path.parent)
    log.info(
        "using prepared training data %s (%d pairs%s)",
        cache.path, cache.pairs, ", every checksum verified" if verified else "",
    )  # fmt: skip
    for split, c in zip(corpora, cache.corpora, strict=True):  # named as asked this time
        log_corpus(split.name, c["stats"])
    prints.save()
    return cache


def weighted_counts(sizes: Sequence[int], weights: Sequence[float]) -> list[int]:
    """Pairs drawn from each corpus per epoch: ``round(weight * pairs)``, at least 1."""
    return [max(1, round(w * n)) for n, w in zip(sizes, weights, strict=True)]


def log_shares(names: Sequence[str], sizes: Sequence[int], weights: Sequence[float]) -> None:
    """One line per corpus: pairs, weight, pairs per epoch and share of the epoch."""
    counts = weighted_counts(sizes, weights)
    total = sum(counts)
    for name, n, w, m in zip(names, sizes, weights, counts, strict=True):
        log.info(
            "corpus %s: %d pairs x weight %g = %d per epoch (%.1f%% of the epoch)",
            name, n, w, m, 100 * m / total,
        )  # fmt: skip
