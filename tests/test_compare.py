"""nmt-compare: nmt-eval reports compared set by set and direction by direction by the paired
bootstrap test; and the zero-shot direction's paired test against pivoting in a multilingual
evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nmt.evaluate.compare import CompareError, compare, main, markdown, run
from nmt.evaluate.metrics import moses_tokenize, paired_bootstrap, paper_bleu
from nmt.evaluate.scoring import evaluate

from .helpers import compose_config

pytestmark = pytest.mark.usefixtures("one_thread")

REFS = [
    "A man rides a bike down the street.",
    "Two dogs play in the snow.",
    "A woman is reading a book in the park.",
    "Children are playing soccer on a field.",
    "A black dog runs through the grass.",
    "People are walking along the beach at sunset.",
]
BASE = [
    "A man rides a bicycle down the street.",
    "Two dogs play in snow.",
    "A woman reads a book in the park.",
    "Kids are playing football on a field.",
    "A dog runs through grass.",
    "People walk along the beach.",
]
BETTER = [*REFS[:4], "A black dog runs through grass.", "People walk along the beach at sunset."]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def bilingual(tmp: Path, name: str, direction: str, hyps: list[str], refs=REFS) -> Path:
    """A report as nmt-eval writes it for a bilingual run (the fields nmt-compare reads)."""
    entry = {"hypotheses": str(write_lines(tmp / f"{name}.hyp", hyps)),
             "references": str(write_lines(tmp / f"{name}.ref", refs))}  # fmt: skip
    report = tmp / f"{name}.json"
    report.write_text(json.dumps({"direction": direction, "sets": {"test_2016_flickr": entry}}))
    return report


def multilingual(tmp: Path, hyps: dict[str, list[str]]) -> Path:
    """A report as nmt-eval writes it for a multilingual run."""
    directions = {}
    for d, lines in hyps.items():
        directions[f"test_2016_flickr.{d}"] = {
            "set": "test_2016_flickr", "direction": d, "zero_shot": False,
            "hypotheses": str(write_lines(tmp / f"multi.{d}.hyp", lines)),
            "references": str(write_lines(tmp / f"multi.{d}.ref", REFS)),
        }  # fmt: skip
    report = tmp / "multi.json"
    report.write_text(json.dumps({"directions": directions}))
    return report


def test_each_baseline_set_is_tested_against_the_systems_same_direction(tmp_path) -> None:
    system = multilingual(tmp_path, {"de-en": BETTER, "fr-en": BASE})
    base = bilingual(tmp_path, "de-en", "de-en", BASE)
    same = bilingual(tmp_path, "fr-en", "fr-en", BASE)
    result = compare([base, same], system, resamples=200, seed=7)
    first, second = result["rows"]
    assert (first["set"], first["direction"]) == ("test_2016_flickr", "de-en")
    assert first["sentences"] == 6
    want_base, (want,) = paired_bootstrap(BASE, [BETTER], REFS, 200, 7)
    assert first["baseline"]["bleu"] == pytest.approx(want_base.score)
    assert first["system"]["bleu"] == pytest.approx(want.score)
    assert first["p_value"] == pytest.approx(want.p_value)
    assert first["difference"] == pytest.approx(want.score - want_base.score)
    assert first["difference"] > 0
    assert first["system"]["ci"]["resamples"] == 200
    assert second["difference"] == 0 and second["p_value"] == 1.0 and not second["significant"]
    table = markdown(result)
    assert "| test_2016_flickr | fr-en |" in table and f"{first['difference']:+.2f}" in table


def test_the_papers_metric_is_tested_on_lowercased_moses_tokens(tmp_path, capsys) -> None:
    """``--metric paper``: the same paired test on lowercased, Moses-tokenized text in the
    direction's target language, so outputs that differ from the baseline only in case and
    spacing are equal there, though sacreBLEU's cased BLEU tells them apart."""
    recased = [line.upper().replace(".", " .") for line in BASE]
    base = bilingual(tmp_path, "base", "de-en", BASE)
    system = bilingual(tmp_path, "recased", "de-en", recased)
    cased = compare([base], system, resamples=100, seed=7)["rows"][0]
    assert cased["difference"] < -10 and cased["significant"]
    main([str(base), "--system", str(system), "--resamples", "100", "--metric", "paper"])
    assert "| baseline BLEU (lowercased, Moses-tokenized) [95% CI] |" in capsys.readouterr().out
    result = compare([base], system, resamples=100, seed=7, metric="paper")
    assert result["metric"] == "BLEU (lowercased, Moses-tokenized)"
    (row,) = result["rows"]
    assert row["difference"] == 0 and row["p_value"] == 1.0 and not row["significant"]
    better = bilingual(tmp_path, "better", "de-en", BETTER)
    (row,) = compare([base], better, resamples=100, seed=7, metric="paper")["rows"]
    refs = moses_tokenize(REFS, "en")
    want = paper_bleu(moses_tokenize(BETTER, "en"), refs, "en").score
    assert row["system"]["bleu"] == pytest.approx(want)
    base_score = paper_bleu(moses_tokenize(BASE, "en"), refs, "en").score
    assert row["baseline"]["bleu"] == pytest.approx(base_score)
    _, (paired,) = paired_bootstrap(BASE, [BETTER], REFS, 100, 7, paper_lang="en")
    assert row["p_value"] == pytest.approx(paired.p_value)
    odd = bilingual(tmp_path, "odd", "deen", BASE)
    with pytest.raises(CompareError, match="direction 'deen' is not 'source-target'"):
        compare([odd], bilingual(tmp_path, "odd2", "deen", BETTER), resamples=100, metric="paper")
    with pytest.raises(CompareError, match="--metric chrf: one of bleu, paper"):
        compare([base], system, resamples=100, metric="chrf")


