"""Parallel corpora stored as Hugging Face datasets.

Three layouts are read, chosen by the path alone (nothing in the data chooses code):

* a Parquet file (``*.parquet``), or several named by a pattern in the file name
  (``de-en/train-*.parquet``, read in name order), as the Hub serves its datasets;
* a JSON Lines file (``*.jsonl``, or gzip-compressed ``*.jsonl.gz``), one JSON object a line;
* a folder written by ``datasets``' ``save_to_disk`` (it holds ``state.json``): the Arrow
  stream files it lists. A folder of a ``DatasetDict`` holds one such folder per split.

Every row holds, in one column (``data.column``, by default ``translation``, the layout of the
Hub's translation datasets), a mapping from language code to sentence:
``{"translation": {"de": "Ein Hund.", "en": "A dog."}}``. A corpus is read a block of rows at a
time (Parquet row batches, Arrow record batches, JSON lines in blocks of about a MiB), so memory
is bounded by the block and not by the corpus; the bytes read are counted as for text files.
Each sentence is one line of the text-file layout: line breaks and NUL characters inside it
become spaces.

Parquet and Arrow need ``pyarrow`` (the ``hf-data`` extra: ``pip install 'nmt[hf-data]'``),
imported only when such a corpus is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt.cli import Advance, no_progress
from nmt.data.corpus import BLOCK_BYTES, DataError, iter_line_blocks

PARQUET = "parquet"
JSONL = "jsonl"
ARROW = "arrow"  # a save_to_disk folder
BLOCK_ROWS = 10_000  # rows read at a time from a Parquet file
JSONL_BLOCK_BYTES = BLOCK_BYTES  # bytes read at a time from a JSON Lines file
BUFFER_BYTES = 1 << 20  # a Parquet column chunk is read in pieces of this size
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
_MARKERS = ("state.json", "dataset_info.json", "dataset_dict.json")  # written by save_to_disk
_BREAKS = str.maketrans({"\n": " ", "\r": " ", "\0": " "})


def _one_line(sentences: list[str]) -> list[str]:
    """The sentences with each line break (``\\r\\n``, ``\\n`` or ``\\r``) and NUL replaced
    by a space, as a line of a text file holds them."""
    joined = "".join(sentences)
    if "\n" not in joined and "\r" not in joined and "\0" not in joined:
        return sentences
    return [s.replace("\r\n", "\n").translate(_BREAKS) for s in sentences]


@dataclass(frozen=True)
class Dataset:
    """A dataset corpus: the path named, its layout, its data files and what to read."""

    path: Path
    format: str  # PARQUET, JSONL or ARROW
    files: tuple[Path, ...]
    column: str
    langs: tuple[str, str]  # source, target


def is_dataset(path: str | Path) -> bool:
    """Whether ``path`` names a dataset rather than the prefix of a pair of text files: an
    existing ``.parquet`` / ``.jsonl`` / ``.jsonl.gz`` file, a pattern of Parquet files, or a
    folder that ``save_to_disk`` wrote (or one of Parquet files, which is refused)."""
    p = Path(path)
    if p.is_dir():
        return any((p / m).is_file() for m in _MARKERS) or any(p.glob("*.parquet"))
    if _is_pattern(p):
        return True
    return p.is_file() and _file_format(p) is not None


def _is_pattern(path: Path) -> bool:
    return _file_format(path) == PARQUET and ("*" in path.name or "?" in path.name)


def dataset_name(ds: Dataset) -> str:
    """A short name for logs and output files: the file's name without its suffix, the part of
    a pattern before its first wildcard (``train-*.parquet``: ``train``), or the folder's."""
    name = ds.path.name
    if ds.format == ARROW:
        return name
    wild = [name.index(c) for c in "*?" if c in name]
    if wild:
        stem = name[: min(wild)].rstrip("-_.")
    else:
        stem = next(name[: -len(s)] for s in (".parquet", *_JSONL_SUFFIXES) if name.endswith(s))
    return stem or ds.path.parent.name or name


def has_dataset_suffix(path: str | Path) -> bool:
    """Whether the name ends like a dataset file's (existing or not)."""
    return _file_format(Path(path)) is not None


def _file_format(path: Path) -> str | None:
    name = path.name
    if name.endswith(".parquet"):
        return PARQUET
    if name.endswith(_JSONL_SUFFIXES):
        return JSONL
    return None


