"""Hostile input: bad downloads, hostile corpora, impossible configs, and bounded memory when
decoding a huge line."""

from __future__ import annotations

import gzip
import http.server
import logging
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from nmt.atomic import sha256_file
from nmt.config import ConfigError, TransformerConfig
from nmt.data.batching import TokenDataset, make_batch
from nmt.data.corpus import (
    MULTI30K_SHA256,
    DataError,
    clean_pairs,
    fetch_multi30k,
    read_parallel,
)
from nmt.data.tokenizer import PAD_ID
from nmt.decode import search as search_mod
from nmt.decode.options import DecodeOptions
from nmt.decode.search import decode_dataset
from nmt.environment import Multi30kSource
from nmt.models.registry import create_model
from nmt.train.command import train

from .helpers import compose_config, tiny_run_overrides

QUICK = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# --------------------------------------------------------------------------- 4. downloads


@pytest.fixture
def serve() -> Iterator[Callable[[bytes, bool], Multi30kSource]]:
    """A loopback HTTP server standing in for the Multi30k URL.

    ``serve(body, announce_length)`` sets what every request gets and returns the source that
    fetches from the server; with ``announce_length=False`` the body ends with the connection
    (no Content-Length).
    """
    content: dict[str, Any] = {"body": b"", "length": True}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            self.send_response(200)
            if content["length"]:
                self.send_header("Content-Length", str(len(content["body"])))
            self.end_headers()
            self.wfile.write(content["body"])

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    source = Multi30kSource(url=f"http://127.0.0.1:{server.server_address[1]}")

    def set_content(body: bytes, announce_length: bool = True) -> Multi30kSource:
        content.update(body=body, length=announce_length)
        return source

    yield set_content
    server.shutdown()
    server.server_close()


