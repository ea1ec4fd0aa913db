"""The prepared training data of a multilingual run (``data.directions``).

Every training corpus (``data.train``) is read in every direction: Multi30k's ``train`` gives
``train.de`` / ``train.en`` for de-en, a ``data=parallel`` prefix is completed by
``.<src>`` / ``.<tgt>`` after ``{src}`` and ``{tgt}`` in it are replaced by the direction's
languages (``/corpus/{src}-{tgt}/train``: one folder per direction; a plain prefix: a
multi-way parallel corpus). Each distinct file is encoded once, whole, into shared arrays;
a direction is its pairs of sentence numbers, so a side shared by several directions (Multi30k's
``train.en`` in six) is stored once. A pair is kept as the bilingual preparation keeps it (no
empty side, ``data.max_len``, ``data.max_len_ratio``).

``<data.root>/cache/prepared/<key>/`` holds ``text.{tokens,lengths,offsets}.npy`` (every line
of every file), ``pairs.{src,tgt}.npy`` (int64 sentence numbers, corpus after corpus),
``spm.model`` (one model for all languages, with the language tags as user-defined pieces)
and ``manifest.json``. Built under a temporary name, verified, renamed into place, as
:mod:`nmt.data.binarize` does; the checks are :mod:`nmt.data.cache`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nmt.atomic import atomic_write_bytes
from nmt.cli import QUIET, Progress
from nmt.config_checks import Direction, train_corpora
from nmt.data.binarize import (
    Reservoir,
    _ArrayWriter,
    _discard,
    _locked,
    _make_dirs,
    _move_into_place,
    _sweep,
    _token_dtype,
    log_corpus,
)
from nmt.data.cache import (
    SAMPLE_SEED,
    CacheError,
    InputFingerprints,
    OpenedCache,
    _load_array,
    _recipe,
    _tokenizer_hashes,
    read_manifest,
)
from nmt.data.corpus import DataError, fetch_multi30k, iter_line_blocks, resolve_pair
from nmt.data.hfdata import is_dataset
from nmt.data.multilingual import check_no_tags, directions_of, languages, tags_for
from nmt.data.splits import filter_by_length
from nmt.data.tokenizer import Tokenizer, TokenizerPair, train_tokenizer
from nmt.environment import Multi30kSource

log = logging.getLogger(__name__)
FORMAT = "nmt-prepared-multi/1"
MANIFEST = "manifest.json"
ARRAYS = ("text.tokens", "text.lengths", "text.offsets", "pairs.src", "pairs.tgt")


@dataclass
class DirectionSplit:
    """One corpus in one direction: its name (``train de-en``), files and weight."""

    name: str
    direction: Direction
    src_path: Path
    tgt_path: Path
    weight: float = 1.0

    @property
    def set_name(self) -> str:
        """The corpus' own name, without the direction or the folder (``test_2016_flickr``)."""
        return Path(self.name.split(" ")[0]).name


def direction_prefix(prefix: str | Path, d: Direction) -> str:
    """A corpus prefix for one direction: ``{src}`` and ``{tgt}`` replaced by its languages."""
    return str(prefix).replace("{src}", d.src).replace("{tgt}", d.tgt)


def resolve_direction_splits(
    cfg: Any,
    names: list[str],
    directions: list[Direction],
    source: Multi30kSource | None = None,
    weights: list[float] | None = None,
) -> list[DirectionSplit]:
    """The files of each named split (a Multi30k split or a path prefix) in each direction,
    corpus after corpus; a missing file raises the bilingual error naming it."""
    if cfg.corpus == "multi30k":
        base = fetch_multi30k(Path(cfg.root), languages(directions), dict.fromkeys(names), source)
        prefixes = [str(base / name) for name in names]
    else:
        prefixes = list(names)
    out = []
    for k, prefix in enumerate(prefixes):
        for d in directions:
            p = direction_prefix(prefix, d)
            if is_dataset(p):
                raise DataError(
                    f"{p}: a multilingual run reads plain-text files <prefix>.<lang>; convert "
                    "the dataset to text files"
                )
            src, tgt = resolve_pair(p, d.src, d.tgt)
            weight = weights[k] if weights else 1.0
            out.append(DirectionSplit(f"{Path(prefix).name} {d}", d, src, tgt, weight))
    return out


