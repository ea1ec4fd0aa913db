"""The attention explorer: what ``nmt-attention format=html`` writes (its data against the
model's own attention), the page's self-containment and the command's errors, for two tiny
trained models (the session's ``trained_runs``)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sacrebleu.metrics import BLEU

from nmt import plot_attention as cli
from nmt.config import ConfigError
from nmt.data.tokenizer import BOS_ID, EOS_ID
from nmt.explorer import QUANT, decode_weights, document, encode_weights, render_html
from nmt.inference import checkpoint_path, load_trained
from nmt.plot_attention import plot_attention, quote_free_text
from nmt.search import greedy_search, max_output_lengths

from .helpers import compose_config

pytestmark = pytest.mark.usefixtures("one_thread")

# the corpus's first lines (the tiny models trained on them), and one to test the page itself:
# Czech and French letters, markup and a script end tag, all of which must stay text
SENTENCES = [
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "Mehrere Männer mit Schutzhelmen bedienen ein Antriebsradsystem.",
    "Žena v červeném kabátě <b>&amp;</b> </script> à l'école",
]
REFERENCES = [
    "Two young, White males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "A woman in a red coat.",
]


def embedded_document(html: str) -> dict:
    """The JSON document inside an explorer page."""
    found = re.search(r'<script type="application/json" id="nmt-data">(.*?)</script>', html, re.S)
    assert found, "no data element in the page"
    return json.loads(found.group(1))


def model_attention(run: Path, source: str) -> tuple[list[int], dict[str, np.ndarray]]:
    """The greedy output ids of a run's model and its attention (kind -> (L, H, Tq, Tk)),
    computed here from the checkpoint with the model's own forward pass."""
    trained = load_trained(checkpoint_path(run), torch.device("cpu"))
    ids = [*trained.tokenizers.src.encode(source), EOS_ID]
    src, lens = torch.tensor([ids]), torch.tensor([len(ids)])  # (1, S), (1,)
    with torch.inference_mode():
        caps = max_output_lengths(lens, 1.2, 10)
        (hyp,) = greedy_search(trained.model, src, lens, caps, BOS_ID, EOS_ID)
        tgt_in = torch.tensor([[BOS_ID, *hyp.tokens]])  # (1, T + 1)
        _, attn = trained.model.forward_with_attention(src, lens, tgt_in)
    return hyp.tokens, {k: torch.stack([w[0] for w in ws]).numpy() for k, ws in attn.items()}


@pytest.fixture(scope="module")
def explorer_pages(trained_runs: dict[str, Path], tmp_path_factory) -> dict[str, Path]:
    """``nmt-attention format=html`` of each trained run on SENTENCES, with references."""
    folder = tmp_path_factory.mktemp("explorer")
    src, ref = folder / "in.de", folder / "ref.en"
    src.write_text("\n".join([SENTENCES[0], "", *SENTENCES[1:]]) + "\n", encoding="utf-8")
    ref.write_text("\n".join([REFERENCES[0], "", *REFERENCES[1:]]) + "\n", encoding="utf-8")
    pages = {}
    for arch, run in trained_runs.items():
        overrides = [f"run={run}", "format=html", f"input={src}", f"references={ref}"]
        (page,) = plot_attention(compose_config("attention", [*overrides, f"out={folder / arch}"]))
        pages[arch] = page
    return pages


# -- the data of the page ----------------------------------------------------------------------


def test_weights_survive_encoding() -> None:
    torch.manual_seed(0)
    layers = [torch.softmax(torch.randn(3, 4, 5), -1) for _ in range(2)]  # (H, Tq, Tk) each
    layers[0][0, 0, 0] = 1.0000001  # rounding noise above 1 is clipped
    entry = encode_weights(layers)
    assert entry["shape"] == [2, 3, 4, 5]
    back = decode_weights(entry)  # (L, H, Tq, Tk)
    assert back.shape == (2, 3, 4, 5) and back.max() <= 1.0
    assert np.abs(back - torch.stack(layers).numpy()).max() <= 0.5 / QUANT + 1e-7