def test_the_command_writes_json_and_refuses_bad_input_in_one_line(tmp_path, capsys) -> None:
    system = multilingual(tmp_path, {"de-en": BETTER})
    base = bilingual(tmp_path, "de-en", "de-en", BASE)
    out = tmp_path / "out" / "compare.json"
    main([str(base), "--system", str(system), "--resamples", "100", "--json", str(out)])
    assert json.loads(out.read_text())["rows"][0]["direction"] == "de-en"
    assert "| test_2016_flickr | de-en |" in capsys.readouterr().out

    def refused(*args: str) -> str:
        with pytest.raises(CompareError) as err:
            run([*args, "--system", str(system), "--resamples", "100"])
        assert "\n" not in str(err.value)
        return str(err.value)

    other = bilingual(tmp_path, "en-de", "en-de", BASE)
    with pytest.raises(SystemExit) as stop:  # through exit_on_error: one logged line, status 2
        main([str(other), "--system", str(system), "--resamples", "100"])
    assert stop.value.code == 2
    assert "no test_2016_flickr in en-de" in refused(str(other))
    assert "it has: test_2016_flickr de-en" in refused(str(other))
    moved = bilingual(tmp_path, "moved", "de-en", BASE, refs=[*REFS[:5], "Someone else."])
    assert "references of" in refused(str(moved)) and "differ" in refused(str(moved))
    short = bilingual(tmp_path, "short", "de-en", BASE[:5])
    assert "5 hypotheses for 6 references" in refused(str(short))
    assert "cannot read the report" in refused(str(tmp_path / "absent.json"))
    (tmp_path / "bad.json").write_text("{")
    assert "bad.json: not an nmt-eval report" in refused(str(tmp_path / "bad.json"))
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"sets": {}}))
    assert "old.json: no 'direction'" in refused(str(old))
    for field, value, kind in [("sets", [], "array"), ("sets", "x", "string"),
                               ("directions", ["a"], "array"), ("directions", 3, "number"),
                               ("directions", None, "null")]:  # fmt: skip
        flat = tmp_path / f"flat-{field}-{kind}.json"
        flat.write_text(json.dumps({"direction": "de-en", field: value}))
        assert f"{flat.name}: '{field}' is a JSON {kind}, not an object" in refused(str(flat))
    Path(json.loads(base.read_text())["sets"]["test_2016_flickr"]["hypotheses"]).unlink()
    assert "de-en.hyp is missing" in refused(str(base))
    with pytest.raises(CompareError, match="resamples 0"):
        compare([base], system, resamples=0)


