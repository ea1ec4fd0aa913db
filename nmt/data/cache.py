"""The prepared training data on disk: its format, its key, and opening it (every check the
manifest allows).

A preparation (:mod:`nmt.data.binarize`) leaves a directory
``<data.root>/cache/prepared/<key>/``:

* ``{src,tgt}.tokens.npy``: every kept sentence's ids, one after the other (uint16 when the
  vocabulary has at most 65,536 entries, else int32);
* ``{src,tgt}.lengths.npy`` (int32, one per pair) and ``{src,tgt}.offsets.npy`` (int64, one
  more: sentence ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``);
* the sentencepiece model(s), ``spm.model`` (joint) or ``src.model`` and ``tgt.model``;
* ``manifest.json``: format version, the key's inputs (every input file's size and sha256,
  every option that changes the result), counts and cleaning statistics per corpus, the
  tokenizers' sha256, and each array's dtype, shape, size, sha256 and the sha256 of its last
  bytes.

The key is the sha256 of the manifest's inputs, like the sentencepiece cache's. Opening checks
sizes, shapes, counts, offsets and the arrays' last bytes (fast at any size); ``full=True``
(``nmt-prepare --verify``) also checks every checksum and the arrays' contents.

Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from nmt.atomic import atomic_write_bytes, sha256_file, sha256_range
from nmt.data.corpus import DataError
from nmt.data.splits import TrainSplit
from nmt.data.tokenizer import _CACHE_VERSION as SPM_RECIPE_VERSION
from nmt.data.tokenizer import Tokenizer, TokenizerPair

SplitT = TypeVar("SplitT")  # what a preparation was asked for: TrainSplit or DirectionSplit

FORMAT = "nmt-prepared/1"  # bump when the layout or the cleaning rules change
HEADER_BYTES = 128  # the .npy header, written with room for any shape
TAIL_BYTES = 1 << 16  # the last bytes of each array, checked at every open
SIDES = ("src", "tgt")
KINDS = ("tokens", "lengths", "offsets")
MANIFEST = "manifest.json"


class CacheError(DataError):
    """A prepared-data directory that cannot be trusted; the message names file and problem."""


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

    # per corpus: name, and src/tgt path, size, sha256 (text files) or the dataset's
    # path, format, column, languages and data files' paths, sizes and sha256
    inputs: list[dict]
    options: dict  # length filter and tokenizer (trained recipe or given models' sha256)

    @property
    def key(self) -> str:
        contents, sizes = [], []
        for i in self.inputs:
            if "dataset" in i:
                ds = i["dataset"]
                read = {k: ds[k] for k in ("format", "column", "langs")}
                contents.append({"dataset": [f["sha256"] for f in ds["files"]], **read})
                sizes.append({"dataset": [f["size"] for f in ds["files"]]})
            else:
                contents.append({"src": i["src"]["sha256"], "tgt": i["tgt"]["sha256"]})
                sizes.append({"src": i["src"]["size"], "tgt": i["tgt"]["size"]})
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
    inputs = [_input(c, prints) for c in corpora]
    options = {
        "max_len": int(cfg.max_len),
        "max_len_ratio": float(cfg.max_len_ratio),
        "tokenizer": tok,
    }
    return Spec(inputs, options)


def _input(c: TrainSplit, prints: InputFingerprints) -> dict:
    """A corpus's entry in the key's inputs."""
    if c.dataset is None:
        return {
            "name": c.name,
            "src": {"path": str(c.src_path), **prints.get(c.src_path)},
            "tgt": {"path": str(c.tgt_path), **prints.get(c.tgt_path)},
        }
    ds = c.dataset
    files = [{"path": str(f), **prints.get(f)} for f in ds.files]
    dataset = {"path": str(ds.path), "format": ds.format, "column": ds.column}
    return {"name": c.name, "dataset": {**dataset, "langs": list(ds.langs), "files": files}}


# --------------------------------------------------------------------------- opened caches


@dataclass
class OpenedCache(Generic[SplitT]):
    """An opened preparation (bilingual or multilingual): its manifest, tokenizers and
    memory-mapped arrays."""

    path: Path
    manifest: dict
    tokenizers: TokenizerPair
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # "src.tokens" -> memmap
    splits: list[SplitT] = field(default_factory=list)  # the files it was asked for

    @property
    def corpora(self) -> list[dict]:
        """Per corpus (and direction, in a multilingual preparation), in order: ``name``,
        ``start`` (first pair), ``pairs``, ``stats`` (and ``direction``)."""
        return self.manifest["corpora"]

    @property
    def pairs(self) -> int:
        return int(self.manifest["pairs"])


@dataclass
class PreparedCache(OpenedCache[TrainSplit]):
    """An opened prepared directory of one language pair."""

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
    if sha256_range(path, *_tail_range(info)) != info["tail_sha256"]:
        raise CacheError(f"{path}: its last bytes do not match the manifest's checksum")
    if full and sha256_range(path, HEADER_BYTES) != info["sha256"]:
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


def read_manifest(path: Path) -> tuple[Path, dict[str, Any]]:
    """A preparation's manifest file and what it holds; :class:`CacheError` naming the file when
    it is missing or not JSON."""
    man_path = path / MANIFEST
    try:
        return man_path, json.loads(man_path.read_text())
    except OSError as err:
        raise CacheError(f"{man_path}: missing ({err.strerror})") from err
    except ValueError as err:
        raise CacheError(f"{man_path}: not valid JSON ({err})") from err


def open_prepared(path: str | Path, full: bool = False, key: str | None = None) -> PreparedCache:
    """Open a prepared directory after checking it (every checksum too when ``full``).

    ``key``: the key its manifest must name (default: the directory's name). Raises
    :class:`CacheError` naming the file and the problem.
    """
    path = Path(path)
    key = path.name if key is None else key
    man_path, manifest = read_manifest(path)
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


SAMPLE_SEED = 20240901  # the sentencepiece sample's random draw (part of the key)