def test_partial_download_without_length_is_caught_by_the_checksum(
    tmp_path: Path, multi30k: Path, serve: Callable[[bytes, bool], Multi30kSource]
) -> None:
    real = (multi30k / "val.en.gz").read_bytes()
    source = serve(real[: len(real) // 2], False)
    with pytest.raises(DataError, match=r"sha256 mismatch for val\.en\.gz.*deleted"):
        fetch_multi30k(tmp_path, ["en"], ["val"], source)
    assert list((tmp_path / "multi30k").iterdir()) == []


def test_wrong_file_of_the_right_size_is_deleted_and_reported(
    tmp_path: Path, multi30k: Path, serve: Callable[[bytes, bool], Multi30kSource]
) -> None:
    real = bytearray((multi30k / "val.en.gz").read_bytes())
    real[len(real) // 2] ^= 0x01
    source = serve(bytes(real), True)
    with pytest.raises(DataError, match=r"expected 14f7d25d.*got .*deleted") as err:
        fetch_multi30k(tmp_path, ["en"], ["val"], source)
    assert "127.0.0.1" in str(err.value)
    assert list((tmp_path / "multi30k").iterdir()) == []


def test_leftovers_of_an_interrupted_download_are_never_used(
    tmp_path: Path, multi30k: Path, serve: Callable[[bytes, bool], Multi30kSource],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    real = (multi30k / "val.en.gz").read_bytes()
    base = tmp_path / "multi30k"
    base.mkdir()
    (base / ".val.en.gz.abc123.tmp").write_bytes(real)  # a killed transfer's temporary file
    (base / "val.en.gz").write_bytes(real[:1000])  # a partial copy under the final name
    source = serve(real, True)
    caplog.set_level(logging.WARNING, logger="nmt.data")
    fetch_multi30k(tmp_path, ["en"], ["val"], source)
    assert sha256_file(base / "val.en.gz") == MULTI30K_SHA256["val.en.gz"]
    assert sorted(p.name for p in base.iterdir()) == ["val.en.gz"]  # the leftover is deleted
    assert "val.en.gz has sha256" in caplog.text and "fetching it again" in caplog.text


# --------------------------------------------------------------------------- 5. hostile corpora

NASTY = st.text(
    alphabet=st.sampled_from(
        ["a", "Z", "ß", "狗", "🙂", " ", "\t", "\r", "\0", "\x0b", "\x0c", "\x1c", "\x85",
         "\u2028", "\u00a0", "\ufeff", "<", ">", "1"]
    ),
    max_size=12,
)  # fmt: skip
BLANK = st.text(  # never empty: an empty last line without a final newline is no line at all
    alphabet=st.sampled_from([" ", "\t", "\r", "\x0b", "\u3000", "\0"]), min_size=1, max_size=4
)


def tagged(i: int, noise: tuple[str, str]) -> str:
    """A line carrying its index as ``[i]`` between two bits of noise (no brackets in noise)."""
    return f"{noise[0]}[{i}]{noise[1]}"


def encode_file(lines: list[str], bom: bool, crlf: bool, final_newline: bool) -> bytes:
    eol = "\r\n" if crlf else "\n"
    text = eol.join(lines) + (eol if final_newline and lines else "")
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8", "surrogatepass")


def write_pair(tmp: Path, src: bytes, tgt: bytes, gz: bool | str) -> tuple[Path, Path]:
    """Write both sides; ``gz``: True (gzipped), False (plain) or "fake" (plain, named .gz)."""
    suffix = ".gz" if gz else ""
    paths = tmp / f"c.de{suffix}", tmp / f"c.en{suffix}"
    for path, data in zip(paths, (src, tgt), strict=True):
        path.write_bytes(gzip.compress(data, mtime=0) if gz is True else data)
    return paths


def read_and_clean(src: Path, tgt: Path) -> tuple[list[str], list[str]] | DataError:
    """read_parallel + clean_pairs, as prepare_data runs them; a DataError is returned."""
    try:
        kept_src, kept_tgt, stats = clean_pairs(*read_parallel(src, tgt))
    except DataError as err:
        return err
    assert stats["kept"] == len(kept_src) == len(kept_tgt)
    return kept_src, kept_tgt


@QUICK
@given(
    src=st.binary(max_size=300), tgt=st.binary(max_size=300),
    gz=st.sampled_from([False, True, "fake"]),
    prefix=st.sampled_from([b"", b"\xef\xbb\xbf", b"\xed\xa0\x80", b"\0\0", b"\r\n"]),
)  # fmt: skip
def test_random_bytes_give_a_result_or_a_data_error(
    tmp_path: Path, src: bytes, tgt: bytes, gz: bool | str, prefix: bytes
) -> None:
    paths = write_pair(tmp_path, prefix + src, tgt, gz)
    out = read_and_clean(*paths)
    if isinstance(out, DataError):
        assert any(str(p) in str(out) for p in paths), out
    else:
        assert all("\n" not in x and x == x.strip() and x for x in out[0] + out[1])


@QUICK
@given(
    rows=st.lists(
        st.tuples(st.booleans(), st.tuples(NASTY, NASTY), st.tuples(NASTY, NASTY), BLANK),
        max_size=25,
    ),
    src_style=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    tgt_style=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    gz=st.booleans(),
)
def test_valid_text_stays_aligned_line_by_line(
    tmp_path: Path, rows: list, src_style: tuple, tgt_style: tuple, gz: bool
) -> None:
    """BOM, CRLF, NUL, separators, blank sides: pair i of the output is line i of both files."""
    src_lines, tgt_lines, expected = [], [], []
    for i, (blank_side, s_noise, t_noise, blank) in enumerate(rows):
        src_lines.append(tagged(i, s_noise))
        tgt_lines.append(blank if blank_side else tagged(i, t_noise))
        if not blank_side:
            expected.append(i)
    paths = write_pair(
        tmp_path, encode_file(src_lines, *src_style), encode_file(tgt_lines, *tgt_style), gz
    )
    out = read_and_clean(*paths)
    assert not isinstance(out, DataError), out
    kept_src, kept_tgt = out
    ids = [[int(m) for m in re.findall(r"\[(\d+)\]", x)] for x in (*kept_src, *kept_tgt)]
    assert ids == [[i] for i in expected] * 2


@QUICK
@given(
    lines=st.lists(NASTY, min_size=1, max_size=20),
    bad_line=st.integers(0, 19),
    bad=st.sampled_from([b"\xed\xa0\x80", b"\xff", b"\xc3", b"\xe2\x82", b"\xf8\x88\x80\x80\x80"]),
    style=st.tuples(st.booleans(), st.booleans()),
    gz=st.booleans(),
)  # fmt: skip
def test_invalid_utf8_names_file_and_line(
    tmp_path: Path, lines: list[str], bad_line: int, bad: bytes, style: tuple, gz: bool
) -> None:
    bad_line %= len(lines)
    raw = [x.encode() for x in lines]
    raw[bad_line] = raw[bad_line][: len(raw[bad_line]) // 2] + bad + b"x"
    eol = b"\r\n" if style[1] else b"\n"
    data = (b"\xef\xbb\xbf" if style[0] else b"") + eol.join(raw) + eol
    src, tgt = write_pair(tmp_path, b"ok\n" * len(lines), data, gz)
    out = read_and_clean(src, tgt)
    assert isinstance(out, DataError)
    assert f"{tgt}:{bad_line + 1}: invalid UTF-8" in str(out)


@QUICK
@given(n_src=st.integers(0, 30), n_tgt=st.integers(0, 30), final_newline=st.booleans())
def test_mismatched_line_counts_never_pair_silently(
    tmp_path: Path, n_src: int, n_tgt: int, final_newline: bool
) -> None:
    src = encode_file([f"s{i}" for i in range(n_src)], False, False, final_newline)
    tgt = encode_file([f"t{i}" for i in range(n_tgt)], False, True, True)
    paths = write_pair(tmp_path, src, tgt, False)
    out = read_and_clean(*paths)
    if n_src == n_tgt:
        assert out == ([f"s{i}" for i in range(n_src)], [f"t{i}" for i in range(n_tgt)])
    else:
        assert isinstance(out, DataError)
        assert f"{paths[0]} has {n_src} lines" in str(out)
        assert f"{paths[1]} has {n_tgt} lines" in str(out)


def test_extremely_long_and_whitespace_lines_keep_alignment(tmp_path: Path) -> None:
    long = "Wort " * 400_000  # a 2 MB line
    src = ["eins", long, " \t ", "\0\0", "vier"]
    tgt = ["one", "two", "three", "four", "five " * 300_000]
    paths = write_pair(
        tmp_path, encode_file(src, True, True, True), encode_file(tgt, False, False, False), True
    )
    kept_src, kept_tgt = read_and_clean(*paths)  # type: ignore[misc]
    assert kept_src == ["eins", long.strip(), "vier"]
    assert kept_tgt == ["one", "two", ("five " * 300_000).strip()]


# --------------------------------------------------------------------------- 6. config errors


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.lr=-0.001", "optim.lr"),
        ("model.heads=3", "model.heads"),
        ("data.max_tokens=90", "data.max_tokens"),
    ],
)
def test_invalid_config_stops_train_before_any_data_is_read(
    corpus: Path, tmp_path: Path, override: str, key: str
) -> None:
    cfg = compose_config("train", tiny_run_overrides(corpus, tmp_path, override))
    with pytest.raises(ConfigError, match=re.escape(key)):
        train(cfg, tmp_path / "outputs" / "runs" / "x")
    assert not (tmp_path / "data").exists()
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "group, valid", [("model", ["transformer", "gru_bahdanau"]), ("data", ["multi30k_de_en"])]
)
def test_unknown_group_option_lists_the_valid_ones(group: str, valid: list[str]) -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_config("train", [f"{group}=no_such_thing"])
    assert "no_such_thing" in str(err.value)
    for name in valid:
        assert name in str(err.value)


# --------------------------------------------------------------------------- 7. decoding memory


def test_decoding_a_huge_line_among_thousands_stays_within_budget(
    monkeypatch: pytest.MonkeyPatch, threads_restored: None
) -> None:
    torch.set_num_threads(1)  # tiny tensors: more threads only wait for each other
    rng = np.random.default_rng(0)
    vocab = 40
    lengths = [5000, *rng.integers(1, 13, size=3000).tolist()]
    src = [rng.integers(4, vocab, size=n).tolist() for n in lengths]
    data = TokenDataset(src, [[5]] * len(src))
    torch.manual_seed(0)
    cfg = OmegaConf.structured(
        TransformerConfig(d_model=16, heads=2, d_ff=32, enc_layers=1, dec_layers=1,
                          max_positions=128)
    )  # fmt: skip

    model = create_model(
        cfg, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=PAD_ID, shared_vocab=True
    )
    opts = DecodeOptions(max_output_len_a=1.2, max_output_len_b=4, max_tokens=600)
    batches: list[np.ndarray] = []
    encoded: list[tuple[int, int]] = []
    real_make_batch, real_encode = make_batch, model.encode

    def recording_make_batch(ds: TokenDataset, idx: Any) -> Any:
        batches.append(np.asarray(idx))
        return real_make_batch(ds, idx)

    def recording_encode(src_ids: torch.Tensor, src_lens: torch.Tensor) -> Any:
        encoded.append(tuple(src_ids.shape))
        return real_encode(src_ids, src_lens)

    monkeypatch.setattr(search_mod, "make_batch", recording_make_batch)
    monkeypatch.setattr(model, "encode", recording_encode)
    hyps = decode_dataset(model, data, opts, torch.device("cpu"))

    assert len(hyps) == len(src)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(src)))  # each once
    for idx in batches:
        src_lens = data.src_lens[idx]
        caps = opts.caps(src_lens)
        cost = len(idx) * int(np.maximum(src_lens + 1, caps + 1).max())
        assert cost <= opts.max_tokens or len(idx) == 1
    assert max(b * s for b, s in encoded) <= opts.max_tokens
    assert max(s for _, s in encoded) <= 128  # the long line is cut to the model's positions
    assert max(len(h.tokens) for h in hyps) <= 127
