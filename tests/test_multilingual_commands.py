"""The commands on a multilingual model (tiny runs of both tag placements, trained once per
session by ``multilingual_runs``): nmt-translate's output for a direction equals nmt-eval's
decoding of it; at target placement no output carries the tag; CTranslate2 decodes each
direction as our greedy search does; a package keeps the directions; bad requests are refused
in one line."""

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
from nmt.decode.translate import translate_lines
from nmt.ship.export import export_package
from nmt.store.gate import CheckpointError
from nmt.store.loading import load_package, load_trained
from nmt.store.package import MANIFEST, read_package
from nmt.store.paths import checkpoint_path

from .helpers import MULTI_DIRECTIONS, REPO

CPU = torch.device("cpu")
PLACEMENTS = ["source", "target"]


def command(module: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
        timeout=600, input=stdin,
    )  # fmt: skip


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if "ERROR" in line]


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


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_translate_equals_eval_in_every_direction(multilingual_runs, threeway, tmp_path, placement):
    run = multilingual_runs(placement)
    done = command("nmt.evaluate", f"run={run}", f"out={tmp_path}", "bootstrap=0",
                   "off_target=false", "progress=false")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    trained = load_trained(checkpoint_path(run, None), CPU)
    opts = DecodeOptions(beam=1, length_penalty=1.0)
    outputs = {}
    for direction in MULTI_DIRECTIONS:
        src_lang, tgt_lang = direction.split("-")
        (hyp_file,) = tmp_path.glob(f"{threeway.name}.{direction}.*.hyp")
        expected = read_lines(hyp_file)
        lines = read_lines(Path(f"{threeway}.{src_lang}"))
        target = choose_target(trained.cfg, trained.tokenizers, tgt_lang, src_lang)
        got = [r[0][0] for r in translate_lines(trained, lines, opts, CPU, target=target)]
        assert got == expected, direction
        outputs[direction] = got
    # the command itself, for one direction, reading stdin
    lines = read_lines(Path(f"{threeway}.en"))[:10]
    done = command("nmt.decode.translate", f"run={run}", "tgt_lang=fr", "src_lang=en",
                   "progress=false", "engine=torch", stdin="\n".join(lines) + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:-1] == outputs["en-fr"][:10]


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


@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_ctranslate2_equals_torch_greedy(packages, threeway, placement):
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
    # and through the command, on the package
    done = command("nmt.decode.translate", f"model={packages[placement]}", "engine=ctranslate2",
                   "tgt_lang=fr", "progress=false", stdin="\n".join(lines[:8]) + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    target = choose_target(trained.cfg, trained.tokenizers, "fr")
    expected = [r[0][0] for r in translate_lines(trained, lines[:8], opts, CPU, target=target)]
    assert done.stdout.split("\n")[:-1] == expected


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
        assert f"tag goes on the {placement}" in card
    # a manifest that disagrees with config.yaml is refused, naming the key
    folder = packages["source"]
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["directions"] = ["de-en"]
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="key 'directions'"):
        read_package(bad)


@pytest.mark.slow(seconds=20)
def test_card_lists_each_direction_with_its_scores(multilingual_runs, tmp_path):
    run = multilingual_runs("source")
    done = command("nmt.evaluate", f"run={run}", "bootstrap=0", "progress=false")
    assert done.returncode == 0, done.stderr[-3000:]
    folder = export_package(checkpoint_path(run, None), tmp_path / "pkg")
    card = (folder / "README.md").read_text()
    report = json.loads(next((run / "eval").glob("scores.*.json")).read_text())
    for name, entry in report["directions"].items():
        bleu = entry["scores"]["BLEU"]
        assert f"{name}: {entry['direction']}" in card
        assert f"- BLEU {bleu['score']:.2f} `{bleu['signature']}`" in card
        assert f"Translation {entry['direction']}" in card  # the model-index
    assert "off-target rate" in card


@pytest.mark.slow(seconds=25)
def test_bad_language_requests_are_refused_in_one_line(multilingual_runs, trained_runs):
    run = multilingual_runs("source")
    stdin = "ein Hund\n"
    cases = [
        ([f"run={run}"], "translates into de, en, fr: name the target language with tgt_lang"),
        ([f"run={run}", "tgt_lang=cs"], "target language 'cs' was not trained: this model "
                                        "translates into de, en, fr"),
        ([f"run={run}", "tgt_lang=fr", "src_lang=cs"], "source language 'cs' was not trained"),
        ([f"run={trained_runs['transformer']}", "tgt_lang=fr"],
         "tgt_lang='fr': this model is bilingual and translates de->en only"),
    ]  # fmt: skip
    for args, message in cases:
        done = command("nmt.decode.translate", *args, "progress=false", stdin=stdin)
        assert done.returncode == 2, (args, done.stderr[-2000:])
        assert len(errors(done)) == 1 and message in errors(done)[0], (args, done.stderr)
    trained = load_trained(checkpoint_path(run, None), CPU)
    with pytest.raises(DataError, match="translates into de, en, fr"):
        choose_target(trained.cfg, trained.tokenizers, None)
    target = multilingual_runs("target")  # Marian's convention has no tag on the output side
    done = command("nmt.ship.export", str(target), "--out", str(target.parent / "hf"),
                   "--format", "hf")  # fmt: skip
    assert done.returncode == 2
    assert "data.tag_placement=target cannot be exported" in errors(done)[0]
