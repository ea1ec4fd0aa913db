"""The run's event log (metrics.jsonl) and the summary derived from it."""

from __future__ import annotations

import json

import pytest

from nmt.train.runlog import METRICS_FILE, RunLog, of_kind, read_events, summarize, write_summary


def _run(tmp_path):
    log = RunLog(tmp_path)
    log.write("start", 0, device="cpu", device_type="cpu", precision="32", world_size=1,
              threads=2, torch="x", overrides=["a=1"])  # fmt: skip
    log.write("train", 50, epoch=0, train_time=5.0, loss=4.0, lr=1e-3, tokens=1000)
    log.write("validation", 100, loss=3.0, ppl=20.0, bleu=10.0, chrf=30.0, best=True)
    log.write("checkpoint", 100, path="checkpoints/step_100.pt", best=True)
    log.write("train", 150, epoch=1, train_time=15.0, loss=3.5, lr=1e-3, tokens=1000)
    log.write("validation", 200, loss=2.0, ppl=8.0, bleu=12.0, chrf=33.0, best=True)
    log.write("validation", 300, loss=2.0, ppl=8.0, bleu=12.0, chrf=33.0, best=False)
    return log


def test_events_round_trip_and_summary(tmp_path):
    log = _run(tmp_path)
    log.write("averaged", 300, checkpoints=["step_200", "step_300"], bleu=12.5, loss=1.9)
    log.write("end", 300, epoch=2, train_time=30.0, stop_reason="reached trainer.max_steps=300")
    events = read_events(tmp_path)
    assert [e["event"] for e in events][:3] == ["start", "train", "validation"]
    assert all(isinstance(e["time"], float) for e in events)
    summary = write_summary(tmp_path)
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    # the first of equal best scores, as early stopping counts it
    assert (summary["best_bleu"], summary["best_step"]) == (12.0, 200)
    assert (summary["step"], summary["epoch"], summary["train_time"]) == (300, 2, 30.0)
    assert summary["stop_reason"] == "reached trainer.max_steps=300"
    assert summary["averaged_bleu"] == 12.5
    assert summary["overrides"] == ["a=1"]
    assert summary["hardware"]["precision"] == "32"


def test_resume_drops_the_redone_updates(tmp_path):
    log = _run(tmp_path)  # killed after step 300; the last checkpoint was at 100
    log.write("start", 100, device="cpu", precision="32", resumed_from="checkpoints/last.pt")
    log.write("validation", 200, loss=2.5, ppl=9.0, bleu=11.0, chrf=31.0, best=True)
    events = read_events(tmp_path)
    steps = [(e["event"], e["step"]) for e in events]
    assert ("validation", 300) not in steps and ("train", 150) not in steps
    assert [e["bleu"] for e in of_kind(events, "validation")] == [10.0, 11.0]
    summary = summarize(events)
    assert (summary["best_bleu"], summary["best_step"]) == (11.0, 200)
    assert summary["stop_reason"] == "unfinished"


def test_unfinished_last_line_is_skipped_but_a_bad_line_is_an_error(tmp_path):
    _run(tmp_path)
    path = tmp_path / METRICS_FILE
    path.write_text(path.read_text() + '{"event": "tra')
    assert len(read_events(tmp_path)) == 7
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "[1, 2]", *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=rf"{METRICS_FILE}:2: not a metrics event"):
        read_events(tmp_path)


def test_non_finite_values_are_written_as_null_and_unknown_events_refused(tmp_path):
    log = RunLog(tmp_path)
    log.write("validation", 10, loss=float("nan"), bleu=0.0)
    assert read_events(tmp_path)[0]["loss"] is None
    with pytest.raises(ValueError, match="unknown event"):
        log.write("epoch", 10)
    RunLog(None).write("train", 1, loss=1.0)  # another DDP rank: writes nothing
    assert len(read_events(tmp_path)) == 1
    assert read_events(tmp_path / "missing") == []
