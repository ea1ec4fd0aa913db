"""Corpora given as Hugging Face datasets (Parquet, JSON Lines, save_to_disk folders): the same
preparation, cleaning, counts and cache as text files, their errors, and a training run."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import re
import shutil
import sys
from pathlib import Path

import datasets  # the dev extra installs it, to write save_to_disk folders
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nmt.cli import Progress
from nmt.data import cache, hfdata
from nmt.data.binarize import ensure_prepared
from nmt.data.corpus import DataError, read_parallel
from nmt.data.datasets import load_test_sets, prepare_data
from nmt.data.splits import resolve_splits, resolve_train
from nmt.train.command import train

from .helpers import compose_config, data_cfg, tiny_run_overrides, write_subset

# pairs that cleaning drops or that only a dataset can hold (a line break inside a sentence)
ODD_PAIRS = [
    ("", "An empty source."),
    ("Ein leeres Ziel.", "   \t"),
    ("Zwei\nZeilen.", "Two\r\nlines."),
]


def as_text(pair: tuple[str, str]) -> tuple[str, str]:
    """The pair as a text file holds it: one line per sentence."""
    return pair[0].replace("\r\n", " ").replace("\n", " "), pair[1].replace("\r\n", " ")


@pytest.fixture(scope="module")
def pairs(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    """800 real Multi30k pairs and the odd ones, interleaved."""
    prefix = write_subset(multi30k, tmp_path_factory.mktemp("real"), "train", 800)
    out = list(zip(*read_parallel(f"{prefix}.de", f"{prefix}.en"), strict=True))
    for i, pair in enumerate(ODD_PAIRS):
        out.insert(100 + 250 * i, pair)
    return out


SIDES = (("src", "de"), ("tgt", "en"))


def write_text(prefix: Path, pairs: list[tuple[str, str]]) -> Path:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for lang, k in (("de", 0), ("en", 1)):
        lines = "".join(as_text(p)[k] + "\n" for p in pairs)
        Path(f"{prefix}.{lang}").write_text(lines, encoding="utf-8")
    return prefix


def rows(pairs: list[tuple[str, str]], column: str = "translation") -> list[dict]:
    return [{"id": i, column: {"de": s, "en": t}} for i, (s, t) in enumerate(pairs)]


def write_parquet(path: Path, pairs: list[tuple[str, str]], **row: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows(pairs, **row)), path, row_group_size=300)
    return path


def write_jsonl(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in rows(pairs)]
    text = "".join(lines[:1] + [" \n"] + lines[1:])  # a blank line is no row
    data = text.encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def write_saved(path: Path, pairs: list[tuple[str, str]]) -> Path:
    ds = datasets.Dataset.from_list(rows(pairs))
    ds.save_to_disk(str(path), num_shards=2)  # two Arrow files, read in the order listed
    return path


def write_hub(folder: Path, pairs: list[tuple[str, str]]) -> Path:
    """The Hub's layout: each split's Parquet files in one folder; the pattern of train's."""
    write_parquet(folder / "train-00000-of-00002.parquet", pairs[:500])
    write_parquet(folder / "train-00001-of-00002.parquet", pairs[500:])
    write_parquet(folder / "validation-00000-of-00001.parquet", pairs[:5])  # not read
    return folder / "train-*.parquet"


WRITERS = {
    "parquet": lambda d, p: write_parquet(d / "train.parquet", p),
    "parquet pattern": lambda d, p: write_hub(d / "hub", p),
    "jsonl": lambda d, p: write_jsonl(d / "train.jsonl", p),
    "jsonl.gz": lambda d, p: write_jsonl(d / "train.jsonl.gz", p),
    "save_to_disk": lambda d, p: write_saved(d / "saved", p),
}


def digests(cache_dir: Path) -> dict[str, str]:
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    return {name: info["sha256"] for name, info in manifest["arrays"].items()}


@pytest.fixture(scope="module")
def text_data(pairs: list, tmp_path_factory: pytest.TempPathFactory):
    """The pairs as text files, prepared with a trained tokenizer."""
    tmp = tmp_path_factory.mktemp("text")
    prefix = write_text(tmp / "corpus" / "train", pairs)
    return prefix, prepare_data(data_cfg(str(prefix), tmp / "root"))