def resolve_multi_train(cfg: Any, source: Multi30kSource | None = None) -> list[DirectionSplit]:
    """The training corpora of ``data.train`` in every direction of ``data.directions``."""
    corpora = train_corpora(cfg.train)
    return resolve_direction_splits(
        cfg, [c.prefix for c in corpora], directions_of(cfg), source, [c.weight for c in corpora]
    )


# --------------------------------------------------------------------------- opened


@dataclass
class MultiCache(OpenedCache[DirectionSplit]):
    """An opened multilingual preparation."""

    def direction_pairs(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each corpus's (source, target) sentence numbers into the text arrays."""
        src, tgt = self.arrays["pairs.src"], self.arrays["pairs.tgt"]
        return [
            (src[c["start"] : c["start"] + c["pairs"]], tgt[c["start"] : c["start"] + c["pairs"]])
            for c in self.corpora
        ]


def open_multi(path: str | Path, full: bool = False, key: str | None = None) -> MultiCache:
    """Open a multilingual preparation after checking it (every checksum when ``full``)."""
    path = Path(path)
    key = path.name if key is None else key
    man_path, manifest = read_manifest(path)
    try:
        if manifest.get("format") != FORMAT or manifest.get("key") != key:
            raise CacheError(f"{man_path}: not the {FORMAT} preparation of key {key}")
        proto = (path / "spm.model").read_bytes()
        if hashlib.sha256(proto).hexdigest() != manifest["tokenizer_sha256"]:
            raise CacheError(f"{path / 'spm.model'}: sha256 does not match the manifest")
        tok = Tokenizer.from_proto(proto, origin=str(path / "spm.model"))
        cache = MultiCache(path, manifest, TokenizerPair(tok, tok, True))
        for name in ARRAYS:
            info = manifest["arrays"][name]
            cache.arrays[name] = _load_array(path / info["file"], info, full)
        _check(cache, full)
    except OSError as err:
        raise CacheError(f"{path}: unreadable ({err})") from err
    except (KeyError, TypeError, AttributeError) as err:
        raise CacheError(f"{man_path}: incomplete manifest ({type(err).__name__}: {err})") from err
    return cache


def _check(cache: MultiCache, full: bool) -> None:
    a = cache.arrays
    n_text, n = len(a["text.lengths"]), cache.pairs
    if len(a["text.offsets"]) != n_text + 1 or int(a["text.offsets"][-1]) != len(a["text.tokens"]):
        raise CacheError(f"{cache.path / 'text.offsets.npy'}: does not span text.tokens.npy")
    if len(a["pairs.src"]) != n or len(a["pairs.tgt"]) != n:
        raise CacheError(f"{cache.path / 'pairs.src.npy'}: not {n} pairs")
    if sum(int(c["pairs"]) for c in cache.corpora) != n:
        raise CacheError(f"{cache.path / MANIFEST}: the corpora's pairs do not add up")
    if full and n and max(int(a["pairs.src"].max()), int(a["pairs.tgt"].max())) >= n_text:
        raise CacheError(f"{cache.path / 'pairs.src.npy'}: a sentence number past the text")


# --------------------------------------------------------------------------- building


def _files(splits: list[DirectionSplit]) -> dict[str, str]:
    """Each distinct file (its resolved path) and its language, in order of first use."""
    files: dict[str, str] = {}
    for s in splits:
        for path, lang in ((s.src_path, s.direction.src), (s.tgt_path, s.direction.tgt)):
            files.setdefault(str(path.resolve()), lang)
    return files


def _spec(cfg: Any, splits: list[DirectionSplit], prints: InputFingerprints, tok: dict) -> dict:
    files = _files(splits)
    inputs = [{"path": p, "lang": lang, **prints.get(Path(p))} for p, lang in files.items()]
    index = {p: i for i, p in enumerate(files)}
    corpora = [
        [str(s.direction), index[str(s.src_path.resolve())], index[str(s.tgt_path.resolve())]]
        for s in splits
    ]
    options = {"max_len": int(cfg.max_len), "max_len_ratio": float(cfg.max_len_ratio)}
    blob = {
        "format": FORMAT,
        "inputs": [[i["sha256"], i["size"]] for i in inputs],
        "corpora": corpora,
        "options": {**options, "tokenizer": tok},
    }
    key = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()
    return {"key": key, "inputs": inputs, "corpora": corpora, "options": blob["options"]}


def _train_tokenizer(
    cfg: Any, files: dict[str, str], tags: list[str], progress: Progress
) -> TokenizerPair:
    """One sentencepiece model over an equal sample of every file's non-empty lines, with the
    tags as user-defined pieces."""
    per_file = max(1, math.ceil(2 * int(cfg.spm_sample) / len(files)))
    texts: list[str] = []
    for path in files:
        sample = Reservoir(per_file, SAMPLE_SEED)
        with progress.bar(f"sample {Path(path).name}", Path(path).stat().st_size, True) as adv:
            for block in iter_line_blocks(path, advance=adv):
                lines = [t for t in (line.strip() for line in block) if t]
                sample.add(lines, lines)
        texts += sample.src
    log.info("sentencepiece sample: %d lines of %d files", len(texts), len(files))
    tok = train_tokenizer(
        texts,
        Path(cfg.root) / "cache" / "spm",
        vocab_size=int(cfg.vocab_size),
        model_type=str(cfg.spm_model_type),
        character_coverage=float(cfg.character_coverage),
        progress=progress,
        user_defined_symbols=tags,
    )
    return TokenizerPair(tok, tok, True)


def _encode_files(
    tmp: Path, files: dict[str, str], tok: Tokenizer, progress: Progress
) -> tuple[list[dict], dict[str, _ArrayWriter]]:
    """Every line of every file, stripped and encoded, into the shared text arrays."""
    writers = {
        "text.tokens": _ArrayWriter(tmp / "text.tokens.npy", _token_dtype(tok.vocab_size)),
        "text.lengths": _ArrayWriter(tmp / "text.lengths.npy", np.int32),
        "text.offsets": _ArrayWriter(tmp / "text.offsets.npy", np.int64),
    }
    writers["text.offsets"].append(np.zeros(1, dtype=np.int64))
    records, sentences, tokens = [], 0, 0
    for path, lang in files.items():
        start, line = sentences, 1
        with progress.bar(f"encode {Path(path).name}", Path(path).stat().st_size, True) as adv:
            for block in iter_line_blocks(path, advance=adv):
                ids = tok.encode_batch([b.strip() for b in block])
                lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))  # (n,)
                flat = np.fromiter(
                    (i for s in ids for i in s), dtype=np.int64, count=int(lens.sum())
                )  # (tokens,)
                check_no_tags(flat, lens, tok, path, line)
                writers["text.tokens"].append(flat)
                writers["text.lengths"].append(lens)
                writers["text.offsets"].append(tokens + np.cumsum(lens))
                tokens += int(lens.sum())
                sentences += len(ids)
                line += len(ids)
        records.append({"path": path, "lang": lang, "start": start, "lines": sentences - start})
    return records, writers


