"""nmt-attention and nmt-tune-decode on a multilingual model (the tiny runs of
``multilingual_runs``): each decodes a direction as nmt-translate does, and labels or scores
it by direction."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError
from nmt.data.corpus import read_lines
from nmt.decode.languages import choose_target
from nmt.decode.options import DecodeOptions
from nmt.decode.translate import translate_lines
from nmt.evaluate.metrics import bleu, chrf
from nmt.evaluate.tune_decode import tune
from nmt.store.loading import load_trained
from nmt.store.paths import checkpoint_path

from .helpers import REPO

CPU = torch.device("cpu")


def command(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def translations(run: Path, lines: list[str], lang: str, src_lang: str) -> list[str]:
    trained = load_trained(checkpoint_path(run, None), CPU)
    target = choose_target(trained.cfg, trained.tokenizers, lang, src_lang)
    opts = DecodeOptions(beam=1, length_penalty=1.0)
    return [r[0][0] for r in translate_lines(trained, lines, opts, CPU, target=target)]


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("placement", ["source", "target"])
def test_attention_decodes_and_labels_the_direction(multilingual_runs, threeway, tmp_path,
                                                    placement):  # fmt: skip
    run = multilingual_runs(placement)
    lines = read_lines(Path(f"{threeway}.en"))[:3]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    given = [f"run={run}", f"input={tmp_path / 'in.txt'}", "tgt_lang=fr", "src_lang=en"]
    done = command("nmt.viz.plot_attention", *given, "layers=none", f"out={tmp_path / 'png'}")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = (tmp_path / "png" / "translations.tsv").read_text().splitlines()
    assert [row.split("\t", 2)[2] for row in rows] == translations(run, lines, "fr", "en")
    done = command("nmt.viz.plot_attention", *given, "format=html", f"out={tmp_path / 'html'}")
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "html" / "explorer.html").read_text()
    assert all(f"[en-fr] {line}" in page for line in lines)
    done = command("nmt.viz.plot_attention", f"run={run}", "sentence=ein Hund", "tgt_lang=cs")
    assert done.returncode == 2
    assert "target language 'cs' was not trained" in done.stderr


@pytest.mark.slow(seconds=40)
def test_tune_decode_scores_each_direction(multilingual_runs, threeway):
    run = multilingual_runs("target")
    report = tune(run, None, [1], [1.0], "cpu", resamples=100, directions=["en-fr", "de-en"])
    src_of = {"en-fr": "en", "de-en": "de"}
    assert sorted(report["directions"]) == ["de-en", "en-fr"]
    assert report["sentences"] == 120 and "pooled" in report["valid_set"]
    pool_hyps, pool_refs = [], []
    for name, entry in report["directions"].items():
        src, tgt = name.split("-")
        lines = read_lines(Path(f"{threeway}.{src_of[name]}"))
        refs = read_lines(Path(f"{threeway}.{tgt}"))
        hyps = translations(run, lines, tgt, src)
        greedy = next(r for r in entry["rows"] if r["beam"] == 1)
        assert greedy["chrF2"] == pytest.approx(chrf(hyps, refs).score)
        assert greedy["BLEU"] == pytest.approx(bleu(hyps, refs).score)
        assert entry["sentences"] == 60
        pool_hyps += hyps
        pool_refs += refs
    row = next(r for r in report["rows"] if r["beam"] == 1)
    assert row["BLEU"] == pytest.approx(bleu(pool_hyps, pool_refs).score)
    means = [e["rows"][[r["beam"] for r in e["rows"]].index(1)]["BLEU"]
             for e in report["directions"].values()]  # fmt: skip
    assert row["mean_BLEU"] == pytest.approx(sum(means) / 2)
    with pytest.raises(ConfigError, match="de-fr is not a trained direction"):
        tune(run, None, [1], [1.0], "cpu", resamples=100, directions=["de-fr"])