# --------------------------------------------------------------------------- same as text


@pytest.mark.parametrize("layout", list(WRITERS))
def test_a_dataset_prepares_to_the_cache_of_the_same_text_files(
    layout: str, pairs: list, text_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hfdata, "BLOCK_ROWS", 128)  # several row batches per Parquet file
    path = WRITERS[layout](tmp_path, pairs)
    data = prepare_data(data_cfg(str(path), tmp_path / "root"))
    _, text = text_data
    assert text.stats["train"]["dropped_empty"] == 2
    assert data.stats["train"] == text.stats["train"]
    assert data.tokenizers.src.proto == text.tokenizers.src.proto  # the same sample
    assert digests(data.cache_dir) == digests(text.cache_dir)  # the same ids, in order
    assert data.valid.src_text == text.valid.src_text
    assert data.valid.ref_text == text.valid.ref_text
    assert "Zwei Zeilen." in data.valid.src_text
    manifest = json.loads((data.cache_dir / "manifest.json").read_text())
    assert manifest["inputs"][0]["dataset"]["langs"] == ["de", "en"]


@pytest.mark.parametrize("layout", list(WRITERS))
def test_reading_is_in_blocks_and_counts_every_byte(
    layout: str, pairs: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hfdata, "BLOCK_ROWS", 64)
    monkeypatch.setattr(hfdata, "JSONL_BLOCK_BYTES", 1 << 16)
    path = WRITERS[layout](tmp_path, pairs * 20)  # 16,060 rows
    (split,) = resolve_splits(data_cfg(str(path), tmp_path), [str(path)])
    counted: list[int] = []
    seen = []  # the bytes counted when each block arrives
    blocks = [(b, seen.append(sum(counted)))[0] for b in split.blocks(counted.append)]
    total = sum(f.stat().st_size for f in split.files)
    assert sum(counted) == total
    assert 0 < seen[0] < seen[len(seen) // 2] < total  # counted as the reading goes
    assert sum(len(s) for s, _ in blocks) == len(pairs) * 20
    assert len(blocks) > 4 and max(len(s) for s, _ in blocks) <= 2_000
    assert all(len(s) == len(t) for s, t in blocks)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_preparing_a_dataset_draws_bars_of_its_bytes(pairs: list, tmp_path: Path) -> None:
    saved = write_saved(tmp_path / "saved", pairs)
    out = Terminal()
    ensure_prepared(data_cfg(str(saved), tmp_path / "root"), progress=Progress(stream=out))
    ends = [part for part in out.getvalue().split("\r") if part.endswith("\n")]
    size = sum(f.stat().st_size for f in saved.glob("*.arrow"))
    for stage in ("sample", "encode"):
        (line,) = [e for e in ends if e.startswith(f"{stage} saved:")]
        drawn = re.search(r"\| (\S+)k/\1k \[", line)  # done/total in KiB, done == total
        assert "100%|" in line and drawn and abs(float(drawn[1]) * 1024 - size) < 1024, line


def test_a_dataset_mixes_with_text_corpora_by_weight(
    pairs: list, text_data, tmp_path: Path
) -> None:
    prefix, _ = text_data
    other = write_text(tmp_path / "other" / "crawl", pairs[:300])
    parquet = write_parquet(tmp_path / "news.parquet", pairs)
    mixed = prepare_data(data_cfg([f"{parquet}:2", f"{other}:0.5"], tmp_path / "root"))
    texts = prepare_data(data_cfg([f"{prefix}:2", f"{other}:0.5"], tmp_path / "root"))
    counts = [(c.pairs, c.weight) for c in mixed.train_corpora]
    assert counts == [(c.pairs, c.weight) for c in texts.train_corpora]
    assert [c["read"] for c in mixed.stats["corpora"]] == [len(pairs), 300]
    assert [c["weight"] for c in mixed.stats["corpora"]] == [2, 0.5]
    assert mixed.stats["corpora"][1:] == texts.stats["corpora"][1:]
    assert mixed.stats["train"] == texts.stats["train"]
    assert digests(mixed.cache_dir) == digests(texts.cache_dir)


def test_a_dataset_serves_as_validation_and_test_set(pairs: list, tmp_path: Path) -> None:
    jsonl = write_jsonl(tmp_path / "dev.jsonl.gz", pairs[:50])
    saved = write_saved(tmp_path / "test", pairs[50:80])
    hub = write_hub(tmp_path / "hub", pairs)
    cfg = data_cfg(str(jsonl), tmp_path, test=[str(saved), str(hub)])
    data = prepare_data(cfg)
    assert data.valid.name == "dev" and len(data.valid) == 50
    saved_set, hub_set = load_test_sets(cfg, data.tokenizers)
    assert saved_set.src_text == [s.strip() for s, _ in pairs[50:80]]
    assert len(hub_set) == len(pairs)
    assert (saved_set.name, hub_set.name) == ("test", "train")  # names of output files


# --------------------------------------------------------------------------- the cache


def test_the_cache_is_prepared_again_when_the_dataset_changes(
    pairs: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    for layout in ("parquet", "jsonl", "save_to_disk"):
        path = WRITERS[layout](tmp_path / layout, pairs)
        first = prepare_data(data_cfg(str(path), root)).cache_dir
        assert prepare_data(data_cfg(str(path), root)).cache_dir == first
        src, tgt = pairs[-1]
        changed = [*pairs[:-1], (src, tgt.swapcase())]  # JSON Lines: the same size
        if layout == "save_to_disk":
            shutil.rmtree(path)
        WRITERS[layout](tmp_path / layout, changed)
        second = prepare_data(data_cfg(str(path), root))
        assert second.cache_dir != first
        assert second.stats["train"]["read"] == len(pairs)
        flipped = prepare_data(data_cfg(str(path), root, src_lang="en", tgt_lang="de"))
        assert flipped.cache_dir != second.cache_dir  # the same files, read the other way
        assert flipped.valid.src_text == second.valid.ref_text


def test_text_corpora_keep_the_key_of_their_existing_caches(text_data, tmp_path: Path) -> None:
    prefix, _ = text_data
    cfg = data_cfg(str(prefix), tmp_path)
    prints = cache.InputFingerprints(tmp_path / "inputs.json")
    spec = cache._spec(cfg, resolve_train(cfg), prints, cache._recipe(cfg))
    files = {side: prints.get(Path(f"{prefix}.{lang}")) for side, lang in SIDES}
    blob = {  # the key as a text corpus had it before datasets were read
        "format": cache.FORMAT,
        "inputs": [{side: f["sha256"] for side, f in files.items()}],
        "sizes": [{side: f["size"] for side, f in files.items()}],
        "options": spec.options,
    }
    assert spec.key == hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- bad input


def parquet_with(path: Path, table: pa.Table) -> Path:
    pq.write_table(table, path)
    return path


BAD = {
    "parquet_no_column": (
        lambda d: write_parquet(d / "c.parquet", [("a", "b")], column="pairs"),
        r"c\.parquet: no column 'translation' \(columns: id, pairs\)",
    ),
    "parquet_no_language": (
        lambda d: parquet_with(
            d / "l.parquet", pa.Table.from_pylist([{"translation": {"de": "a", "fr": "b"}}])
        ),
        r"l\.parquet: column 'translation' has languages de, fr, not 'en'",
    ),
    "parquet_not_a_mapping": (
        lambda d: parquet_with(d / "m.parquet", pa.Table.from_pylist([{"translation": "a"}])),
        r"m\.parquet: column 'translation' holds string, not a mapping",
    ),
    "parquet_null_value": (
        lambda d: parquet_with(
            d / "n.parquet",
            pa.Table.from_pylist(
                [{"translation": {"de": "a", "en": "b"}}] * 3
                + [{"translation": {"de": "a", "en": None}}]
            ),
        ),
        r"n\.parquet: row 4: translation\.en is null, not a string",
    ),
    "parquet_null_row": (
        lambda d: parquet_with(
            d / "r.parquet",
            pa.Table.from_pylist([{"translation": {"de": "a", "en": "b"}}, {"translation": None}]),
        ),
        r"r\.parquet: row 2: translation is null, not a mapping",
    ),
    "jsonl_no_column": (
        lambda d: _jsonl(d / "c.jsonl", [{"text": "a"}]),
        r"c\.jsonl:1: no column 'translation' \(columns: text\)",
    ),
    "jsonl_no_language": (
        lambda d: _jsonl(
            d / "l.jsonl", [{"translation": {"de": "a", "en": "b"}}, {"translation": {"de": "a"}}]
        ),  # fmt: skip
        r"l\.jsonl:2: column 'translation' has languages de, not 'en'",
    ),
    "jsonl_not_an_object": (
        lambda d: _jsonl(d / "o.jsonl", [{"translation": {"de": "a", "en": "b"}}, ["a", "b"]]),
        r"o\.jsonl:2: the row is an array, not an object",
    ),
    "jsonl_not_a_string": (
        lambda d: _jsonl(
            d / "s.jsonl",
            [{"translation": {"de": "a", "en": "b"}}] * 2 + [{"translation": {"de": 7, "en": "b"}}],
        ),  # fmt: skip
        r"s\.jsonl:3: translation\.de is a number, not a string",
    ),
    "jsonl_not_json": (
        lambda d: (
            (d / "j.jsonl").write_text('{"translation": {"de": "a", "en": "b"}}\n{"tr\n')
            and d / "j.jsonl"
        ),
        r"j\.jsonl:2: not valid JSON",
    ),
    "save_to_disk_no_language": (
        lambda d: (
            datasets.Dataset.from_list([{"translation": {"de": "a", "cs": "b"}}]).save_to_disk(
                str(d / "saved")
            )
            or d / "saved"
        ),
        r"saved/data-00000-of-00001\.arrow: column 'translation' has languages (de, cs|cs, de)",
    ),
    "save_to_disk_several_splits": (
        lambda d: (
            datasets.DatasetDict(
                train=datasets.Dataset.from_list(rows([("a", "b")])),
                validation=datasets.Dataset.from_list(rows([("a", "b")])),
            ).save_to_disk(str(d / "dd"))
            or d / "dd"
        ),
        r"dd: a dataset of several splits \(train, validation\); name the folder of one, "
        r"e\.g\. .*dd/train",
    ),
    "parquet_folder": (
        lambda d: write_parquet(d / "hub" / "test-00000-of-00001.parquet", [("a", "b")]).parent,
        r"hub: a folder of Parquet files; name one split's files with a pattern, "
        r"e\.g\. .*hub/test-\*\.parquet",
    ),
    "parquet_pattern_matching_nothing": (
        lambda d: d / "train-*.parquet",
        r"train-\*\.parquet: the pattern matches no file",
    ),
    "missing_file": (lambda d: d / "gone.parquet", r"gone\.parquet: no such dataset file"),
}


def _jsonl(path: Path, objs: list) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


@pytest.mark.parametrize("case", list(BAD))
def test_bad_datasets_give_one_line_naming_file_row_and_column(case: str, tmp_path: Path) -> None:
    make, message = BAD[case]
    path = make(tmp_path)
    (tmp_path / "va.de").write_text("a\n")
    (tmp_path / "va.en").write_text("b\n")
    cfg = data_cfg(str(path), tmp_path / "root", valid=str(tmp_path / "va"))
    with pytest.raises(DataError, match=message) as err:
        prepare_data(cfg)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "root").exists()  # nothing left behind


def test_a_missing_pyarrow_names_the_extra(
    pairs: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_parquet(tmp_path / "t.parquet", pairs[:120])
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(DataError, match=r"t\.parquet: .*needs pyarrow: .*nmt\[hf-data\]"):
        prepare_data(data_cfg(str(path), tmp_path / "root"))
    jsonl = write_jsonl(tmp_path / "t.jsonl", pairs[:120])  # JSON Lines need no pyarrow
    assert prepare_data(data_cfg(str(jsonl), tmp_path / "root")).stats["train"]["read"] == 120


# --------------------------------------------------------------------------- training


def test_a_tiny_run_trains_from_a_parquet_corpus(
    pairs: list, tmp_path: Path, caplog: pytest.LogCaptureFixture, one_thread: None
) -> None:
    parquet = write_parquet(tmp_path / "corpus" / "train.parquet", pairs[:200])
    caplog.set_level(logging.INFO)
    overrides = tiny_run_overrides(
        parquet, tmp_path, "trainer.max_steps=3", "trainer.val_every=3", "trainer.threads=1"
    )
    result = train(compose_config("train", overrides), tmp_path / "run")
    assert result["state"]["step"] == 3
    assert "train train: read 200, dropped empty 1" in caplog.text
