"""The recorded translations in docs/results/ back the figures of docs/results.md: each score
report rescored from its own hypotheses and references gives the score it states, every folder
is listed in the folder's README, and every test-set report is quoted in results.md's table of
the preset with its interval, its validation score and its updates, as the archive has them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu

from nmt.data.corpus import read_lines
from nmt.evaluate.compare import scored_sets, target_language
from nmt.evaluate.metrics import moses_tokenize, paper_bleu

ROOT = Path(__file__).parents[1]
ARCHIVE = ROOT / "docs/results"
RUNS = sorted(p for p in ARCHIVE.iterdir() if p.is_dir())
REPORTS = sorted(ARCHIVE.glob("*/eval*/scores.*.json"))
TEST_REPORTS = [r for r in REPORTS if r.parent.name == "eval"]


def _id(path: Path) -> str:
    return str(path.relative_to(ARCHIVE))


def _interval(entry: dict) -> str:
    ci = entry["ci"]
    return f"{entry['score']:.2f} [{ci['low']:.2f}, {ci['high']:.2f}]"


def test_the_archive_holds_runs_with_reports() -> None:
    assert len(RUNS) >= 6 and len(TEST_REPORTS) >= 2
    for run in RUNS:
        assert {"config.yaml", "metrics.jsonl", "summary.json"} <= {p.name for p in run.iterdir()}
        assert list(run.glob("eval*/scores.*.json")), run.name


def test_every_folder_is_listed_in_the_archive_readme() -> None:
    readme = (ARCHIVE / "README.md").read_text(encoding="utf-8")
    assert [run.name for run in RUNS if f"| `{run.name}` |" not in readme] == []


@pytest.mark.parametrize("report", REPORTS, ids=_id)
def test_a_report_rescored_from_its_files_gives_its_scores(report: Path) -> None:
    stated = json.loads(report.read_text(encoding="utf-8"))["sets"]
    for scored in scored_sets(report):
        _rescored(report, scored, stated)


def _rescored(report: Path, scored, stated: dict) -> None:
    assert scored.hypotheses.parent == report.parent and scored.references.parent == report.parent
    hyps, refs = read_lines(scored.hypotheses), read_lines(scored.references)
    assert len(hyps) == len(refs) == stated[scored.name]["sentences"]
    bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert bleu == pytest.approx(stated[scored.name]["scores"]["BLEU"]["score"], abs=1e-9)
    if report in TEST_REPORTS:  # the papers' metric costs Moses tokenization; test sets only
        lang = target_language(scored.direction, report)
        paper = paper_bleu(moses_tokenize(hyps, lang), moses_tokenize(refs, lang), lang).score
        assert paper == pytest.approx(stated[scored.name]["bleu_paper"]["score"], abs=1e-9)


@pytest.mark.parametrize("report", TEST_REPORTS, ids=_id)
def test_results_md_quotes_each_test_report_as_archived(report: Path) -> None:
    run = report.parents[1]
    sets = json.loads(report.read_text(encoding="utf-8"))["sets"]
    # the table's set; a report that also scored the held-out sets quotes them elsewhere
    (entry,) = [sets["test_2016_flickr"]] if len(sets) > 1 else sets.values()
    valid_report = run / "eval-valid" / report.name
    (valid,) = json.loads(valid_report.read_text(encoding="utf-8"))["sets"].values()
    updates = json.loads((run / "summary.json").read_text(encoding="utf-8"))["step"]
    row = (
        f"| {_interval(entry['bleu_paper'])} | {_interval(entry['scores']['BLEU'])} "
        f"| {valid['bleu_paper']['score']:.2f} / {valid['scores']['BLEU']['score']:.2f} "
        f"| {updates:,} |"
    )
    results = (ROOT / "docs/results.md").read_text(encoding="utf-8")
    assert row in results, f"docs/results.md has no row with {row}"
