"""Building the prepared training data (``nmt-prepare``, or a run that finds none).

A preparation streams the training corpora (``data.train``, one or several), cleans them as
:func:`~nmt.data.corpus.clean_pairs` does, trains sentencepiece on ``data.spm_sample`` pairs
drawn uniformly in one pass (unless tokenizers are given), encodes chunks of pairs in
``data.num_workers`` processes, drops pairs over the length limits, and appends the ids to
flat arrays on disk. Memory is bounded by the chunk and sample sizes, not by the corpus. The
format and its checks are :mod:`nmt.data.cache`'s.

The directory is built under a temporary name beside its final one, fully verified, and
renamed into place, so a killed preparation never leaves a directory under a final name. A
directory that fails its checks is reported, naming the file and the problem, and rebuilt.

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
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nmt.atomic import atomic_write_bytes, fsync_dir, sha256_range
from nmt.cli import QUIET, Progress, usable_cores
from nmt.data.cache import (
    FORMAT,
    HEADER_BYTES,
    MANIFEST,
    SAMPLE_SEED,
    SIDES,
    CacheError,
    InputFingerprints,
    PreparedCache,
    Spec,
    _given,
    _npy_header,
    _recipe,
    _spec,
    _tail_range,
    _tokenizer_hashes,
    open_prepared,
)
from nmt.data.corpus import clean_pairs, iter_parallel_blocks
from nmt.data.splits import Split, TrainSplit, filter_by_length, no_data_error, resolve_train
from nmt.data.tokenizer import Tokenizer, TokenizerPair, train_tokenizers
from nmt.environment import Multi30kSource

try:
    import fcntl
except ImportError:  # not POSIX: no locks; concurrent preparations each build, one rename wins
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
CHUNK_PAIRS = 20_000  # pairs encoded per task
SMALL_INPUT_BYTES = 16 << 20  # data.num_workers=0: inputs this small are encoded in process


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


def _read(split: Split, stage: str, progress: Progress) -> Iterator[tuple[list[str], list[str]]]:
    """The line pairs of a corpus, a block at a time, under a bar of the bytes read."""
    with progress.bar(f"{stage} {split.name}", _input_bytes([split]), in_bytes=True) as advance:
        if split.dataset is None:
            yield from iter_parallel_blocks(split.src_path, split.tgt_path, advance=advance)
        else:
            yield from split.blocks(advance)


def _sample(corpora: Sequence[TrainSplit], size: int, cfg: Any, progress: Progress) -> Reservoir:
    """One pass over the cleaned training pairs, keeping a uniform sample of ``size``."""
    sample = Reservoir(size, SAMPLE_SEED)
    for c in corpora:
        stats = {"read": 0, "dropped_empty": 0}
        for src_lines, tgt_lines in _read(c, "sample", progress):
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


def _chunks(split: Split, size: int, progress: Progress) -> Iterator[tuple[list[str], list[str]]]:
    """Raw line pairs of a corpus in chunks of about ``size`` pairs; its bar counts the bytes
    read, which run ahead of the encoding by at most two chunks per worker."""
    src: list[str] = []
    tgt: list[str] = []
    for s, t in _read(split, "encode", progress):
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
        info["tail_sha256"] = sha256_range(self.path, *_tail_range(info))
        return info

    def discard(self) -> None:
        self.file.close()


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def _input_bytes(corpora: Sequence[Split]) -> int:
    """The size on disk of the corpora's files."""
    return sum(p.stat().st_size for c in corpora for p in c.files)


def _worker_count(cfg: Any, corpora: Sequence[Split]) -> int:
    n = int(cfg.num_workers)
    if n > 0:
        return n
    return 1 if _input_bytes(corpora) < SMALL_INPUT_BYTES else usable_cores()


def _encode(
    tmp: Path,
    corpora: Sequence[TrainSplit],
    tokenizers: TokenizerPair,
    cfg: Any,
    workers: int,
    progress: Progress,
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
            for out in _ordered_map(args, _chunks(c, CHUNK_PAIRS, progress), workers):
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
    corpora: Sequence[TrainSplit], cfg: Any, timings: dict[str, float], progress: Progress
) -> TokenizerPair:
    """Sentencepiece trained on a uniform sample of the cleaned training pairs (the sampling
    and training times go into ``timings``)."""
    tic = time.perf_counter()
    sample = _sample(corpora, int(cfg.spm_sample), cfg, progress)
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
        progress=progress,
    )
    timings["spm_seconds"] = time.perf_counter() - tic
    return tokenizers


def _build(
    final: Path,
    spec: Spec,
    corpora: Sequence[TrainSplit],
    tokenizers: TokenizerPair | None,
    cfg: Any,
    progress: Progress,
) -> None:
    """Prepare into a temporary directory beside ``final``, verify it, rename it into place."""
    start = time.perf_counter()
    tmp = final.parent / f".tmp-{final.name[:16]}-{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        timings: dict[str, float] = {}
        if tokenizers is None:
            tokenizers = _new_tokenizers(corpora, cfg, timings, progress)
        tok_entry = _save_tokenizers(tmp, tokenizers)
        workers = _worker_count(cfg, corpora)
        tic = time.perf_counter()
        records, arrays = _encode(tmp, corpora, tokenizers, cfg, workers, progress)
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
    cfg: Any,
    tokenizers: TokenizerPair | None = None,
    verify: bool = False,
    source: Multi30kSource | None = None,
    progress: Progress = QUIET,
) -> PreparedCache:
    """The prepared training data of a data config: opened if present and sound, else built.

    With ``tokenizers`` the data is encoded with them (the key holds their sha256); a
    directory prepared with a trained tokenizer that equals them serves as well. ``verify``
    checks every checksum of an existing directory and re-reads the inputs' checksums. Missing
    Multi30k files are fetched from ``source``. A build draws its passes over the corpora
    (sampling for sentencepiece, encoding) with ``progress``.
    """
    corpora = resolve_train(cfg, source)
    cache = _ensure(cfg, corpora, tokenizers, verify, progress)
    cache.splits = corpora
    return cache


def _ensure(
    cfg: Any,
    corpora: list[TrainSplit],
    tokenizers: TokenizerPair | None,
    verify: bool,
    progress: Progress,
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
                    _build(final, spec, corpora, tokenizers, cfg, progress)
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
