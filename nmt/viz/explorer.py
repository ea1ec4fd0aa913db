"""The attention explorer: one self-contained HTML page for reading a model's attention.

``nmt-attention ... format=html`` writes it for given sentences, and training with
``trainer.attention_html=true`` writes it for the fixed validation sentences at every
validation (one page holding every step so far, :class:`TrainingExplorer`).

The page needs no network: its script, style and data are inline. For each sentence it shows
the source and output pieces; hovering or focusing an output piece shades the source pieces by
its weights and prints them. Selectors choose the attention kind (the GRU's alignment; the
Transformer's cross-attention and encoder/decoder self-attention), the layer and a head or the
mean of the heads; a heatmap shows the whole matrix of the same choice. Pieces can be joined
into words: a word's row is the mean of its pieces' rows (still a distribution), a word's
column the sum of its pieces' columns (the weight the word gets as a whole).

Weights are computed as in :mod:`nmt.viz.visualize`, on the model's own greedy output, and stored
per layer as (H, Tq, Tk) arrays quantised to 16 bits (steps of 1/65535) and base64-encoded.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from sacrebleu.metrics import BLEU
from torch import Tensor

from nmt.atomic import atomic_write_bytes
from nmt.data.batching import TokenDataset, make_batch
from nmt.data.datasets import EvalSet, encode_texts
from nmt.data.multilingual import directions_of
from nmt.data.tokenizer import BOS_ID, EOS_ID, TokenizerPair
from nmt.decode.options import DecodeOptions
from nmt.models.base import Seq2Seq
from nmt.viz.heatmap import inline_heatmap
from nmt.viz.visualize import SentenceAttention, attend

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
QUANT = 65535  # weights are stored as round(w * QUANT) in uint16
BATCH_SENTENCES = 16
KINDS = ("cross", "enc_self", "dec_self")
DATA_MARKER = "/*NMT-EXPLORER-DATA*/"  # where the template takes the JSON document
TEMPLATE = "explorer.html"
TRAINING_PAGE = "validation.html"  # the page the trainer rewrites at every validation
STEPS_FILE = "validation_steps.jsonl"  # one validation per line, to rebuild the page on resume

_SENTENCE_BLEU = BLEU(effective_order=True)


# ----------------------------------------------------------------------------- data


def encode_weights(layers: Sequence[Tensor]) -> dict[str, Any]:
    """One kind's per-layer (H, Tq, Tk) weights -> {"shape": [L, H, Tq, Tk], "data": base64}.

    Every layer of a kind has the same shape. Values are clipped to [0, 1] and quantised to
    uint16 (little-endian), so a stored weight is within 1/131070 of the model's.
    """
    stacked = torch.stack([w.float().cpu() for w in layers]).numpy()  # (L, H, Tq, Tk)
    quantised = np.rint(np.clip(stacked, 0.0, 1.0) * QUANT).astype("<u2")
    return {
        "shape": list(stacked.shape),
        "data": base64.b64encode(quantised.tobytes()).decode("ascii"),
    }


def sentence_bleu(hypothesis: str, reference: str | None) -> float | None:
    """sacreBLEU's sentence BLEU (13a, cased, effective order); None without a reference."""
    if reference is None:
        return None
    return float(_SENTENCE_BLEU.sentence_score(hypothesis, [reference]).score)


def sentence_record(
    sent: SentenceAttention,
    tokenizers: TokenizerPair,
    source: str,
    reference: str | None = None,
) -> dict[str, Any]:
    """One sentence for the page: its text, pieces, greedy score, sentence BLEU and weights.

    ``src`` are the source pieces (EOS included), ``out`` the pieces each decoder step emits
    (the hypothesis and EOS), ``inp`` the pieces each step reads (BOS and the hypothesis).
    """
    hyp = sent.hypothesis
    hypothesis = tokenizers.tgt.decode(hyp.tokens)
    return {
        "source": source,
        "hypothesis": hypothesis,
        "reference": reference,
        "src": tokenizers.src.pieces(sent.src_ids),
        "out": tokenizers.tgt.pieces([*hyp.tokens, EOS_ID]),
        "inp": tokenizers.tgt.pieces([BOS_ID, *hyp.tokens]),
        "score": float(hyp.score),
        "bleu": sentence_bleu(hypothesis, reference),
        "maps": {k: encode_weights(sent.attention[k]) for k in KINDS if sent.attention.get(k)},
    }


def explore_sentences(
    model: Seq2Seq,
    tokenizers: TokenizerPair,
    sources: Sequence[str],
    references: Sequence[str | None] | None,
    device: torch.device,
    opts: DecodeOptions | None = None,
    data: TokenDataset | None = None,
) -> list[dict[str, Any]]:
    """Greedy-decode ``sources`` (output caps from ``opts``, see :func:`nmt.viz.visualize.attend`)
    and return one :func:`sentence_record` per sentence. ``data``: their token ids as the model
    reads them (a multilingual set's, with tags and forced first tokens); default: encoded."""
    refs = list(references) if references is not None else [None] * len(sources)
    if len(refs) != len(sources):
        raise ValueError(f"{len(sources)} sentences but {len(refs)} references")
    if data is None:
        data = encode_texts(tokenizers, list(sources), [""] * len(sources))
    records = []
    for start in range(0, len(sources), BATCH_SENTENCES):
        index = list(range(start, min(start + BATCH_SENTENCES, len(sources))))
        batch = make_batch(data, index).to(device)
        forced = None
        if data.forced is not None:
            forced = torch.from_numpy(data.forced[index]).to(device)
        decoded = attend(model, batch.src, batch.src_lens, opts, forced=forced)
        for k, sent in zip(index, decoded, strict=True):
            records.append(sentence_record(sent, tokenizers, sources[k], refs[k]))
    return records


