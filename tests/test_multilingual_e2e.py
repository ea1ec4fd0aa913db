"""A multilingual run through the commands: nmt-train on four directions of real Multi30k pairs,
then nmt-eval of every trained direction and a zero-shot one with its pivot baseline, whose
outputs nmt-translate's decoding equals; both tag placements (the commands' functions, in
this process). And, through the real command lines, the refusal of a target language the
model was not trained for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from nmt.data.corpus import read_lines
from nmt.decode.languages import choose_target
from nmt.decode.options import DecodeOptions
from nmt.decode.translate import translate_lines
from nmt.evaluate.scoring import evaluate
from nmt.store.loading import load_trained
from nmt.store.paths import checkpoint_path

from .helpers import MULTI_DIRECTIONS, REPO, compose_config

DIRECTIONS = MULTI_DIRECTIONS


def command(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def trained(multilingual_runs):
    return multilingual_runs


@pytest.mark.slow(seconds=25)
@pytest.mark.parametrize("placement", ["source", "target"])
def test_train_and_eval_every_direction(threeway_test, trained, placement, capsys):
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

    capsys.readouterr()
    evaluate(compose_config("eval", [f"run={run_dir}", "zero_shot=[de-fr]", "bootstrap=100",
                                     "progress=false"]))  # fmt: skip
    printed = capsys.readouterr().out
    scores = json.loads(next((run_dir / "eval").glob("scores.*.json")).read_text())
    name = threeway_test.name
    assert sorted(scores["directions"]) == sorted(f"{name}.{d}" for d in [*DIRECTIONS, "de-fr"])
    for key, entry in scores["directions"].items():
        assert entry["zero_shot"] == key.endswith("de-fr")
        assert entry["scores"]["BLEU"]["ci"]["resamples"] == 100
        assert 0.0 <= entry["off_target"] <= 1.0
        assert entry["sentences"] == 20
    pivot = scores["directions"][f"{name}.de-fr"]["pivot"]
    assert pivot["via"] == "en" and "chrF2" in pivot["scores"]
    assert "zero-shot" in printed and "pivot through en" in printed

    # nmt-translate's decoding of each trained direction equals nmt-eval's (the command line's
    # stdout: tests/test_multilingual_commands.py)
    trained = load_trained(checkpoint_path(run_dir, None), torch.device("cpu"))
    opts = DecodeOptions(beam=1, length_penalty=1.0)
    for direction in DIRECTIONS:
        src_lang, tgt_lang = direction.split("-")
        (hyp_file,) = (run_dir / "eval").glob(f"{name}.{direction}.*.hyp")
        lines = read_lines(Path(f"{threeway_test}.{src_lang}"))
        target = choose_target(trained.cfg, trained.tokenizers, tgt_lang, src_lang)
        got = translate_lines(trained, lines, opts, torch.device("cpu"), target=target)
        assert [r[0][0] for r in got] == read_lines(hyp_file), direction


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
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1
    assert "translates into de, en, fr: name the target language with tgt_lang" in errors[0]


@pytest.mark.slow(seconds=3)
def test_eval_scores_the_runs_zero_shot_directions_unless_told(trained):
    """nmt-eval without zero_shot= takes the run's data.zero_shot; zero_shot=[] none; a run
    written before the field has none."""
    from omegaconf import open_dict

    from nmt.config_checks import Direction
    from nmt.evaluate.multilingual import eval_directions

    run_dir = trained("source")
    model = load_trained(checkpoint_path(run_dir, None), torch.device("cpu"))
    assert "zero_shot" not in model.cfg.data or not model.cfg.data.zero_shot
    assert eval_directions(compose_config("eval", [f"run={run_dir}"]), model)[1] == []
    with open_dict(model.cfg):
        model.cfg.data.zero_shot = ["de-fr"]
    chosen = {
        "": [Direction("de", "fr")],
        "zero_shot=[]": [],
        "zero_shot=[fr-de]": [Direction("fr", "de")],
    }
    for override, zero in chosen.items():
        cfg = compose_config("eval", [f"run={run_dir}", *([override] if override else [])])
        assert eval_directions(cfg, model)[1] == zero, override


@pytest.mark.slow(seconds=6)
def test_a_trained_direction_without_the_pivot_is_also_decoded_through_it(
    threeway_test, trained, tmp_path
):
    """With pivot_trained (the default), a trained direction between two languages other than
    the pivot gets the pivot's baseline and the paired test, as a zero-shot one does: its
    hypotheses are the two decodes through English; directions with English get none."""
    from omegaconf import open_dict

    from nmt.evaluate.multilingual import evaluate_multilingual

    run_dir = trained("source")
    model = load_trained(checkpoint_path(run_dir, None), torch.device("cpu"))
    with open_dict(model.cfg):  # as if de-fr had been trained (its tags are the model's)
        model.cfg.data.directions = [*MULTI_DIRECTIONS, "de-fr"]
    opts = DecodeOptions(beam=1, length_penalty=1.0)
    reports = {}
    for setting in ("true", "false"):
        cfg = compose_config("eval", [f"run={run_dir}", "bootstrap=100", "progress=false",
                                      f"pivot_trained={setting}"])  # fmt: skip
        out = tmp_path / setting
        reports[setting] = evaluate_multilingual(cfg, model, opts, out, "greedy")["directions"]
    test_set = threeway_test.name
    pivoted = {key for key, entry in reports["true"].items() if "pivot" in entry}
    assert pivoted == {f"{test_set}.de-fr"}
    assert not any("pivot" in entry for entry in reports["false"].values())
    entry = reports["true"][f"{test_set}.de-fr"]
    assert not entry["zero_shot"] and entry["pivot"]["via"] == "en"
    assert entry["pivot"]["paired"]["resamples"] == 100

    text = read_lines(Path(f"{threeway_test}.de"))
    for src, tgt in (("de", "en"), ("en", "fr")):  # the two decodes of the pivot
        target = choose_target(model.cfg, model.tokenizers, tgt, src)
        got = translate_lines(model, text, opts, torch.device("cpu"), target=target)
        text = [r[0][0] for r in got]
    assert read_lines(Path(entry["pivot"]["hypotheses"])) == text


@pytest.mark.slow(seconds=6)
def test_eval_scores_named_sets_and_the_validation_split_in_each_direction(
    threeway_test, trained, tmp_path, capsys
):
    """test=[...] of a multilingual run: each prefix in every direction whose two files it has
    (a German-English set leaves out en-fr and fr-en, and says so); split=valid: every direction
    on the whole validation split, into eval-valid/."""
    run_dir = trained("target")
    two = tmp_path / "two"
    for lang in ("de", "en"):
        lines = Path(f"{threeway_test}.{lang}").read_text(encoding="utf-8").splitlines()[:5]
        Path(f"{two}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["beam=1", "bootstrap=0", "progress=false"]
    capsys.readouterr()
    report = evaluate(compose_config("eval", [f"run={run_dir}", f"test=[{two},{threeway_test}]",
                                              f"out={tmp_path / 'out'}", *common]))  # fmt: skip
    name = threeway_test.name
    assert set(report["directions"]) == {"two.de-en", "two.en-de"} | {
        f"{name}.{d}" for d in DIRECTIONS
    }
    assert report["directions"]["two.de-en"]["sentences"] == 5
    assert "two: not scored in en-fr, fr-en" in capsys.readouterr().out
    assert read_lines(tmp_path / "out" / "two.de-en.ref") == read_lines(Path(f"{two}.en"))

    valid = evaluate(compose_config("eval", [f"run={run_dir}", "split=valid", *common]))
    model = load_trained(checkpoint_path(run_dir, None), torch.device("cpu"))
    valid_name = Path(model.cfg.data.valid).name
    assert set(valid["directions"]) == {f"{valid_name}.{d}" for d in DIRECTIONS}
    assert all(entry["sentences"] == 60 for entry in valid["directions"].values())
    assert (run_dir / "eval-valid" / f"{valid_name}.fr-en.ref").is_file()

    only = tmp_path / "only"
    Path(f"{only}.cs").write_text("Ahoj.\n", encoding="utf-8")
    done = command("nmt.evaluate", f"run={run_dir}", f"test=[{only}]", "progress=false")
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "has both languages of none of this model's directions" in errors[0]
