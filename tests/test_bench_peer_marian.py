"""Marian as a peer of ``make bench-peers`` (benchmarks.peer_marian): its training options and
the reading of its logs, with recorded logs of real 30-update runs; no Marian install needed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import peer_marian
from benchmarks.peers_common import TrainJob, Workspace, window_stats

LOGS = Path(__file__).resolve().parent / "data" / "peers"


def _totals(text: str) -> list[int]:
    """The cumulative label counts ("after T") of a log's update lines."""
    return [int(t.replace(",", "")) for t in re.findall(r"after ([\d,]+) : Time", text)]


def _steps(totals: list[int]) -> list[int]:
    """The labels between consecutive cumulative counts, from 0."""
    return [b - a for a, b in zip([0, *totals[:-1]], totals, strict=True)]


def test_transformer_log_of_five_update_windows() -> None:
    text = (LOGS / "marian-transformer-fp32.log").read_text()
    windows = peer_marian.parse_train_log(text)
    assert [(w.step, w.steps) for w in windows] == [(s, 5) for s in range(5, 31, 5)]
    # a window's labels are the "* L" count of its 5 updates, not the "@ B" of its last batch
    totals = _totals(text)
    assert [w.tgt_tokens for w in windows] == _steps(totals)
    # hand-read: "Up. 10 : ... * 17,240 @ 3,325 after 34,668 : Time 25.09s : 687.15 words/s"
    second = windows[1]
    assert (second.tgt_tokens, second.seconds) == (17240, 25.09)
    assert second.tokens_per_s == pytest.approx(17240 / 25.09)
    assert second.tokens_per_s == pytest.approx(687.15, rel=1e-3)
    stats = window_stats(windows, skip_steps=5)
    assert stats["timed_windows"] == 5 and stats["first_timed_step"] == 6


def test_gru_log_of_one_update_windows() -> None:
    text = (LOGS / "marian-gru-fp32.log").read_text()
    windows = peer_marian.parse_train_log(text)
    assert [w.step for w in windows] == list(range(1, 31))
    assert all(w.steps == 1 and w.seconds > 0 for w in windows)
    totals = _totals(text)
    assert [w.tgt_tokens for w in windows] == _steps(totals)
    # hand-read: "Up. 10 : ... * 3,325 @ 3,325 after 34,668 : Time 12.15s : 273.69 words/s"
    tenth = windows[9]
    assert (tenth.tgt_tokens, tenth.seconds) == (3325, 12.15)
    assert tenth.tokens_per_s == pytest.approx(273.66, abs=0.01)
    stats = window_stats(windows, skip_steps=5)
    assert stats["timed_windows"] == 25 and stats["first_timed_step"] == 6
    assert stats["tgt_tokens_per_step_mean"] == pytest.approx((totals[29] - totals[4]) / 25)


def test_lines_with_the_learning_rate_and_other_lines() -> None:
    text = "\n".join(
        [
            "[2026-12-06 19:06:31] [config] disp-freq: 2u",
            "[2026-12-06 19:06:38] Ep. 1 : Up. 2 : Sen. 236 : Cost 9.42283916 * 6,000 @ 3,100 "
            "after 6,000 : Time 8.00s : 750.00 words/s : gNorm 3.4542 : L.r. 2.5000e-06",
            "[2026-12-06 19:06:40] Ep. 1 : Up. 2 : cross-entropy : 412.5 : new best",
            "[2026-12-06 19:06:48] Ep. 1 : Up. 4 : Sen. 500 : Cost 9.1 * 7,000 @ 3,600 "
            "after 13,000 : Time 5.00s : 1400.00 words/s : gNorm 3.1",
        ]
    )
    windows = peer_marian.parse_train_log(text)
    assert [(w.step, w.steps, w.seconds, w.tgt_tokens) for w in windows] == [
        (2, 2, 8.0, 6000),
        (4, 2, 5.0, 7000),
    ]
    assert windows[1].tokens_per_s == pytest.approx(1400)


