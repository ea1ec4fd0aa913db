"""The commands on a multilingual model (tiny runs of both tag placements, trained once per
session by ``multilingual_runs``): nmt-translate prints a direction's translations (that they
equal nmt-eval's: tests/test_multilingual_e2e.py); at target placement no output carries the
tag; CTranslate2 decodes each direction as our greedy search does; a package keeps the
directions; bad requests are refused in one line. The command lines run where they are the
property (stdout, here; exit status 2 and a one-line error: test_multilingual_e2e.py), the
commands' functions in this process elsewhere."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.data.corpus import DataError, read_lines
from nmt.data.tokenizer import language_tag
from nmt.decode import ct2
from nmt.decode.engines import TorchEngine, make_ct2_engine
from nmt.decode.languages import choose_target, decode_ids_into, target_dataset
from nmt.decode.options import DecodeOptions
from nmt.decode.translate import translate, translate_lines
from nmt.evaluate.scoring import evaluate
from nmt.ship.export import export_package
from nmt.store.gate import CheckpointError
from nmt.store.loading import load_package, load_trained
from nmt.store.package import MANIFEST, read_package
from nmt.store.paths import checkpoint_path

from .helpers import MULTI_DIRECTIONS, REPO, compose_config

CPU = torch.device("cpu")
PLACEMENTS = ["source", "target"]


def command(module: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
        timeout=600, input=stdin,
    )  # fmt: skip


def greedy(trained, lines: list[str], lang: str, src_lang: str | None = None) -> list[str]:
    target = choose_target(trained.cfg, trained.tokenizers, lang, src_lang)
    opts = DecodeOptions(beam=1, length_penalty=1.0)
    return [r[0][0] for r in translate_lines(trained, lines, opts, CPU, target=target)]


@pytest.fixture(scope="module")
def packages(multilingual_runs, tmp_path_factory):
    """placement -> a package of the run's best checkpoint with a CTranslate2 model."""
    if not ct2.available():
        pytest.skip("CTranslate2 is not installed (the export extra)")
    out = {}
    for placement in PLACEMENTS:
        run = multilingual_runs(placement)
        folder = tmp_path_factory.mktemp(f"pkg-{placement}") / "pkg"
        out[placement] = export_package(checkpoint_path(run, None), folder, fmt="ctranslate2")
    return out


@pytest.mark.slow(seconds=10)
def test_translate_prints_the_translations_of_a_direction(multilingual_runs, threeway, tmp_path,
                                                          capsys):  # fmt: skip
    lines = read_lines(Path(f"{threeway}.en"))[:10]
    # the command line, reading stdin (target placement: no tag in what it prints)
    run = multilingual_runs("target")
    done = command("nmt.decode.translate", f"run={run}", "tgt_lang=fr", "src_lang=en",
                   "progress=false", "engine=torch", stdin="\n".join(lines) + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:-1] == greedy(load_trained(checkpoint_path(run, None), CPU),
                                                  lines, "fr", "en")  # fmt: skip
    # the command's function, reading a file (source placement)
    run = multilingual_runs("source")
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    args = [f"run={run}", "tgt_lang=de", "src_lang=en", f"input={tmp_path / 'in.txt'}"]
    translate(compose_config("translate", [*args, "progress=false"]))
    expected = greedy(load_trained(checkpoint_path(run, None), CPU), lines, "de", "en")
    assert capsys.readouterr().out.split("\n")[:-1] == expected


@pytest.mark.slow(seconds=10)
def test_target_placement_never_emits_the_tag(multilingual_runs, threeway):
    trained = load_trained(checkpoint_path(multilingual_runs("target"), None), CPU)
    engine = TorchEngine(trained.model, CPU)
    lines = read_lines(Path(f"{threeway}.de"))[:20]
    sources = trained.tokenizers.src.encode_batch(lines)
    for lang in ("en", "fr"):
        target = choose_target(trained.cfg, trained.tokenizers, lang)
        assert target.placement == "target"
        opts = DecodeOptions(beam=3, length_penalty=1.0)
        hyps = decode_ids_into(engine, sources, target, opts, keep_attention=True)
        # the search's own output starts with the forced tag; decode_ids_into takes it off
        raw = engine.hypotheses(target_dataset(trained.tokenizers, lines, target), opts,
                                keep_attention=True)  # fmt: skip
        for h, r in zip(hyps, raw, strict=True):
            assert r.tokens[0] == target.tag and h.tokens == r.tokens[1:]
            assert [t for t, _ in h.nbest] == [t[1:] for t, _ in r.nbest]
            assert all(t[0] == target.tag for t, _ in r.nbest)
            assert h.attention.shape[0] == len(h.tokens) + 1
        texts = translate_lines(trained, lines, opts, CPU, n_best=3, target=target)
        for result in texts:
            assert all(language_tag(lang) not in text for text, _ in result)