def _pairs(
    splits: list[DirectionSplit], files: list[dict], lengths: np.ndarray, cfg: Any
) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """Per corpus and direction, the kept pairs' sentence numbers and the cleaning counts."""
    by_path = {f["path"]: f for f in files}
    records, src_parts, tgt_parts, start = [], [], [], 0
    for s in splits:
        fs, ft = by_path[str(s.src_path.resolve())], by_path[str(s.tgt_path.resolve())]
        if fs["lines"] != ft["lines"]:
            raise DataError(
                f"parallel files differ in length: {s.src_path} has {fs['lines']} lines, "
                f"{s.tgt_path} has {ft['lines']} lines"
            )
        ls = lengths[fs["start"] : fs["start"] + fs["lines"]]  # (n,)
        lt = lengths[ft["start"] : ft["start"] + ft["lines"]]  # (n,)
        nonempty = np.flatnonzero((ls > 0) & (lt > 0))
        keep, drops = filter_by_length(ls[nonempty], lt[nonempty], cfg.max_len, cfg.max_len_ratio)
        kept = nonempty[keep]
        stats = {"read": int(fs["lines"]), "dropped_empty": int(fs["lines"] - len(nonempty)),
                 **drops, "kept": len(kept)}  # fmt: skip
        if not len(kept):
            raise DataError(
                f"no training pairs left from {s.src_path} / {s.tgt_path}: read {stats['read']}, "
                f"dropped {stats['dropped_empty']} with an empty side, "
                f"{stats['dropped_too_long']} longer than data.max_len={cfg.max_len} tokens, "
                f"{stats['dropped_ratio']} with a length ratio above "
                f"data.max_len_ratio={cfg.max_len_ratio}"
            )
        log_corpus(s.name, stats)
        src_parts.append(fs["start"] + kept)
        tgt_parts.append(ft["start"] + kept)
        records.append({"name": s.name, "direction": str(s.direction), "start": start,
                        "pairs": len(kept), "stats": stats})  # fmt: skip
        start += len(kept)
    return records, np.concatenate(src_parts), np.concatenate(tgt_parts)


