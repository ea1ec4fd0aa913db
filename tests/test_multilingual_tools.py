"""nmt-attention and nmt-tune-decode on a multilingual model (the tiny runs of
``multilingual_runs``): each decodes a direction as nmt-translate does, and labels or scores
it by direction; tune-decode's expectation is decoded from sources tagged here, by the
documented convention (``<2xx>``), not by the tagging code the commands share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch

from nmt.config import ConfigError
from nmt.data.batching import TokenDataset
from nmt.data.corpus import read_lines
from nmt.decode.languages import choose_target
from nmt.decode.options import DecodeOptions
from nmt.decode.search import translate_dataset
from nmt.decode.translate import translate_lines
from nmt.evaluate.metrics import bleu, chrf
from nmt.evaluate.tune_decode import tune
from nmt.store.loading import load_trained
from nmt.store.paths import checkpoint_path
from nmt.viz.plot_attention import plot_attention

from .helpers import REPO, compose_config

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


def tagged_by_hand(trained, lines: list[str], lang: str) -> list[str]:
    """Greedy translations of ``lines`` into ``lang``, tagged as documented (the piece
    ``<2lang>`` first in the source at source placement, forced as the first output token at
    target placement) without nmt.decode.languages."""
    pieces = spm.SentencePieceProcessor(model_proto=trained.tokenizers.tgt.proto)
    tag = pieces.piece_to_id(f"<2{lang}>")
    assert pieces.id_to_piece(tag) == f"<2{lang}>"
    sources = trained.tokenizers.src.encode_batch(lines)
    placement = trained.cfg.data.tag_placement
    if placement == "source":
        sources = [[tag, *ids] for ids in sources]
    data = TokenDataset(sources, [[] for _ in sources])
    if placement == "target":
        data.forced = np.full(len(sources), tag, dtype=np.int64)
    opts = DecodeOptions(beam=1, length_penalty=1.0)
    return translate_dataset(trained.model, data, trained.tokenizers.tgt, opts, CPU)


@pytest.mark.slow(seconds=8)
@pytest.mark.parametrize("placement", ["source", "target"])
def test_attention_decodes_and_labels_the_direction(multilingual_runs, threeway, tmp_path,
                                                    placement):  # fmt: skip
    run = multilingual_runs(placement)
    lines = read_lines(Path(f"{threeway}.en"))[:3]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    given = [f"run={run}", f"input={tmp_path / 'in.txt'}", "tgt_lang=fr", "src_lang=en"]
    plot_attention(compose_config("attention", [*given, "layers=none", f"out={tmp_path / 'png'}"]))
    rows = (tmp_path / "png" / "translations.tsv").read_text().splitlines()
    assert [row.split("\t", 2)[2] for row in rows] == translations(run, lines, "fr", "en")
    plot_attention(compose_config("attention", [*given, "format=html", f"out={tmp_path / 'html'}"]))
    page = (tmp_path / "html" / "explorer.html").read_text()
    assert all(f"[en-fr] {line}" in page for line in lines)


@pytest.mark.slow(seconds=6)
def test_attention_command_refuses_an_untrained_language_in_one_line(multilingual_runs):
    done = command("nmt.viz.plot_attention", f"run={multilingual_runs('source')}",
                   "sentence=ein Hund", "tgt_lang=cs")  # fmt: skip
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "target language 'cs' was not trained" in errors[0]


@pytest.mark.slow(seconds=8)
def test_tune_decode_scores_each_direction(multilingual_runs, threeway, monkeypatch):
    import nmt.evaluate.tune_decode as tune_decode

    decoded = []  # what the command decodes greedily, direction after direction

    def recorded(model, data, tokenizer, opts, device):
        out = translate_dataset(model, data, tokenizer, opts, device)
        if opts.beam == 1:
            decoded.append(out)
        return out

    monkeypatch.setattr(tune_decode, "translate_dataset", recorded)
    run = multilingual_runs("target")
    report = tune(run, None, [1], [1.0], "cpu", resamples=100, directions=["en-fr", "de-en"])
    assert sorted(report["directions"]) == ["de-en", "en-fr"]
    assert report["sentences"] == 120 and "pooled" in report["valid_set"]
    trained = load_trained(checkpoint_path(run, None), CPU)
    pool_hyps, pool_refs = [], []
    for k, name in enumerate(["en-fr", "de-en"]):  # the order asked for
        entry = report["directions"][name]
        src, tgt = name.split("-")
        refs = read_lines(Path(f"{threeway}.{tgt}"))
        hyps = tagged_by_hand(trained, read_lines(Path(f"{threeway}.{src}")), tgt)
        # the very outputs (a tiny model's scores hardly tell one tag from another)
        assert decoded[k] == hyps, name
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