@pytest.mark.slow(seconds=4)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_ctranslate2_equals_torch_greedy(packages, threeway, tmp_path, capsys, placement):
    trained = load_package(packages[placement], CPU)
    torch_engine, ct2_engine = TorchEngine(trained.model, CPU), make_ct2_engine(trained, CPU)
    lines = read_lines(Path(f"{threeway}.en"))[:40] + [""]
    sources = trained.tokenizers.src.encode_batch(lines)
    opts = DecodeOptions(beam=1, length_penalty=1.0)
    for lang in ("de", "fr", "en"):
        target = choose_target(trained.cfg, trained.tokenizers, lang)
        ours = decode_ids_into(torch_engine, sources, target, opts)
        theirs = decode_ids_into(ct2_engine, sources, target, opts)
        assert [h.tokens for h in theirs] == [h.tokens for h in ours], lang
        assert theirs[-1].tokens == [] and len(theirs) == len(lines)
    # and through the command's function, on the package
    (tmp_path / "in.txt").write_text("\n".join(lines[:8]) + "\n")
    capsys.readouterr()
    translate(compose_config("translate", [f"model_dir={packages[placement]}", "tgt_lang=fr",
                                           "engine=ctranslate2", f"input={tmp_path / 'in.txt'}",
                                           "progress=false"]))  # fmt: skip
    assert capsys.readouterr().out.split("\n")[:-1] == greedy(trained, lines[:8], "fr")


@pytest.mark.slow(seconds=10)
def test_package_keeps_the_directions(packages, tmp_path):
    for placement, folder in packages.items():
        files = read_package(folder)
        assert list(files.manifest.directions) == MULTI_DIRECTIONS
        assert files.manifest.tag_placement == placement
        assert list(files.cfg.data.directions) == MULTI_DIRECTIONS
        assert files.cfg.data.tag_placement == placement
        card = (folder / "README.md").read_text()
        assert "- multilingual: de-en, en-de, en-fr, fr-en" in card
        said = {"source": "tag goes on the source", "target": "tag is the first output token"}
        assert said[placement] in card
    # a manifest that disagrees with config.yaml is refused, naming the key
    folder = packages["source"]
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["directions"] = ["de-en"]
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="key 'directions'"):
        read_package(bad)


@pytest.mark.slow(seconds=4)
def test_card_lists_each_direction_with_its_scores(multilingual_runs, tmp_path):
    run = multilingual_runs("source")
    evaluate(compose_config("eval", [f"run={run}", "bootstrap=0", "progress=false"]))
    folder = export_package(checkpoint_path(run, None), tmp_path / "pkg")
    card = (folder / "README.md").read_text()
    report = json.loads(next((run / "eval").glob("scores.*.json")).read_text())
    for name, entry in report["directions"].items():
        bleu = entry["scores"]["BLEU"]
        assert f"{name}: {entry['direction']}" in card
        assert f"- BLEU {bleu['score']:.2f} `{bleu['signature']}`" in card
        assert f"Translation {entry['direction']}" in card  # the model-index
    assert "off-target rate" in card


@pytest.mark.slow(seconds=4)
def test_bad_language_requests_are_refused_in_one_line(multilingual_runs, trained_runs):
    # the commands' functions; that a command line ends such an error with exit status 2 and
    # one ERROR line: test_multilingual_e2e.py (nmt-translate, nmt-eval),
    # test_multilingual_tools.py (nmt-attention), test_package.py (nmt-export)
    run = multilingual_runs("source")
    cases = [
        ([f"run={run}"], "translates into de, en, fr: name the target language with tgt_lang"),
        ([f"run={run}", "tgt_lang=cs"], "target language 'cs' was not trained: this model "
                                        "translates into de, en, fr"),
        ([f"run={run}", "tgt_lang=fr", "src_lang=cs"], "source language 'cs' was not trained"),
        ([f"run={trained_runs['transformer']}", "tgt_lang=fr"],
         "tgt_lang='fr': this model is bilingual and translates de->en only"),
    ]  # fmt: skip
    for args, message in cases:
        with pytest.raises(DataError) as err:
            translate(compose_config("translate", [*args, "progress=false"]))
        assert message in str(err.value) and "\n" not in str(err.value), args
    trained = load_trained(checkpoint_path(run, None), CPU)
    with pytest.raises(DataError, match="translates into de, en, fr"):
        choose_target(trained.cfg, trained.tokenizers, None)
