"""The attention explorer: what ``nmt-attention format=html`` writes (its data against the
model's own attention), the page's self-containment and the command's errors; then the page in
headless Chromium (tests marked ``browser``): what a reader sees equals what the model computes.

The pages are those of two tiny trained models (the session's ``trained_runs``), opened from a
file URL in a browser context without network.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sacrebleu.metrics import BLEU

from nmt.config import ConfigError
from nmt.config_checks import check_train_config
from nmt.data.tokenizer import BOS_ID, EOS_ID
from nmt.decode.options import DecodeOptions
from nmt.decode.search import greedy_search, max_output_lengths
from nmt.store.loading import load_trained
from nmt.store.paths import checkpoint_path
from nmt.viz import plot_attention as cli
from nmt.viz.explorer import (
    QUANT,
    STEPS_FILE,
    TrainingExplorer,
    document,
    encode_weights,
    render_html,
)
from nmt.viz.plot_attention import plot_attention, quote_free_text

from .helpers import compose_config, save_screenshot


def decode_weights(entry: dict[str, Any]) -> np.ndarray:
    """What the page's script does with a packed attention map: (L, H, Tq, Tk) float32, the
    inverse of :func:`nmt.viz.explorer.encode_weights`."""
    raw = np.frombuffer(base64.b64decode(entry["data"]), dtype="<u2")
    return (raw.astype(np.float32) / QUANT).reshape(entry["shape"])


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


def model_attention(
    run: Path, source: str, ckpt: str | None = None
) -> tuple[list[int], dict[str, np.ndarray]]:
    """The greedy output ids of a run's model (its checkpoint ``ckpt``, by default the one
    nmt-attention loads) and its attention (kind -> (L, H, Tq, Tk)), computed here from the
    checkpoint with the model's own forward pass."""
    trained = load_trained(checkpoint_path(run, ckpt), torch.device("cpu"))
    ids = [*trained.tokenizers.src.encode(source), EOS_ID]
    src, lens = torch.tensor([ids]), torch.tensor([len(ids)])  # (1, S), (1,)
    with torch.inference_mode():
        caps = max_output_lengths(trained.model, lens, DecodeOptions())
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


# -- the page of a training run (trainer.attention_html) ---------------------------------------


@pytest.mark.parametrize("arch", ["transformer", "gru_bahdanau"])
def test_training_writes_the_page_of_every_validation(arch: str, trained_runs) -> None:
    """One step per validation, each holding the attention of the weights of that moment."""
    run = trained_runs[arch]
    doc = embedded_document((run / "attention" / "validation.html").read_text(encoding="utf-8"))
    assert [s["step"] for s in doc["steps"]] == [30, 60]
    assert all(re.fullmatch(r"validation BLEU \d+\.\d\d", s["note"]) for s in doc["steps"])
    for step in doc["steps"]:
        (sent,) = step["sentences"]  # trainer.attention_sentences=1
        assert sent["source"] == SENTENCES[0] and sent["reference"] == REFERENCES[0]
        _, attention = model_attention(run, sent["source"], f"step_{step['step']:08d}")
        for kind, weights in attention.items():
            assert np.abs(decode_weights(sent["maps"][kind]) - weights).max() < 1e-4
    lines = (run / "attention" / STEPS_FILE).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["step"] for line in lines] == [30, 60]


def test_resumed_training_keeps_the_steps_before_it(tmp_path: Path) -> None:
    steps = [{"step": n, "note": "", "sentences": []} for n in (10, 20, 30)]
    lines = [json.dumps(s) for s in steps[:2]] + ["{not json", json.dumps(steps[2])]
    (tmp_path / STEPS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    explorer = TrainingExplorer(tmp_path, {"arch": "transformer"}, resume_step=20)
    assert explorer.steps == steps[:2]
    kept = (tmp_path / STEPS_FILE).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in kept] == steps[:2]


def test_attention_html_needs_validation_sentences() -> None:
    cfg = compose_config("train", ["trainer.attention_html=true", "trainer.attention_sentences=0"])
    with pytest.raises(ConfigError, match="trainer.attention_sentences=0: set it > 0"):
        check_train_config(cfg)
    assert compose_config("train").trainer.attention_html is False  # off by default


# ============================================================================ browser

VIEWPORT = {"width": 1366, "height": 768}  # a laptop screen
TOLERANCE = 0.0005 + 2e-5  # the page prints 3 decimals of weights stored in steps of 1/65535


@dataclass
class Opened:
    """A page and what it did: console errors and warnings, uncaught errors, requests."""

    page: Any
    problems: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@pytest.fixture