def open_dataset(path: str | Path, src_lang: str, tgt_lang: str, column: str) -> Dataset:
    """The dataset at ``path``, its column and both languages checked in every data file
    (Parquet and Arrow: their schema; JSON Lines: the first row). Raises :class:`DataError`
    naming the file, the column and what it holds."""
    p = Path(path)
    if p.is_dir():
        fmt, files = _folder_files(p)
    elif _is_pattern(p):
        fmt, files = PARQUET, tuple(sorted(f for f in p.parent.glob(p.name) if f.is_file()))
        if not files:
            raise DataError(f"{p}: the pattern matches no file")
    else:
        fmt, files = _file_format(p), (p,)
        if fmt is None or not p.is_file():
            raise DataError(f"{p}: no such dataset file")
    ds = Dataset(p, fmt, files, column, (src_lang, tgt_lang))
    for file in files:
        if fmt == JSONL:
            _check_first_row(ds, file)
        else:
            _check_schema(ds, file, _schema(ds, file))
    return ds


def _folder_files(folder: Path) -> tuple[str, tuple[Path, ...]]:
    if (folder / "dataset_dict.json").is_file():
        splits = _json_file(folder / "dataset_dict.json").get("splits", [])
        names = ", ".join(str(s) for s in splits) if isinstance(splits, list) else "?"
        example = folder / str(splits[0]) if isinstance(splits, list) and splits else folder
        raise DataError(
            f"{folder}: a dataset of several splits ({names}); name the folder of one, "
            f"e.g. {example}"
        )
    state = folder / "state.json"
    if state.is_file():
        entries = _json_file(state).get("_data_files")
        if not isinstance(entries, list) or not entries:
            raise DataError(f"{state}: lists no data files (_data_files)")
        files = []
        for entry in entries:
            name = entry.get("filename") if isinstance(entry, dict) else None
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise DataError(f"{state}: {entry!r} in _data_files is not a file name")
            if not (folder / name).is_file():
                raise DataError(f"{state}: lists {name}, which is missing from {folder}")
            files.append(folder / name)
        return ARROW, tuple(files)
    parquet = sorted(folder.glob("*.parquet"))
    if parquet:  # the Hub keeps every split's files in one folder: they are named, not guessed
        raise DataError(
            f"{folder}: a folder of Parquet files; name one split's files with a pattern, "
            f"e.g. {folder / (parquet[0].name.split('-')[0] + '-*.parquet')}"
        )
    raise DataError(f"{folder}: holds no state.json (save_to_disk)")


def _json_file(path: Path) -> dict:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable JSON file ({err})") from err
    if not isinstance(loaded, dict):
        raise DataError(f"{path}: not a JSON object")
    return loaded


# --------------------------------------------------------------------------- pyarrow


def _pyarrow(file: Path) -> Any:
    """The pyarrow module (with its parquet, ipc and compute parts), or a DataError naming
    the extra that installs it."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError as err:
        raise DataError(
            f"{file}: reading Parquet or Arrow datasets needs pyarrow: pip install 'nmt[hf-data]'"
        ) from err
    return pyarrow


def _schema(ds: Dataset, file: Path) -> Any:
    pa = _pyarrow(file)
    try:
        if ds.format == PARQUET:
            return pa.parquet.read_schema(file)
        with pa.memory_map(str(file)) as source:
            return pa.ipc.open_stream(source).schema
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{file}: not a readable {_KIND[ds.format]} file ({err})") from err


_KIND = {PARQUET: "Parquet", ARROW: "Arrow stream", JSONL: "JSON Lines"}


def _check_schema(ds: Dataset, file: Path, schema: Any) -> None:
    pa = _pyarrow(file)
    column = ds.column
    if schema.get_field_index(column) < 0:
        raise DataError(
            f"{file}: no column {column!r} (columns: {', '.join(schema.names) or 'none'}); "
            "data.column names the one holding the translations"
        )
    kind = schema.field(column).type
    if not pa.types.is_struct(kind):
        raise DataError(
            f"{file}: column {column!r} holds {kind}, not a mapping from language to sentence"
        )
    have = [kind.field(i).name for i in range(kind.num_fields)]
    for lang in ds.langs:
        if lang not in have:
            raise DataError(_missing_language(file, column, have, lang))
        sub = kind.field(lang).type
        if not (pa.types.is_string(sub) or pa.types.is_large_string(sub)):
            raise DataError(f"{file}: {column}.{lang} holds {sub}, not strings")


def _missing_language(where: str | Path, column: str, have: Sequence[str], lang: str) -> str:
    return (
        f"{where}: column {column!r} has languages {', '.join(have) or 'none'}, not {lang!r} "
        "(data.src_lang, data.tgt_lang)"
    )


def _columns(ds: Dataset, file: Path, col: Any, first_row: int) -> tuple[list[str], list[str]]:
    """Both languages' sentences of a block of the translation column (a struct array)."""
    pa = _pyarrow(file)
    pc = pa.compute
    if col.null_count:
        row = first_row + pc.index(pc.is_null(col), True).as_py()
        raise DataError(f"{file}: row {row}: {ds.column} is null, not a mapping")
    sides = []
    for lang in ds.langs:
        values = pc.struct_field(col, lang)
        if values.null_count:
            row = first_row + pc.index(pc.is_null(values), True).as_py()
            raise DataError(f"{file}: row {row}: {ds.column}.{lang} is null, not a string")
        sides.append(_one_line(values.to_pylist()))
    return sides[0], sides[1]