def _build(
    final: Path,
    spec: dict,
    splits: list[DirectionSplit],
    tokenizers: TokenizerPair | None,
    cfg: Any,
    progress: Progress,
) -> None:
    begin = time.perf_counter()
    tmp = final.parent / f".tmp-{final.name[:16]}-{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    writers: dict[str, _ArrayWriter] = {}
    try:
        files = _files(splits)
        if tokenizers is None:
            tokenizers = _train_tokenizer(cfg, files, tags_for(directions_of(cfg)), progress)
        atomic_write_bytes(tmp / "spm.model", tokenizers.src.proto)
        file_records, writers = _encode_files(tmp, files, tokenizers.src, progress)
        arrays = {name: w.close() for name, w in writers.items()}
        lengths = np.load(tmp / "text.lengths.npy", mmap_mode="r")
        records, src, tgt = _pairs(splits, file_records, lengths, cfg)
        for name, values in (("pairs.src", src), ("pairs.tgt", tgt)):
            writers[name] = _ArrayWriter(tmp / f"{name}.npy", np.int64)
            writers[name].append(values)
            arrays[name] = writers[name].close()
        manifest = {
            "format": FORMAT,
            "key": final.name,
            "inputs": spec["inputs"],
            "options": spec["options"],
            "files": file_records,
            "corpora": records,
            "pairs": int(len(src)),
            "tokenizer_sha256": hashlib.sha256(tokenizers.src.proto).hexdigest(),
            "tags": tokenizers.src.tags,
            "arrays": arrays,
            "seconds": time.perf_counter() - begin,
        }
        atomic_write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        open_multi(tmp, full=True, key=final.name)
        if _move_into_place(tmp, final):
            log.info(
                "prepared %d training pairs in %d directions from %d files in %.1fs -> %s",
                manifest["pairs"], len(directions_of(cfg)), len(file_records),
                time.perf_counter() - begin, final,
            )  # fmt: skip
    except BaseException:
        for w in writers.values():
            if not w.file.closed:
                w.discard()
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_multi_prepared(
    cfg: Any,
    tokenizers: TokenizerPair | None = None,
    verify: bool = False,
    source: Multi30kSource | None = None,
    progress: Progress = QUIET,
) -> MultiCache:
    """The multilingual preparation of a data config: opened if present and sound, else built
    (``tokenizers``: encode with these, e.g. a fine-tuned run's; they must carry the tags)."""
    splits = resolve_multi_train(cfg, source)
    base = Path(cfg.root) / "cache" / "prepared"
    prints = InputFingerprints(base / "inputs.json", rehash=verify)
    tok = {"given": _tokenizer_hashes(tokenizers)} if tokenizers else _recipe(cfg)
    if tokenizers is None:
        tok["trained"]["tags"] = tags_for(directions_of(cfg))
    spec = _spec(cfg, splits, prints, tok)
    final = base / spec["key"]
    cache = _try_open(final, verify)
    if cache is None:
        created = _make_dirs(base)
        lock = base / f".lock-{spec['key']}"
        try:
            with _locked(lock):
                try:
                    cache = _try_open(final, False)
                    if cache is None:
                        _sweep(base)
                        _build(final, spec, splits, tokenizers, cfg, progress)
                        cache = open_multi(final)
                finally:
                    lock.unlink(missing_ok=True)
        except BaseException:
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
    else:
        log.info("using prepared training data %s (%d pairs)", cache.path, cache.pairs)
        for c in cache.corpora:
            log_corpus(c["name"], c["stats"])
    prints.save()
    cache.splits = splits
    return cache


def _try_open(path: Path, full: bool) -> MultiCache | None:
    if not path.is_dir():
        return None
    try:
        return open_multi(path, full=full)
    except CacheError as problem:
        _discard(path, problem)
        return None
