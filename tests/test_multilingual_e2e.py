"""A multilingual run through the real commands: nmt-train on four directions of real Multi30k
pairs, then nmt-eval of every trained direction and a zero-shot one with its pivot baseline;
both tag placements. And the refusal of a target language the model was not trained for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from .helpers import MULTI_DIRECTIONS, REPO

DIRECTIONS = MULTI_DIRECTIONS


def command(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def trained(multilingual_runs):
    return multilingual_runs


@pytest.mark.slow(seconds=45)
@pytest.mark.parametrize("placement", ["source", "target"])
def test_train_and_eval_every_direction(threeway, trained, placement):
    run_dir = trained(placement)
    config = (run_dir / "config.yaml").read_text()
    assert f"tag_placement: {placement}" in config and "- en-fr" in config
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    start = next(e for e in events if e["event"] == "start")
    assert start["tag_placement"] == placement
    assert sorted(start["directions"]) == sorted(DIRECTIONS)
    assert sum(d["share"] for d in start["directions"].values()) == pytest.approx(1.0)
    validations = [e for e in events if e["event"] == "validation"]
    assert [v["step"] for v in validations] == [6, 12]
    for v in validations:
        per = v["directions"]
        assert sorted(per) == sorted(DIRECTIONS)
        assert v["bleu"] == pytest.approx(sum(p["bleu"] for p in per.values()) / 4)
        assert all("nrefs:1" in p["chrf_signature"] for p in per.values())
    tb = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0, "scalars": 0})
    tb.Reload()
    scalars, images = tb.Tags()["scalars"], tb.Tags()["images"]
    for d in DIRECTIONS:
        assert f"val_bleu/{d}" in scalars and f"val_chrf/{d}" in scalars
        assert any(f"/{d}/sent0" in tag for tag in images), images
    page = (run_dir / "attention" / "validation.html").read_text()
    assert all(f"[{d}]" in page for d in DIRECTIONS)
    assert "de/en/fr" in page  # the languages, not data.src_lang / tgt_lang

    done = command("nmt.evaluate", f"run={run_dir}", "zero_shot=[de-fr]", "bootstrap=100",
                   "progress=false")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    scores = json.loads(next((run_dir / "eval").glob("scores.*.json")).read_text())
    name = threeway.name
    assert sorted(scores["directions"]) == sorted(f"{name}.{d}" for d in [*DIRECTIONS, "de-fr"])
    for key, entry in scores["directions"].items():
        assert entry["zero_shot"] == key.endswith("de-fr")
        assert entry["scores"]["BLEU"]["ci"]["resamples"] == 100
        assert 0.0 <= entry["off_target"] <= 1.0
        assert entry["sentences"] == 60
    pivot = scores["directions"][f"{name}.de-fr"]["pivot"]
    assert pivot["via"] == "en" and "chrF2" in pivot["scores"]
    assert "zero-shot" in done.stdout and "pivot through en" in done.stdout


@pytest.mark.slow(seconds=10)
def test_untrained_target_language_is_refused(trained):
    run_dir = trained("source")
    done = command("nmt.evaluate", f"run={run_dir}", "zero_shot=[de-cs]", "progress=false")
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1
    assert "target language 'cs' was not trained" in errors[0]
    assert "translates into de, en, fr" in errors[0]
    source = run_dir.parent / "one.txt"
    source.write_text("Ein Hund läuft.\n", encoding="utf-8")
    done = command("nmt.decode.translate", f"run={run_dir}", f"input={source}", "progress=false")
    assert done.returncode == 2
    assert "translates into de, en, fr: name the target language with tgt_lang" in done.stderr