def _parquet_blocks(ds: Dataset, file: Path, advance: Advance) -> Iterator[tuple[list, list]]:
    """A Parquet file's pairs in row batches; ``advance`` gets the file's bytes in proportion
    to the rows read."""
    pa = _pyarrow(file)
    size = file.stat().st_size
    sent = 0
    try:
        pf = pa.parquet.ParquetFile(file, pre_buffer=False, buffer_size=BUFFER_BYTES)
        _check_schema(ds, file, pf.schema_arrow)
        total = max(pf.metadata.num_rows, 1)
        row = 1
        for batch in pf.iter_batches(batch_size=BLOCK_ROWS, columns=[ds.column]):
            pairs = _columns(ds, file, batch.column(0), row)
            row += batch.num_rows
            done = size * min(row - 1, total) // total
            advance(done - sent)
            sent = done
            yield pairs
    except pa.ArrowException as err:
        raise DataError(f"{file}: not a readable Parquet file ({err})") from err
    advance(size - sent)


def _arrow_blocks(ds: Dataset, file: Path, advance: Advance) -> Iterator[tuple[list, list]]:
    """An Arrow stream file's pairs, a record batch at a time; ``advance`` gets the bytes."""
    pa = _pyarrow(file)
    sent = 0
    try:
        with pa.OSFile(str(file)) as source:  # read, not mapped: one batch in memory at a time
            reader = pa.ipc.open_stream(source)
            _check_schema(ds, file, reader.schema)
            index = reader.schema.get_field_index(ds.column)
            row = 1
            for batch in reader:
                pairs = _columns(ds, file, batch.column(index), row)
                row += batch.num_rows
                position = source.tell()
                advance(position - sent)
                sent = position
                yield pairs
    except pa.ArrowException as err:
        raise DataError(f"{file}: not a readable Arrow stream file ({err})") from err
    advance(file.stat().st_size - sent)


# --------------------------------------------------------------------------- JSON Lines


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               int: "a number", float: "a number", type(None): "null"}  # fmt: skip


def _row_pair(ds: Dataset, file: Path, line_no: int, line: str) -> tuple[str, str] | None:
    """The pair of one JSON line (None for a blank line)."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except ValueError as err:
        raise DataError(f"{file}:{line_no}: not valid JSON ({err})") from err
    if not isinstance(row, dict):
        raise DataError(f"{file}:{line_no}: the row is {_JSON_TYPES[type(row)]}, not an object")
    if ds.column not in row:
        raise DataError(
            f"{file}:{line_no}: no column {ds.column!r} (columns: {', '.join(row) or 'none'}); "
            "data.column names the one holding the translations"
        )
    value = row[ds.column]
    if not isinstance(value, dict):
        raise DataError(
            f"{file}:{line_no}: {ds.column} is {_JSON_TYPES[type(value)]}, not a mapping"
        )
    out = []
    for lang in ds.langs:
        if lang not in value:
            raise DataError(_missing_language(f"{file}:{line_no}", ds.column, list(value), lang))
        text = value[lang]
        if not isinstance(text, str):
            raise DataError(
                f"{file}:{line_no}: {ds.column}.{lang} is {_JSON_TYPES[type(text)]}, not a string"
            )
        out.append(text)
    return out[0], out[1]


def _jsonl_blocks(ds: Dataset, file: Path, advance: Advance) -> Iterator[tuple[list, list]]:
    """A JSON Lines file's pairs, a block of lines at a time (bytes counted as a text file's)."""
    line_no = 1
    for lines in iter_line_blocks(file, JSONL_BLOCK_BYTES, advance):
        src: list[str] = []
        tgt: list[str] = []
        for line in lines:
            pair = _row_pair(ds, file, line_no, line)
            line_no += 1
            if pair is not None:
                src.append(pair[0])
                tgt.append(pair[1])
        yield _one_line(src), _one_line(tgt)


def _check_first_row(ds: Dataset, file: Path) -> None:
    line_no = 1
    for lines in iter_line_blocks(file):
        for line in lines:
            if _row_pair(ds, file, line_no, line) is not None:
                return
            line_no += 1


# --------------------------------------------------------------------------- reading


_READERS = {PARQUET: _parquet_blocks, ARROW: _arrow_blocks, JSONL: _jsonl_blocks}


def iter_dataset_blocks(
    ds: Dataset, advance: Advance = no_progress
) -> Iterator[tuple[list[str], list[str]]]:
    """Aligned blocks of (source, target) sentences of every data file of ``ds``, in order.

    ``advance`` is called with the bytes read, which add up to the files' sizes.
    """
    read = _READERS[ds.format]
    for file in ds.files:
        yield from read(ds, file, advance)
