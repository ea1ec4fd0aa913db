"""The Hugging Face export of a multilingual model: Marian's convention for the target language
(``>>fr<<`` first in the source) gives our tagged ids and our greedy output in every direction;
a model whose tag is the first output token is refused with the reason."""

from __future__ import annotations

import json

import pytest

from nmt.config import ConfigError
from nmt.data.tokenizer import EOS_ID
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


@pytest.mark.slow(seconds=25)
def test_marian_codes_name_the_target_and_every_direction_decodes_as_ours(
    multilingual_runs, threeway, threeway_test, tmp_path
) -> None:
    ckpt = checkpoint_path(multilingual_runs("source"), None)
    trained = load_trained(ckpt, "cpu")
    out = export_hf(ckpt, tmp_path / "hf")  # checks log-probabilities under each code itself
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    src = trained.tokenizers.src
    targets = sorted({d.split("-")[1] for d in MULTI_DIRECTIONS})
    lines = (threeway.parent / f"{threeway.name}.de").read_text(encoding="utf-8").splitlines()
    for lang in targets:
        tag = src.tags[lang]
        for text in [line.strip() for line in lines[:20]]:
            want = [tag, *src.encode(text), EOS_ID]
            assert tok(f">>{lang}<< {text}").input_ids == want, (lang, text)
            assert tok(f">>{lang}<<{text}").input_ids == want
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert {lang: vocab[f">>{lang}<<"] for lang in targets} == {t: src.tags[t] for t in targets}
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "`>>de<<`, `>>en<<`, `>>fr<<`" in card and 'tok([">>de<< <a source sentence>"]' in card

    report = check_run(ckpt, out, limit=12, beam=2)
    names = sorted(f"{threeway_test.name}.{d}" for d in MULTI_DIRECTIONS)
    assert sorted(report["directions"]) == names
    for direction, r in report["directions"].items():
        assert r["greedy"]["share"] == 1.0, direction  # the tokens
        # the text (a model of 12 updates may emit only word boundaries, which MarianTokenizer
        # strips off its decoded text and ours keeps as spaces)
        assert r["strings"]["identical_but_outer_spaces"] == r["sentences"] == 12, direction
    assert report["ok"] == all(r["ok"] for r in report["directions"].values())


def test_a_tag_on_the_target_side_is_refused(multilingual_runs, tmp_path) -> None:
    ckpt = checkpoint_path(multilingual_runs("target"), None)
    with pytest.raises(ConfigError, match="data.tag_placement=target cannot be exported"):
        export_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
