"""The recorded translations in docs/results/ back the figures of docs/results.md: each score
report rescored from its own hypotheses and references gives the score it states, every folder
is listed in the folder's README, and every test-set report is quoted in results.md's table of
the preset with its interval, its validation score and its updates, as the archive has them.
A multilingual run's reports hold its directions; each trained direction is quoted so, and each
direction also decoded through English is quoted with both scores and their paired test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu
from omegaconf import OmegaConf

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


def _entries(report: Path) -> dict:
    """A report's entries by name: a bilingual report's sets, a multilingual one's
    ``<set>.<direction>``."""
    stated = json.loads(report.read_text(encoding="utf-8"))
    return stated["directions"] if "directions" in stated else stated["sets"]


@pytest.mark.parametrize("report", REPORTS, ids=_id)
def test_a_report_rescored_from_its_files_gives_its_scores(report: Path) -> None:
    stated = _entries(report)
    for scored in scored_sets(report):
        entry = stated.get(f"{scored.name}.{scored.direction}") or stated[scored.name]
        _rescored(report, scored.hypotheses, scored.references, scored.direction, entry)
        if "pivot" in entry:  # the same sentences through English, against the same references
            pivot = report.parent / Path(entry["pivot"]["hypotheses"]).name
            _rescored(report, pivot, scored.references, scored.direction, entry["pivot"])


def _rescored(report: Path, hypotheses: Path, references: Path, direction: str, entry) -> None:
    assert hypotheses.parent == report.parent and references.parent == report.parent
    hyps, refs = read_lines(hypotheses), read_lines(references)
    assert len(hyps) == len(refs) == entry.get("sentences", len(refs))
    bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert bleu == pytest.approx(entry["scores"]["BLEU"]["score"], abs=1e-9)
    if report in TEST_REPORTS:  # the papers' metric costs Moses tokenization; test sets only
        lang = target_language(direction, report)
        paper = paper_bleu(moses_tokenize(hyps, lang), moses_tokenize(refs, lang), lang).score
        assert paper == pytest.approx(entry["bleu_paper"]["score"], abs=1e-9)


BILINGUAL_TESTS = [r for r in TEST_REPORTS if "sets" in json.loads(r.read_text(encoding="utf-8"))]
MULTILINGUAL_TESTS = [r for r in TEST_REPORTS if r not in BILINGUAL_TESTS]


@pytest.mark.parametrize("report", BILINGUAL_TESTS, ids=_id)
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


def _arrow(direction: str) -> str:
    return direction.replace("-", "→")


@pytest.mark.parametrize("report", MULTILINGUAL_TESTS, ids=_id)
def test_results_md_quotes_each_multilingual_direction_as_archived(report: Path) -> None:
    """Each trained direction on test_2016_flickr as a bilingual run's row is quoted, after the
    direction and the tag's place; each direction also decoded through English there
    (zero-shot, or trained between two other languages) with the direct and the pivot's
    scores, their off-target rates and the paired test between them."""
    run = report.parents[1]
    results = (ROOT / "docs/results.md").read_text(encoding="utf-8")
    updates = json.loads((run / "summary.json").read_text(encoding="utf-8"))["step"]
    tag = OmegaConf.load(run / "config.yaml").data.tag_placement
    entries = _entries(report)
    valid = _entries(run / "eval-valid" / report.name)
    assert [e for e in entries.values() if not e["zero_shot"]], report
    for entry in entries.values():
        if entry["set"] == "test_2016_flickr" and not entry["zero_shot"]:
            (val,) = [v for v in valid.values() if v["direction"] == entry["direction"]]
            row = (
                f"| {_arrow(entry['direction'])} | {tag} | {_interval(entry['bleu_paper'])} "
                f"| {_interval(entry['scores']['BLEU'])} "
                f"| {val['bleu_paper']['score']:.2f} / {val['scores']['BLEU']['score']:.2f} "
                f"| {updates:,} |"
            )
            assert row in results, f"docs/results.md has no row with {row}"
        if "pivot" in entry and entry["set"] == "test_2016_flickr":
            pivot, paired = entry["pivot"], entry["pivot"]["paired"]
            row = (
                f"| {_arrow(entry['direction'])} | {tag} "
                f"| {_interval(entry['scores']['BLEU'])} | {100 * entry['off_target']:.1f}% "
                f"| {_interval(pivot['scores']['BLEU'])} | {100 * pivot['off_target']:.1f}% "
                f"| {paired['direct_minus_pivot']:+.2f}, p = {paired['p_value']:.3f} |"
            )
            assert row in results, f"docs/results.md has no row with {row}"