def test_a_moved_evaluation_folder_still_compares(tmp_path) -> None:
    """Reports name their files by the paths nmt-eval wrote; a folder moved or copied whole (an
    archive of a run's outputs) is read from where it is now, and a report copied alone still
    finds its files where they were written."""
    made, system = tmp_path / "made", tmp_path / "system"
    made.mkdir()
    system.mkdir()
    base = bilingual(made, "base", "de-en", BASE)
    other = bilingual(system, "better", "de-en", BETTER)
    want = compare([base], other, resamples=100, seed=7)["rows"][0]
    lone = tmp_path / "lone.json"  # the report alone: its files are where it says
    lone.write_bytes(base.read_bytes())
    assert compare([lone], other, resamples=100, seed=7)["rows"][0]["p_value"] == want["p_value"]
    moved = made.rename(tmp_path / "archive")
    row = compare([moved / "base.json"], other, resamples=100, seed=7)["rows"][0]
    assert (row["difference"], row["p_value"]) == (want["difference"], want["p_value"])
    row = compare([other], moved / "base.json", resamples=100, seed=7)["rows"][0]
    assert row["difference"] == pytest.approx(-want["difference"])
    with pytest.raises(CompareError, match="lone.json: its file .*made.base.ref is missing"):
        compare([lone], other, resamples=100)
    odd = tmp_path / "odd.json"
    odd.write_text(
        json.dumps({"direction": "de-en", "sets": {"t": {"hypotheses": 3, "references": "r"}}})
    )
    with pytest.raises(CompareError, match=r"odd.json: sets.t: 'hypotheses' is not a file path"):
        compare([odd], other, resamples=100)


def test_reports_of_nmt_eval_compare(trained_runs, corpus, tmp_path) -> None:
    """Two real evaluations of one run (greedy, beam 3) written by nmt-eval compare by their
    own hypothesis and reference files."""
    run = trained_runs["transformer"]
    reports = []
    for beam in (1, 3):
        out = tmp_path / f"beam{beam}"
        cfg = compose_config("eval", [f"run={run}", f"test=[{corpus}.de:{corpus}.en]",
                                      f"beam={beam}", f"out={out}", "progress=false"])  # fmt: skip
        report = evaluate(cfg)
        assert report["direction"] == "de-en"
        entry = next(iter(report["sets"].values()))
        refs = Path(entry["references"]).read_text(encoding="utf-8").splitlines()
        assert refs == [line.strip() for line in Path(f"{corpus}.en").read_text().splitlines()]
        reports.append(next(out.glob("scores.*.json")))
    result = compare([reports[0]], reports[1], resamples=100)
    (row,) = result["rows"]
    hyps = [Path(json.loads(r.read_text())["sets"][row["set"]]["hypotheses"]) for r in reports]
    lines = [h.read_text(encoding="utf-8").splitlines() for h in hyps]
    _, (want,) = paired_bootstrap(lines[0], [lines[1]], refs, 100)
    assert row["p_value"] == pytest.approx(want.p_value) and row["direction"] == "de-en"