def model_info(cfg: DictConfig, checkpoint: str | None = None) -> dict[str, Any]:
    """What the page says about the model: its name, sizes and languages."""
    m = cfg.model
    if m.arch == "transformer":
        name = (
            f"Transformer ({m.enc_layers}+{m.dec_layers} layers, {m.heads} heads, "
            f"d_model {m.d_model})"
        )
    else:
        name = f"GRU encoder-decoder with {m.attention} attention (hidden {m.hidden_dim})"
    src, tgt = str(cfg.data.src_lang), str(cfg.data.tgt_lang)
    directions = directions_of(cfg.data)
    if directions:  # a multilingual model: each sentence is marked with its direction
        src = "/".join(sorted({d.src for d in directions}))
        tgt = "/".join(sorted({d.tgt for d in directions}))
    return {"arch": str(m.arch), "name": name, "src_lang": src, "tgt_lang": tgt,
            "checkpoint": checkpoint}  # fmt: skip


def document(
    model: dict[str, Any],
    steps: Sequence[dict[str, Any]],
    title: str = "Attention explorer",
    join_words: bool = False,
) -> dict[str, Any]:
    """The page's data. ``steps``: [{"step": int or None, "note": str, "sentences": [...]}]."""
    return {
        "version": FORMAT_VERSION,
        "title": title,
        "model": model,
        "join_words": bool(join_words),
        "steps": list(steps),
    }


# ----------------------------------------------------------------------------- the page


def _script_json(doc: dict[str, Any]) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' appears raw."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(doc: dict[str, Any]) -> str:
    """The page: the template with the heatmap's script and style and the document inlined."""
    template = resources.files("nmt.viz").joinpath(TEMPLATE).read_text(encoding="utf-8")
    template = inline_heatmap(template, TEMPLATE)
    if template.count(DATA_MARKER) != 1:
        raise RuntimeError(f"{TEMPLATE}: expected one data marker {DATA_MARKER}")
    return template.replace(DATA_MARKER, _script_json(doc))


def write_html(path: Path, doc: dict[str, Any]) -> Path:
    """Write the page atomically (a reader never sees half a file)."""
    atomic_write_bytes(Path(path), render_html(doc).encode("utf-8"))
    return Path(path)


# ----------------------------------------------------------------------------- training


class TrainingExplorer:
    """The explorer of a training run's fixed validation sentences, one step per validation.

    Each validation adds its step, as one line, to ``<folder>/validation_steps.jsonl`` and
    rewrites ``<folder>/validation.html`` with every step so far (both files are replaced
    atomically). A resumed run keeps the steps up to the one it resumes from and drops the
    later ones (they belong to the interrupted future), as TensorBoard's purge_step does for
    the event files.
    """

    def __init__(self, folder: Path, model: dict[str, Any], resume_step: int = 0) -> None:
        self.folder = Path(folder)
        self.model = model
        self.steps: list[dict[str, Any]] = []
        lines_file = self.folder / STEPS_FILE
        if not lines_file.is_file():
            return
        for number, line in enumerate(lines_file.read_text(encoding="utf-8").splitlines(), 1):
            try:
                step = json.loads(line)
                keep = step["step"] <= resume_step
            except (ValueError, KeyError, TypeError) as err:
                log.warning("%s:%d: not a validation step, left out (%s)", lines_file, number, err)
                continue
            if keep:
                self.steps.append(step)
        self._rewrite_lines()

    @property
    def html_path(self) -> Path:
        return self.folder / TRAINING_PAGE

    def _rewrite_lines(self) -> None:
        text = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in self.steps)
        atomic_write_bytes(self.folder / STEPS_FILE, text.encode("utf-8"))

    def add(
        self,
        step: int,
        model: Seq2Seq,
        evalset: EvalSet,
        tokenizers: TokenizerPair,
        device: torch.device,
        n_sentences: int,
        note: str = "",
        *,
        opts: DecodeOptions,
    ) -> Path:
        """Decode the first ``n_sentences`` of ``evalset`` and rewrite the page (nothing to
        write for an empty validation set)."""
        n = min(n_sentences, len(evalset))
        if n <= 0:
            return self.html_path
        sources, refs = evalset.src_text[:n], evalset.ref_text[:n]
        data = None
        if evalset.parts:  # a multilingual set: the first n of each direction, labelled
            index = [i for _, a, b in evalset.parts for i in range(a, min(b, a + n))]
            label = {i: d for d, a, b in evalset.parts for i in range(a, b)}
            sources = [f"[{label[i]}] {evalset.src_text[i]}" for i in index]
            refs = [evalset.ref_text[i] for i in index]
            data = evalset.data.subset(index)
        records = explore_sentences(model, tokenizers, sources, refs, device, opts, data)
        self.steps = [s for s in self.steps if s["step"] != step]
        self.steps.append({"step": step, "note": note, "sentences": records})
        self.steps.sort(key=lambda s: s["step"])
        self._rewrite_lines()
        title = "Attention at each validation"
        return write_html(self.html_path, document(self.model, self.steps, title))