@pytest.mark.parametrize("arch", ["transformer", "gru_bahdanau"])
def test_page_holds_the_models_attention(arch: str, trained_runs, explorer_pages) -> None:
    """Every kind, layer and head stored in the page equals what the model computes."""
    doc = embedded_document(explorer_pages[arch].read_text(encoding="utf-8"))
    trained = load_trained(checkpoint_path(trained_runs[arch]), torch.device("cpu"))
    assert doc["model"]["arch"] == arch and doc["model"]["src_lang"] == "de"
    ((step),) = doc["steps"]
    assert step["step"] == trained.step
    sentences = step["sentences"]
    assert [s["source"] for s in sentences] == SENTENCES  # the blank line is skipped
    assert [s["reference"] for s in sentences] == REFERENCES
    for sent in sentences:
        tokens, attention = model_attention(trained_runs[arch], sent["source"])
        tgt = trained.tokenizers.tgt
        assert sent["out"] == tgt.pieces([*tokens, EOS_ID])
        assert sent["inp"] == tgt.pieces([BOS_ID, *tokens])
        assert sent["hypothesis"] == tgt.decode(tokens)
        assert sent["src"][-1] == "</s>"
        expected_kinds = {"cross", "enc_self", "dec_self"} if arch == "transformer" else {"cross"}
        assert set(sent["maps"]) == set(attention) == expected_kinds
        for kind, weights in attention.items():
            stored = decode_weights(sent["maps"][kind])
            assert stored.shape == weights.shape
            assert np.abs(stored - weights).max() < 1e-4, kind
        bleu = BLEU(effective_order=True).sentence_score(sent["hypothesis"], [sent["reference"]])
        assert sent["bleu"] == pytest.approx(bleu.score)
        assert sent["score"] < 0


def test_page_is_self_contained(explorer_pages) -> None:
    """No address outside the page: no src/href but data: URLs, a policy that forbids
    requests, and the document read back whole (markup in a sentence stays data)."""
    html = explorer_pages["transformer"].read_text(encoding="utf-8")
    assert "default-src 'none'" in html
    assert re.findall(r'(?:src|href)\s*=\s*"(?!data:)', html) == []
    assert not re.search(r"https?://", html.split('id="nmt-data">')[0])
    assert html.count("</script>") == 2  # the data element's and the script's
    doc = embedded_document(html)
    assert doc["steps"][0]["sentences"][2]["source"] == SENTENCES[2]


def test_render_html_keeps_any_text(tmp_path: Path) -> None:
    text = "</script><script>alert(1)</script> \u2028 &lt; ß"
    doc = document({"arch": "gru_bahdanau", "name": text}, [{"step": 1, "sentences": []}])
    html = render_html(doc)
    assert embedded_document(html) == doc
    assert "<script>alert" not in html


# -- the command -------------------------------------------------------------------------------


def test_command_writes_the_page_into_the_run(trained_runs, tmp_path, monkeypatch) -> None:
    """``nmt-attention format=html`` from the command line, sentence and reference unquoted."""
    run = trained_runs["gru_bahdanau"]
    argv = ["nmt-attention", f"run={run}", "format=html", "words=true"]
    argv += ["sentence=Ein Mann fährt Fahrrad.", "reference=A man rides a bike."]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    cli.main()
    doc = embedded_document((run / "attention" / "explorer.html").read_text(encoding="utf-8"))
    (sent,) = doc["steps"][0]["sentences"]
    assert doc["join_words"] is True
    assert (
        sent["source"] == "Ein Mann fährt Fahrrad." and sent["reference"] == "A man rides a bike."
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["sentence=''"], "sentence='': no non-empty sentence"),
        (["sentence='  '"], "sentence='  ': no non-empty sentence"),
        (["format=htm", "sentence=x"], "format='htm' is not one of: png, html"),
        (["format=HTML", "sentence=x"], "format='HTML' is not one of"),
        (["sentence=x", "reference=y", "input=FILE"], "not both"),
        (["input=FILE", "reference=y"], "reference= goes with sentence="),
        (["sentence=x", "references=FILE"], "references=FILE goes with input=FILE"),
        (["input=FILE", "references=SHORT"], r"has 1 lines but input=.* has 2"),
        (["input=EMPTY"], r"input=.*empty.*: no non-empty sentence"),
    ],
)
def test_bad_requests_name_the_option(
    overrides: list[str], message: str, trained_runs, tmp_path: Path
) -> None:
    files = {"FILE": "Ein Hund.\nZwei Hunde.\n", "SHORT": "A dog.\n", "EMPTY": "\n \n"}
    for name, text in files.items():
        (tmp_path / name.lower()).write_text(text, encoding="utf-8")
    resolved = [
        re.sub(r"=(FILE|SHORT|EMPTY)$", lambda m: f"={tmp_path / m.group(1).lower()}", o)
        for o in overrides
    ]
    cfg = compose_config("attention", [f"run={trained_runs['transformer']}", *resolved])
    with pytest.raises(ConfigError, match=message):
        plot_attention(cfg)


def test_missing_run_is_named(tmp_path: Path, monkeypatch, capfd) -> None:
    """A run that does not exist stops the command with exit status 2 and names ``run=``."""
    missing = tmp_path / "no_such_run"
    argv = ["nmt-attention", f"run={missing}", "format=html", "sentence=Ein Hund."]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 2
    assert f"run={missing}: no such run directory" in capfd.readouterr().err


def test_reference_is_quoted_like_the_sentence() -> None:
    assert quote_free_text(["reference=It's a dog."]) == ["reference='It\\'s a dog.'"]