def test_a_zero_shot_direction_is_tested_against_its_pivot(multilingual_runs, tmp_path) -> None:
    run = multilingual_runs("source")
    cfg = compose_config("eval", [f"run={run}", "zero_shot=[de-fr]", "bootstrap=100",
                                  f"out={tmp_path}", "progress=false"])  # fmt: skip
    report = evaluate(cfg)
    entry = next(e for e in report["directions"].values() if e["direction"] == "de-fr")
    direct = Path(entry["hypotheses"]).read_text(encoding="utf-8").splitlines()
    pivot = Path(entry["pivot"]["hypotheses"]).read_text(encoding="utf-8").splitlines()
    refs = Path(entry["references"]).read_text(encoding="utf-8").splitlines()
    base, (want,) = paired_bootstrap(pivot, [direct], refs, 100)
    paired = entry["pivot"]["paired"]
    assert paired["p_value"] == pytest.approx(want.p_value)
    assert paired["direct_minus_pivot"] == pytest.approx(want.score - base.score)
    trained = [e for e in report["directions"].values() if not e["zero_shot"]]
    assert trained and all("paired" not in e and e["set"] for e in trained)


def with_pivot(tmp: Path, name: str, direct: dict[str, list[str]], pivot: dict[str, list[str]]):
    """A multilingual report whose directions in ``pivot`` were also translated through
    English, as nmt-eval writes a zero-shot direction's entry."""
    directions = {}
    for d, lines in direct.items():
        entry = {
            "set": "test_2016_flickr", "direction": d, "zero_shot": d in pivot,
            "hypotheses": str(write_lines(tmp / f"{name}.{d}.hyp", lines)),
            "references": str(write_lines(tmp / f"{name}.{d}.ref", REFS)),
        }  # fmt: skip
        if d in pivot:
            hyp = write_lines(tmp / f"{name}.{d}.pivot-en.hyp", pivot[d])
            entry["pivot"] = {"via": "en", "hypotheses": str(hyp)}
        directions[f"test_2016_flickr.{d}"] = entry
    report = tmp / f"{name}.json"
    report.write_text(json.dumps({"directions": directions}))
    return report


def test_pivot_compares_with_the_baselines_translations_through_english(tmp_path, capsys):
    """``--pivot``: the baselines' translations through their pivot language, in the
    directions that have one; the system's own report as its baseline tests its direct
    translation against its own pivoting."""
    centred = with_pivot(tmp_path, "centred", {"de-en": BASE, "de-fr": REFS[::-1]},
                         {"de-fr": BASE})  # fmt: skip
    every = with_pivot(tmp_path, "all", {"de-en": BASE, "de-fr": BETTER}, {"de-fr": REFS[:1] * 6})
    result = compare([centred], every, resamples=200, seed=7, pivot=True)
    (row,) = result["rows"]  # de-en has no translation through English
    base, (want,) = paired_bootstrap(BASE, [BETTER], REFS, 200, 7)
    assert row["direction"] == "de-fr" and row["baseline"]["via"] == "en"
    assert row["baseline"]["bleu"] == pytest.approx(base.score)
    assert row["p_value"] == pytest.approx(want.p_value) and row["difference"] > 0
    assert result["baseline"] == "through the pivot language"
    assert "| baseline through en BLEU [95% CI] |" in markdown(result)

    own = compare([every], every, resamples=200, seed=7, pivot=True)["rows"][0]
    base, (want,) = paired_bootstrap(REFS[:1] * 6, [BETTER], REFS, 200, 7)
    assert own["difference"] == pytest.approx(want.score - base.score)
    direct = compare([centred], every, resamples=200, seed=7)["rows"]
    assert [r["direction"] for r in direct] == ["de-en", "de-fr"]
    assert "via" not in direct[1]["baseline"]

    assert run([str(centred), "--pivot", "--system", str(every), "--resamples", "200"])
    assert "baseline through en" in capsys.readouterr().out
    bilingual_report = bilingual(tmp_path, "de-fr", "de-fr", BASE)
    with pytest.raises(CompareError, match="--pivot needs a multilingual report"):
        compare([bilingual_report], every, resamples=200, pivot=True)
    plain = multilingual(tmp_path, {"de-fr": BASE})
    with pytest.raises(CompareError, match="no direction was translated through a pivot"):
        compare([plain], every, resamples=200, pivot=True)
