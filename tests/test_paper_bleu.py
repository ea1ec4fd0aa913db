"""The Multi30k papers' metric (nmt.evaluate.metrics.paper_bleu): lowercased, Moses-normalized,
Moses-tokenized BLEU, reported by nmt-eval beside sacreBLEU's cased BLEU and never instead."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from nmt.evaluate.metrics import (
    PAPER_NAME,
    bleu,
    moses_tokenize,
    paper_bleu,
    paper_entry,
)
from nmt.evaluate.scoring import evaluate

from .helpers import REPO, compose_config

pytestmark = pytest.mark.usefixtures("one_thread")

# raw test_2016_flickr references and their lines in the official data/task1/tok/
# test_2016_flickr.lc.norm.tok.<lang> of the multi30k/dataset repository
OFFICIAL = {
    "en": [
        (
            "A man in a blue coat grabbing a young boy's shoulder.",
            "a man in a blue coat grabbing a young boy &apos;s shoulder .",
        ),
        (
            "Several children are outdoors getting ready to play tug-of-war.",
            "several children are outdoors getting ready to play tug-of-war .",
        ),
    ],
    "de": [
        (
            'Ein Kind mit der Nummer "93" fährt Ski.',
            "ein kind mit der nummer &quot; 93 &quot; fährt ski .",
        ),
        (
            "Leute, die vor einem Gebäude stehen.",
            "leute , die vor einem gebäude stehen .",
        ),
    ],
    "fr": [
        (
            "La personne en maillot rayé fait de l'alpinisme.",
            "la personne en maillot rayé fait de l&apos; alpinisme .",
        ),
        (  # the quote after the final full stop moves before it (French and German rules)
            "Un homme en T-shirt rouge passe devant un établissement alimentaire avec des "
            'briques turquoises et blanches qui s\'appelle "32 De Neude."',
            "un homme en t-shirt rouge passe devant un établissement alimentaire avec des "
            "briques turquoises et blanches qui s&apos; appelle &quot; 32 de neude &quot; .",
        ),
    ],
    "cs": [
        (
            "Žena, která drží misku s jídlem v kuchyni.",
            "žena , která drží misku s jídlem v kuchyni .",
        ),
        (
            'Mladík s černým tričkem s nápisem "Asian Pacific 2007" hraje sedíc na bubny.',
            "mladík s černým tričkem s nápisem &quot; asian pacific 2007 &quot; hraje sedíc na "
            "bubny .",
        ),
    ],
}


@pytest.mark.parametrize("lang", sorted(OFFICIAL))
def test_references_tokenize_as_the_official_files(lang: str) -> None:
    raw, official = zip(*OFFICIAL[lang], strict=True)
    assert moses_tokenize([f"  {line} " for line in raw], lang) == list(official)
    score = paper_bleu(moses_tokenize(raw, lang), official, lang)
    assert score.score == pytest.approx(100.0)


def test_the_papers_bleu_is_lowercased_bleu_on_the_moses_tokens() -> None:
    refs = [raw for raw, _ in OFFICIAL["en"]]
    hyps = ["A man in a blue coat grabs a young BOY'S shoulder.", "Several kids play tug-of-war."]
    tokens = ["a man in a blue coat grabs a young boy &apos;s shoulder .",
              "several kids play tug-of-war ."]  # fmt: skip
    assert moses_tokenize(hyps, "en") == tokens
    want = BLEU(tokenize="none").corpus_score(tokens, [[tok for _, tok in OFFICIAL["en"]]])
    entry = paper_entry(hyps, moses_tokenize(refs, "en"), "en")
    assert entry["score"] == pytest.approx(want.score)
    assert entry["name"] == PAPER_NAME == "BLEU (lowercased, Moses-tokenized)"
    assert "Multi30k papers" in entry["description"] and entry["language"] == "en"
    assert "tok:none" in entry["signature"] and "moses:lc+norm+tok-en" in entry["signature"]
    assert entry["ci"] is None
    # sacreBLEU's 13a splits "boy's" apart and keeps "tug-of-war" whole, as Moses does not
    assert bleu(hyps, refs, lowercase=True).score != pytest.approx(entry["score"])


def check_paper_field(entry: dict, lang: str, resamples: int) -> None:
    """A report entry's ``bleu_paper``: labelled, recomputable from the files, with the
    report's interval; and sacreBLEU's cased BLEU in its own place, unchanged."""
    hyps = Path(entry["hypotheses"]).read_text(encoding="utf-8").splitlines()
    refs = Path(entry["references"]).read_text(encoding="utf-8").splitlines()
    paper = entry["bleu_paper"]
    assert paper["name"] == PAPER_NAME and paper["language"] == lang
    assert "the metric of the Multi30k papers" in paper["description"]
    want = BLEU(lowercase=True, tokenize="none", force=True).corpus_score(
        moses_tokenize(hyps, lang), [moses_tokenize(refs, lang)]
    )
    assert paper["score"] == pytest.approx(want.score)
    if resamples:
        assert paper["ci"]["resamples"] == resamples
        assert paper["ci"]["low"] <= paper["ci"]["mean"] <= paper["ci"]["high"]
    else:
        assert paper["ci"] is None
    assert set(entry["scores"]) == {"BLEU", "chrF2", "TER", "BLEU-lc"}
    assert entry["scores"]["BLEU"]["score"] == pytest.approx(bleu(hyps, refs).score)
    assert "case:mixed|eff:no|tok:13a" in entry["scores"]["BLEU"]["signature"]


def test_bilingual_report_has_the_papers_bleu_beside_sacrebleu(
    trained_runs, corpus, tmp_path, capsys
) -> None:
    run = trained_runs["transformer"]
    overrides = [f"run={run}", f"test=[{corpus}.de:{corpus}.en]", "bootstrap=100"]
    cfg = compose_config("eval", [*overrides, f"out={tmp_path}", "progress=false"])
    report = evaluate(cfg)
    (entry,) = report["sets"].values()
    check_paper_field(entry, "en", 100)
    assert f"  {PAPER_NAME} = {entry['bleu_paper']['score']:.2f}" in capsys.readouterr().out
    saved = json.loads(next(tmp_path.glob("scores.*.json")).read_text())
    assert saved["sets"] == json.loads(json.dumps(report["sets"]))


def test_multilingual_report_has_the_papers_bleu_in_each_direction(
    multilingual_runs, tmp_path, capsys
) -> None:
    run = multilingual_runs("source")
    cfg = compose_config("eval", [f"run={run}", "zero_shot=[de-fr]", "bootstrap=0",
                                  f"out={tmp_path}", "progress=false"])  # fmt: skip
    report = evaluate(cfg)
    out = capsys.readouterr().out
    for entry in report["directions"].values():
        lang = entry["direction"].split("-")[1]
        check_paper_field(entry, lang, 0)
        if entry["zero_shot"]:
            pivot = {**entry["pivot"], "references": entry["references"]}
            check_paper_field(pivot, lang, 0)
    assert out.count(f"  {PAPER_NAME} = ") == len(report["directions"]) + 1  # + the pivot


def test_the_agreement_script_compares_with_the_official_files(tmp_path: Path) -> None:
    """scripts/paper_metric_agreement.py on a dataset checkout of two lines per language (and
    without the Moses scripts: the Perl comparison is left out)."""
    task = tmp_path / "dataset" / "data" / "task1"
    (task / "raw").mkdir(parents=True)
    (task / "tok").mkdir()
    for lang, pairs in OFFICIAL.items():
        raw = "".join(r + "\n" for r, _ in pairs).encode()
        (task / "raw" / f"test_2016_flickr.{lang}.gz").write_bytes(gzip.compress(raw))
        tok = [t for _, t in pairs]
        if lang == "de":  # one line of the official file differs from ours
            tok[1] = tok[1].replace(" , ", ", ")
        (task / "tok" / f"test_2016_flickr.lc.norm.tok.{lang}").write_text(
            "".join(t + "\n" for t in tok), encoding="utf-8"
        )
    hyp = tmp_path / "out.hyp"
    hyp.write_text("".join(r + "\n" for r, _ in OFFICIAL["en"]), encoding="utf-8")
    script = [sys.executable, str(REPO / "scripts" / "paper_metric_agreement.py")]
    args = [str(tmp_path / "dataset"), "--hyp", str(hyp), "--ref", str(hyp), "--lang", "en"]
    proc = subprocess.run([*script, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[2].strip(): line for line in proc.stdout.splitlines()[2:6]}
    assert set(rows) == set(OFFICIAL)
    assert "| 2/2 (100.0%) | 100.00 |" in rows["en"] and "| 1/2 (50.0%) |" in rows["de"]
    assert "papers' metric (nmt-eval bleu_paper):            100.00" in proc.stdout
    assert "same hypotheses, official references:            100.00" in proc.stdout
    assert "Moses Perl" not in proc.stdout