def test_a_log_without_update_lines_raises() -> None:
    text = "[2026-12-06 19:06:31] [marian] Marian v1.12.42\n[2026-12-06] Error: Aborted\n"
    with pytest.raises(ValueError, match="no Marian update line"):
        peer_marian.parse_train_log(text)
    with pytest.raises(ValueError, match="no Marian update line"):
        peer_marian.parse_train_log("")


def _workspace(tmp_path: Path) -> Workspace:
    (tmp_path / "ws" / "spm").mkdir(parents=True)
    (tmp_path / "ws" / "spm" / "spm_joint8k.model").write_bytes(b"spm model")
    return Workspace(tmp_path / "ws")


def _written(tmp_path: Path, model: str) -> tuple[dict, object]:
    job = TrainJob(model, "32", 30, 3500, 2, tmp_path / "work", log_every=5, seed=7)
    cmd = peer_marian.train_command(Path("/venv/bin/python"), job, _workspace(tmp_path))
    return json.loads((tmp_path / "work" / "marian.yml").read_text()), cmd


def test_train_command_writes_the_transformer_options(tmp_path: Path) -> None:
    opts, cmd = _written(tmp_path, "transformer")
    work = tmp_path / "work"
    assert cmd.argv == ["/venv/bin/python", "-m", "pymarian", "--config", str(work / "marian.yml")]
    assert cmd.cwd == work and cmd.windows_file == cmd.log == work / "train.log"
    assert cmd.env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert (work / "vocab.spm").read_bytes() == b"spm model"
    assert opts["vocabs"] == [str(work / "vocab.spm")] * 2
    assert opts["train-sets"] == [
        str(tmp_path / "ws" / "data" / f"train.{x}") for x in ("de", "en")
    ]
    shape = {k: opts[k] for k in ("type", "enc-depth", "dec-depth", "dim-emb")}
    assert shape == {"type": "transformer", "enc-depth": 3, "dec-depth": 3, "dim-emb": 256}
    assert (opts["transformer-heads"], opts["transformer-dim-ffn"]) == (4, 1024)
    assert (opts["transformer-preprocess"], opts["transformer-postprocess"]) == ("n", "da")
    assert opts["tied-embeddings-all"] and opts["label-smoothing"] == 0.1
    assert opts["mini-batch-words"] == round(3500 * peer_marian.SRC_PER_TGT) == 3622
    assert opts["mini-batch-fit"] is False
    assert (opts["cpu-threads"], opts["sync-sgd"]) == (2, True)
    assert (opts["after-batches"], opts["disp-freq"], opts["seed"]) == (30, "5u", 7)
    assert (opts["save-freq"], opts["valid-freq"], opts["no-reload"]) == ("0", "0", True)
    assert "valid-sets" not in opts
    assert opts["precision"] == ["float32", "float32"]


def test_train_command_writes_the_gru_options(tmp_path: Path) -> None:
    opts, _ = _written(tmp_path, "gru")
    assert opts["type"] == "s2s" and opts["enc-type"] == "bidirectional"
    assert (opts["enc-cell"], opts["dec-cell"], opts["enc-depth"]) == ("gru", "gru", 1)
    assert (opts["dim-emb"], opts["dim-rnn"]) == (256, 512)
    assert "tied-embeddings-all" not in opts
    assert (opts["mini-batch-words"], opts["cpu-threads"], opts["after-batches"]) == (3622, 2, 30)


def test_precisions_and_unknown_jobs(tmp_path: Path) -> None:
    assert peer_marian.PRECISIONS == {"transformer": ("32",), "gru": ("32",)}
    assert set(peer_marian.DIFFERENCES) == {"transformer", "gru"}
    assert peer_marian.REQUIREMENTS == (("pymarian==1.12.42",),)
    ws = _workspace(tmp_path)
    bf16 = TrainJob("transformer", "bf16", 30, 3500, 2, tmp_path / "a")
    with pytest.raises(ValueError, match="float32 only"):
        peer_marian.train_command(Path("python"), bf16, ws)
    lstm = TrainJob("lstm", "32", 30, 3500, 2, tmp_path / "b")
    with pytest.raises(ValueError, match="no model 'lstm'"):
        peer_marian.train_command(Path("python"), lstm, ws)