def open_page(browser) -> Iterator[Any]:
    """``open_page(path)`` opens a file in a fresh offline browser context."""
    contexts = []

    def _open(path: Path) -> Opened:
        context = browser.new_context(offline=True, viewport=VIEWPORT)
        contexts.append(context)
        opened = Opened(context.new_page())
        page = opened.page
        page.on(
            "console",
            lambda m: (
                opened.problems.append(f"{m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        page.on("pageerror", lambda e: opened.problems.append(f"uncaught: {e}"))
        page.on("request", lambda r: opened.requests.append(r.url))
        page.goto(path.resolve().as_uri())
        page.wait_for_selector("#queries button.query")
        return opened

    yield _open
    for context in contexts:
        context.close()


# -- reading the page --------------------------------------------------------------------------


def choose(page: Any, kind: str, layer: int, head: str | int) -> None:
    """Set the attention selectors as a user would, in one call to the page (a disabled
    selector has a single choice and stays)."""
    done = page.evaluate(
        """([kind, layer, head]) => [["kind", kind], ["layer", layer], ["head", head]].map(
            ([id, value]) => {
                const select = document.getElementById(id);
                if (select.disabled) return select.options.length === 1;
                select.value = value;
                select.dispatchEvent(new Event("change"));
                return select.value === value;
            })""",
        [kind, str(layer), str(head)],
    )
    assert done == [True, True, True], (kind, layer, head)


def heatmap_numbers(page: Any) -> np.ndarray:
    """The weights the heatmap prints in its cells' titles, (rows, columns)."""
    page.click("#view-heatmap")
    rows = page.eval_on_selector_all(
        "#heatmap tbody tr",
        "trs => trs.map(tr => Array.from(tr.querySelectorAll('td'), td => td.title))",
    )
    page.click("#view-tokens")
    return np.array([[float(t.rsplit(": ", 1)[1]) for t in row] for row in rows])


def hover_query(page: Any, j: int) -> list[dict[str, Any]]:
    """Hover output piece j; the key pieces' printed weights, shading alpha and labels."""
    page.hover(f"#queries button[data-index='{j}']")
    assert page.get_attribute(f"#queries button[data-index='{j}']", "aria-pressed") == "true"
    return page.eval_on_selector_all(
        "#keys .key",
        """ks => ks.map(k => ({
            label: k.querySelector('.piece').textContent,
            printed: k.querySelector('.weight').textContent,
            background: getComputedStyle(k).backgroundColor}))""",
    )


def alpha(css: str) -> float:
    """The alpha of a CSS colour: rgba(r, g, b, a), or 1 for rgb(r, g, b)."""
    parts = re.findall(r"[\d.]+", css)
    return float(parts[3]) if len(parts) == 4 else 1.0


def reference(weights: np.ndarray, layer: int, head: str | int) -> np.ndarray:
    """(Tq, Tk) of (L, H, Tq, Tk) weights: one head, or the mean of the heads."""
    return weights[layer].mean(0) if head == "mean" else weights[layer, int(head)]


def choices(attention: dict[str, np.ndarray]) -> Iterator[tuple[str, int, str | int]]:
    """Every (kind, layer, head) the selectors offer."""
    for kind, weights in attention.items():
        layers, heads = weights.shape[:2]
        for layer in range(layers):
            for head in ["mean", *range(heads)] if heads > 1 else ["mean"]:
                yield kind, layer, head


def word_groups(pieces: list[str]) -> list[range]:
    """Pieces joined into words as the page joins them: a piece starting with U+2581 starts
    a word; <s>, </s> and <pad> stand alone."""
    single, groups = {"<s>", "</s>", "<pad>"}, []
    for i, piece in enumerate(pieces):
        if i == 0 or piece in single or pieces[i - 1] in single or piece.startswith("\u2581"):
            groups.append([i])
        else:
            groups[-1].append(i)
    return [range(g[0], g[-1] + 1) for g in groups]


# -- in the browser ----------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.parametrize("arch", ["transformer", "gru_bahdanau"])
def test_every_choice_shows_the_models_weights(
    arch: str, trained_runs, explorer_pages, open_page, tmp_path: Path
) -> None:
    """For each kind, layer and head (or head mean): the heatmap prints the model's (j, i)
    weight in every cell, and hovering output piece j shades and labels each source piece i
    with it (first sentence: the first, middle and last j), to 3 decimals. Offline, from a file
    URL, without console errors."""
    opened = open_page(explorer_pages[arch])
    page = opened.page
    assert page.title() == "Attention explorer"
    for k in (0, 2):  # a sentence of the training data, and one of letters and markup
        source = SENTENCES[k]
        page.select_option("#sentence", str(k))
        assert page.text_content("#source-text") == source  # any letters, markup as text
        _, attention = model_attention(trained_runs[arch], source)
        offered = list(choices(attention))
        assert len(offered) == (18 if arch == "transformer" else 1)
        for kind, layer, head in offered:
            choose(page, kind, layer, head)
            expected = reference(attention[kind], layer, head)  # (Tq, Tk)
            shown = heatmap_numbers(page)
            assert shown.shape == expected.shape, (kind, layer, head)
            assert np.abs(shown - expected).max() <= TOLERANCE, (kind, layer, head)
            n_queries = expected.shape[0]
            for j in sorted({0, n_queries // 2, n_queries - 1}) if k == 0 else []:
                keys = hover_query(page, j)
                printed = np.array([float(key["printed"]) for key in keys])
                shading = np.array([alpha(key["background"]) for key in keys])
                assert np.abs(printed - expected[j]).max() <= TOLERANCE, (kind, layer, head, j)
                assert np.abs(shading - expected[j]).max() <= 0.004, (kind, layer, head, j)
    save_screenshot(page, tmp_path, f"explorer-{arch}.png")
    scroll = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll[0] <= scroll[1], "the page is wider than a laptop screen"
    assert opened.problems == []
    assert opened.requests == [explorer_pages[arch].resolve().as_uri()]


@pytest.mark.browser
def test_joined_words_sum_sources_and_average_outputs(
    trained_runs, explorer_pages, open_page
) -> None:
    """With pieces joined into words, cell (word a, word b) is the mean over a's pieces of the
    sum of the weights they give b's pieces."""
    opened = open_page(explorer_pages["transformer"])
    page = opened.page
    tokens_before = page.locator("#queries button").count()
    page.keyboard.press("w")
    assert page.is_checked("#words")
    source = SENTENCES[0]
    _, attention = model_attention(trained_runs["transformer"], source)
    doc_pieces = page.evaluate(
        "JSON.parse(document.getElementById('nmt-data').textContent).steps[0].sentences[0]"
    )
    rows, cols = word_groups(doc_pieces["out"]), word_groups(doc_pieces["src"])
    assert len(rows) < tokens_before or len(cols) < len(doc_pieces["src"])
    pieces = reference(attention["cross"], 1, "mean")  # the default choice: last layer, mean
    expected = np.array([[pieces[np.ix_(a, b)].sum(1).mean() for b in cols] for a in rows])
    assert np.abs(heatmap_numbers(page) - expected).max() <= TOLERANCE
    labels = page.eval_on_selector_all("#keys .key .piece", "ps => ps.map(p => p.textContent)")
    assert labels[:3] == ["Zwei", "junge", "weiße"] and labels[-1] == "</s>"
    assert opened.problems == []


@pytest.mark.browser
@pytest.mark.parametrize("arch", ["transformer", "gru_bahdanau"])
def test_keyboard_reaches_everything(arch: str, explorer_pages, open_page) -> None:
    """Tab reaches the output pieces; arrows move between pieces and heatmap cells; letter keys
    switch sentence, attention kind and view."""
    opened = open_page(explorer_pages[arch])
    page = opened.page
    active = "document.activeElement"
    for _ in range(20):
        page.keyboard.press("Tab")
        if page.evaluate(f"{active}.matches('button.query')"):
            break
    assert page.evaluate(f"{active}.dataset.index") == "0"
    page.keyboard.press("ArrowRight")
    assert page.evaluate(f"{active}.dataset.index") == "1"
    label = page.text_content("#queries button[data-index='1']")
    assert page.text_content("#readout").startswith(f"\u201c{label}\u201d (2 of")
    page.keyboard.press("End")
    last = page.locator("#queries button").count() - 1
    assert page.get_attribute(f"#queries button[data-index='{last}']", "aria-pressed") == "true"
    page.keyboard.press("v")
    assert page.is_visible("#heatmap") and not page.is_visible("#queries")
    for _ in range(20):
        page.keyboard.press("Tab")
        if page.evaluate(f"{active}.matches('td')"):
            break
    assert page.evaluate(f"[{active}.dataset.q, {active}.dataset.k]") == [str(last), "0"]
    page.keyboard.press("ArrowUp")
    page.keyboard.press("ArrowRight")
    assert page.evaluate(f"[{active}.dataset.q, {active}.dataset.k]") == [str(last - 1), "1"]
    assert ": " in page.text_content("#readout")
    page.keyboard.press("n")
    assert page.input_value("#sentence") == "1"
    page.keyboard.press("a")
    assert page.input_value("#kind") == ("enc_self" if arch == "transformer" else "cross")
    assert opened.problems == []


@pytest.mark.browser
def test_training_page_steps_through_validations(trained_runs, open_page) -> None:
    """The step selector (and the [ ] keys) show the alignment of each validation's weights."""
    run = trained_runs["transformer"]
    opened = open_page(run / "attention" / "validation.html")
    page = opened.page
    assert page.title() == "Attention at each validation" and page.is_visible("#step")
    options = page.eval_on_selector_all("#step option", "os => os.map(o => o.textContent)")
    assert [o.split(" \u2014 ")[0] for o in options] == ["step 30", "step 60"]
    shown = {}
    for key, step in (("", 60), ("[", 30), ("]", 60)):
        if key:
            page.keyboard.press(key)
        assert page.input_value("#step") == str([30, 60].index(step))
        assert page.text_content("#source-text") == SENTENCES[0]
        _, attention = model_attention(run, SENTENCES[0], f"step_{step:08d}")
        shown[step] = heatmap_numbers(page)
        expected = reference(attention["cross"], 1, "mean")
        assert np.abs(shown[step] - expected).max() <= TOLERANCE, step
    assert opened.problems == []
