"""The Hugging Face export of a multilingual model at each ``data.tag_placement``: the language
codes (``>>fr<<``) give our tagged ids where the placement puts them (first in the source, or
first in a label and ``forced_bos_token_id`` for ``generate``), every direction decodes as
ours, and the model card's example prints our translation."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
import torch
from omegaconf import OmegaConf

from nmt.data.tagged import tagged_dataset
from nmt.data.tokenizer import EOS_ID
from nmt.decode.options import DecodeOptions
from nmt.decode.search import decode_dataset
from nmt.ship.card_languages import hf_language_use
from nmt.ship.export import export_hf
from nmt.ship.hf_check import check_run
from nmt.store.loading import load_trained
from nmt.store.paths import checkpoint_path

from .helpers import MULTI_DIRECTIONS

transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses:UserWarning"),
]
LANGUAGES = ["de", "en", "fr"]
TARGETS = sorted({d.split("-")[1] for d in MULTI_DIRECTIONS})


@pytest.mark.slow(seconds=25)
def test_marian_codes_name_the_target_and_every_direction_decodes_as_ours(
    multilingual_runs, threeway, tmp_path
) -> None:
    ckpt = checkpoint_path(multilingual_runs("source"), None)
    trained = load_trained(ckpt, "cpu")
    out = export_hf(ckpt, tmp_path / "hf")  # checks log-probabilities under each code itself
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    src = trained.tokenizers.src
    lines = (threeway.parent / f"{threeway.name}.de").read_text(encoding="utf-8").splitlines()
    for lang in TARGETS:
        tag = src.tags[lang]
        for text in [line.strip() for line in lines[:20]]:
            want = [tag, *src.encode(text), EOS_ID]
            assert tok(f">>{lang}<< {text}").input_ids == want, (lang, text)
            assert tok(f">>{lang}<<{text}").input_ids == want
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert {lang: vocab[f">>{lang}<<"] for lang in TARGETS} == {t: src.tags[t] for t in TARGETS}
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "`>>de<<`, `>>en<<`, `>>fr<<`" in card and 'tok([">>en<< <a source sentence>"]' in card
    assert "forced_bos_token_id" not in card


@pytest.mark.slow(seconds=25)
def test_a_tag_on_the_target_side_is_forced_as_nllb_does(
    multilingual_runs, threeway, tmp_path
) -> None:
    ckpt = checkpoint_path(multilingual_runs("target"), None)
    trained = load_trained(ckpt, "cpu")
    out = export_hf(ckpt, tmp_path / "hf")  # checks log-probabilities, tags in the labels
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    tgt = trained.tokenizers.tgt
    lines = (threeway.parent / f"{threeway.name}.fr").read_text(encoding="utf-8").splitlines()
    for lang in TARGETS:
        for text in [line.strip() for line in lines[:20]]:
            labels = tok("x", text_target=f">>{lang}<< {text}")["labels"]
            assert labels == [tgt.tags[lang], *tgt.encode(text), EOS_ID], (lang, text)
            assert tok(text).input_ids == [*tgt.encode(text), EOS_ID]  # no code in the source
    card = (out / "README.md").read_text(encoding="utf-8")
    assert 'tok.convert_tokens_to_ids(">>en<<")' in card
    assert "`>>de<<`, `>>en<<`, `>>fr<<`" in card


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize("placement", ["source", "target", "both"])
def test_every_direction_and_the_cards_example_decode_as_ours(
    placement, multilingual_runs, threeway, threeway_test, tmp_path
) -> None:
    ckpt = checkpoint_path(multilingual_runs(placement), None)
    trained = load_trained(ckpt, "cpu")
    out = export_hf(ckpt, tmp_path / "hf")
    report = check_run(ckpt, out, limit=12, beam=2)
    names = sorted(f"{threeway_test.name}.{d}" for d in MULTI_DIRECTIONS)
    assert sorted(report["directions"]) == names
    for direction, r in report["directions"].items():
        assert r["greedy"]["share"] == 1.0, direction  # the tokens
        # the text (a model of 12 updates may emit only word boundaries, which MarianTokenizer
        # strips off its decoded text and ours keeps as spaces)
        assert r["strings"]["identical_but_outer_spaces"] == r["sentences"] == 12, direction
    assert report["ok"] == all(r["ok"] for r in report["directions"].values())

    # the card's first example, greedy, prints our greedy output in its first direction
    first = MULTI_DIRECTIONS[0].split("-")
    text = (threeway.parent / f"{threeway.name}.{first[0]}").read_text("utf-8").splitlines()[0]
    config = json.loads((out / "generation_config.json").read_text("utf-8"))
    (out / "generation_config.json").write_text(json.dumps({**config, "num_beams": 1}), "utf-8")
    card = (out / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    code = code.replace("<this folder>", str(out)).replace("<a source sentence>", text.strip())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    tags, tokenizers = trained.tokenizers.src.tags, trained.tokenizers
    src_tag = tags[first[0]] if placement == "both" else None
    data = tagged_dataset(tokenizers, [text.strip()], [""], tags[first[1]], placement, src_tag)
    greedy = DecodeOptions(beam=1, precision="32")
    (hyp,) = decode_dataset(trained.model, data, greedy, torch.device("cpu"))
    tokens = hyp.tokens[1:] if placement != "source" else hyp.tokens
    assert printed.getvalue().strip() == str([tokenizers.tgt.decode(tokens).strip()])


def test_the_card_calls_a_pair_zero_shot_only_where_one_was_not_trained() -> None:
    def intro(directions: list[str], placement: str) -> str:
        data = {"directions": directions, "tag_placement": placement}
        return "\n".join(hf_language_use(OmegaConf.create({"data": data}))[0])

    assert "zero-shot" in intro(MULTI_DIRECTIONS, "target")
    assert "zero-shot" not in intro(["de-en", "en-de"], "target")
    every = [f"{a}-{b}" for a in LANGUAGES for b in LANGUAGES if a != b]
    assert "zero-shot" not in intro(every, "both") and "forced_bos_token_id" in intro(every, "both")
