"""Watching attention: heatmaps of what a model attends to, for TensorBoard and PNG files.

Every view is computed on the model's *own* greedy output, never on the reference, so the
pictures show what the model does when it translates:

1. :func:`attend` decodes a batch greedily (keeping the per-step source attention) and
   teacher-forces the hypothesis (``tgt_in`` = BOS + hypothesis) through
   ``forward_with_attention`` to get every layer and head;
2. :func:`sentence_views` turns one sentence into named matrices with their axis labels
   (subword pieces), each row a distribution that sums to 1;
3. :func:`render_rgb` / :func:`save_png` draw a view with a colour bar and a title.

:func:`log_validation_views` does all of it for the first sentences of a validation set and
writes the images, the sample translations and attention entropies to TensorBoard.
:func:`log_hparams` records the run's hyper-parameters with its final metrics.

View names (``attention/<name>/sent<k>`` in TensorBoard, ``<name>.png`` on disk):

* ``cross``: the alignment the decoder used at each greedy step, (T + 1, S): the GRU's
  attention, the Transformer's last decoder layer averaged over heads;
* ``cross_layer<i>`` / ``cross_layer<i>_heads``: cross-attention of decoder layer ``i``,
  averaged over heads / one panel per head (multi-head models, every layer);
* ``enc_self_layer<i>_heads`` / ``dec_self_layer<i>_heads``: encoder and decoder
  self-attention, one panel per head, for the layers chosen by ``layers``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from nmt.config import ConfigError
from nmt.data.batching import make_batch
from nmt.data.datasets import EvalSet
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerPair
from nmt.decode.options import DecodeOptions
from nmt.decode.sampling import Sampling
from nmt.decode.search import Hypothesis, greedy_search, max_output_lengths
from nmt.models.base import Seq2Seq

if TYPE_CHECKING:  # matplotlib is imported where a view is drawn: a run that draws none
    # starts without it (most of a second)
    from matplotlib.figure import Figure

FONT = "DejaVu Sans"  # has the glyphs of Latin, Czech, German, French and the U+2581 marker
CMAP = "viridis"
DPI = 100  # TensorBoard images; PNG files default to more
LayerSpec = str | int | Sequence[int] | None  # see select_layers

# ----------------------------------------------------------------------------- computing


@dataclass
class SentenceAttention:
    """One sentence's greedy translation and the attention weights behind it.

    ``attention`` maps a kind to one tensor per layer, cut to the real positions:
    "cross" (H, T + 1, S), "enc_self" (H, S, S), "dec_self" (H, T + 1, T + 1), where S counts
    the source tokens with EOS and T the hypothesis tokens (queries: BOS + hypothesis).
    """

    src_ids: list[int]  # (S,) source ids, EOS included
    hypothesis: Hypothesis  # tokens (T,), attention (T + 1, S): one row per step incl. EOS
    attention: dict[str, list[Tensor]]


def teacher_input(hyps: Sequence[Hypothesis], device: torch.device) -> Tensor:
    """BOS + hypothesis tokens, right-padded: (B, T_max + 1) long."""
    width = max(len(h.tokens) for h in hyps) + 1
    tgt_in = torch.full((len(hyps), width), PAD_ID, dtype=torch.long)  # (B, T)
    tgt_in[:, 0] = BOS_ID
    for row, h in enumerate(hyps):
        tgt_in[row, 1 : len(h.tokens) + 1] = torch.tensor(h.tokens, dtype=torch.long)
    return tgt_in.to(device)


def _cut(kind: str, weights: Tensor, n_src: int, n_tgt: int) -> Tensor:
    """One sentence's (H, Tq, Tk) weights without the padded queries and keys."""
    n_query = n_src if kind == "enc_self" else n_tgt
    n_key = n_tgt if kind == "dec_self" else n_src
    return weights[:, :n_query, :n_key].float().cpu()  # (H, Tq, Tk)


@torch.inference_mode()
def attend(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    opts: DecodeOptions | None = None,
    forced: Tensor | None = None,
) -> list[SentenceAttention]:
    """Greedy-decode ``src`` (B, S) and collect every attention map of the hypotheses.

    src_lens: (B,) with EOS counted. ``opts`` (default: ``DecodeOptions()``) gives the output
    caps and ``min_output_len``; the search is greedy whatever its ``beam`` (the views follow
    one hypothesis), or samples that hypothesis when ``opts`` sample, and runs in the caller's
    precision. The model runs in eval mode and gets its mode back. ``forced`` (B,): each
    row's forced first output token (a multilingual model's target tag), or None.
    """
    opts = opts or DecodeOptions()
    was_training = model.training
    model.eval()
    try:
        caps = max_output_lengths(model, src_lens, opts)  # (B,)
        if forced is not None:
            caps = caps + (forced >= 0).to(caps.device, caps.dtype)
        hyps = greedy_search(
            model, src, src_lens, caps, BOS_ID, EOS_ID, True, min_len=opts.min_output_len,
            forced=forced, sampling=Sampling.of(opts),
        )  # fmt: skip
        tgt_in = teacher_input(hyps, src.device)  # (B, T)
        _, attn = model.forward_with_attention(src, src_lens, tgt_in)
    finally:
        model.train(was_training)
    out = []
    for row, hyp in enumerate(hyps):
        n_src, n_tgt = int(src_lens[row]), len(hyp.tokens) + 1
        cut = {
            kind: [_cut(kind, w[row], n_src, n_tgt) for w in layers]
            for kind, layers in attn.items()
        }
        out.append(SentenceAttention(src[row, :n_src].tolist(), hyp, cut))
    return out


def attention_entropy(sentences: Sequence[SentenceAttention]) -> dict[str, float]:
    """Mean entropy (nats) of the attention distributions, per kind and layer.

    Averaged over sentences, heads and query positions; keys are "cross_layer0",
    "enc_self_layer1", ... Low entropy: sharp attention; log(n_keys): uniform.
    """
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for sent in sentences:
        for kind, layers in sent.attention.items():
            for i, weights in enumerate(layers):
                rows = torch.special.entr(weights).sum(-1)  # (H, Tq)
                total[f"{kind}_layer{i}"] += float(rows.sum())
                count[f"{kind}_layer{i}"] += rows.numel()
    return {name: total[name] / max(count[name], 1) for name in sorted(total)}


# ----------------------------------------------------------------------------- views


@dataclass
class AttentionView:
    """Named attention matrices ready to draw: ``weights`` (P, Tq, Tk), one panel per head.

    Each row is the distribution of one query over the keys and sums to 1.
    """

    name: str  # "cross", "cross_layer0", "cross_layer0_heads", "enc_self_layer2_heads", ...
    weights: np.ndarray  # (P, Tq, Tk) float32
    query_labels: list[str]  # (Tq,) subword pieces of the rows
    key_labels: list[str]  # (Tk,) subword pieces of the columns
    query_axis: str
    key_axis: str
    description: str  # what the picture shows, first line of its title

    @property
    def panels(self) -> int:
        return self.weights.shape[0]


def select_layers(spec: LayerSpec, n_layers: int) -> list[int]:
    """Layer indices from "last", "all", "none", an index, a list or "0,2" (negative: from the
    end)."""
    if spec is None:
        return []
    if isinstance(spec, str):
        word = spec.strip().lower()
        if word in ("last", "all", "none", ""):
            chosen = {"last": range(n_layers)[-1:], "all": range(n_layers)}.get(word, [])
            return list(chosen)
        try:
            spec = [int(part) for part in word.split(",")]
        except ValueError:
            raise ConfigError(f"layers={word!r}: use last, all, none or indices like 0,2") from None
    picked = [int(spec)] if isinstance(spec, int) else [int(i) for i in spec]
    for i in picked:
        if not -n_layers <= i < n_layers:
            raise ConfigError(f"layers: layer {i} does not exist (the model has {n_layers})")
    return sorted({i % n_layers for i in picked})


def _single_alignment(attention: Mapping[str, list[Tensor]]) -> bool:
    """True for a model whose only attention is one single-head map (the GRU's alignment)."""
    cross = attention.get("cross", [])
    return set(attention) == {"cross"} and len(cross) == 1 and cross[0].size(0) == 1


CROSS_AXES = ("hypothesis (emitted token)", "source")
SELF_AXES = {
    "enc_self": ("source (query)", "source (key)"),
    "dec_self": ("hypothesis (query)", "hypothesis (key)"),
}
SELF_TEXT = {"enc_self": "encoder self-attention", "dec_self": "decoder self-attention"}


def _cross_view(
    name: str, weights: np.ndarray, out: list[str], src: list[str], text: str
) -> AttentionView:
    """A cross-attention view: rows are the emitted tokens, columns the source pieces."""
    return AttentionView(name, weights, out, src, *CROSS_AXES, text)


def _cross_views(maps: list[Tensor], out: list[str], src: list[str]) -> list[AttentionView]:
    """Head average and heads grid of every decoder layer's (H, T + 1, S) cross-attention."""
    views = []
    for i, w in enumerate(maps):
        text = f"cross-attention, decoder layer {i}"
        mean = w.mean(0, keepdim=True).numpy()  # (1, T + 1, S)
        views.append(_cross_view(f"cross_layer{i}", mean, out, src, f"{text}, mean of heads"))
        views.append(_cross_view(f"cross_layer{i}_heads", w.numpy(), out, src, f"{text}, by head"))
    return views


def _self_views(
    kind: str, maps: list[Tensor], tokens: list[str], layers: LayerSpec
) -> list[AttentionView]:
    """Heads grids of the chosen layers' (H, T, T) self-attention."""
    views = []
    for i in select_layers(layers, len(maps)):
        name, text = f"{kind}_layer{i}_heads", f"{SELF_TEXT[kind]}, layer {i}, by head"
        weights = maps[i].numpy()  # (H, T, T)
        views.append(AttentionView(name, weights, tokens, tokens, *SELF_AXES[kind], text))
    return views


def sentence_views(
    sent: SentenceAttention, tokenizers: TokenizerPair, layers: LayerSpec = "last"
) -> list[AttentionView]:
    """The matrices drawn for one sentence (see the module docstring for the names).

    ``layers`` picks the self-attention layers (see :func:`select_layers`);
    cross-attention is drawn for every decoder layer.
    """
    hyp = sent.hypothesis
    src = tokenizers.src.pieces(sent.src_ids)  # (S,) ends with </s>
    out = tokenizers.tgt.pieces([*hyp.tokens, EOS_ID])  # (T + 1,) the token each step emits
    inp = tokenizers.tgt.pieces([BOS_ID, *hyp.tokens])  # (T + 1,) the token each step reads
    views = []
    if hyp.attention is not None:  # (T + 1, S)
        alignment = hyp.attention[None].float().numpy()  # (1, T + 1, S)
        views.append(_cross_view("cross", alignment, out, src, "alignment at each greedy step"))
    if _single_alignment(sent.attention):
        return views
    views += _cross_views(sent.attention.get("cross", []), out, src)
    views += _self_views("enc_self", sent.attention.get("enc_self", []), src, layers)
    views += _self_views("dec_self", sent.attention.get("dec_self", []), inp, layers)
    return views


# ----------------------------------------------------------------------------- drawing


@contextmanager
def _style() -> Iterator[None]:
    from matplotlib import rc_context

    with rc_context({"font.family": "sans-serif", "font.sans-serif": [FONT]}):
        yield


def _grid_shape(panels: int) -> tuple[int, int]:
    """(rows, columns) of a near-square grid: 4 heads -> 2 x 2, 8 -> 3 x 3."""
    cols = math.ceil(math.sqrt(panels))
    return math.ceil(panels / cols), cols


def _cell_inches(view: AttentionView, rows: int, cols: int) -> float:
    """Side of one heatmap cell: big for short sentences, small enough to fit ~12 x 12 in."""
    n_query, n_key = view.weights.shape[1:]
    fit = min(12.0 / (cols * max(n_key, 1)), 12.0 / (rows * max(n_query, 1)))
    return float(np.clip(fit, 0.11, 0.3 if view.panels == 1 else 0.22))


def _label_axes(ax: Any, view: AttentionView, fontsize: float, x: bool, y: bool) -> None:
    """Tick every token with its piece on the outer sides of a grid; inner sides stay bare."""
    n_query, n_key = view.weights.shape[1:]
    if x:
        ax.set_xticks(range(n_key), view.key_labels, rotation=90, fontsize=fontsize)
        ax.set_xlabel(view.key_axis, fontsize=fontsize + 1)
    else:
        ax.set_xticks([])
    if y:
        ax.set_yticks(range(n_query), view.query_labels, fontsize=fontsize)
        ax.set_ylabel(view.query_axis, fontsize=fontsize + 1)
    else:
        ax.set_yticks([])
    ax.tick_params(length=2, pad=1)


def view_figure(view: AttentionView, title: str) -> Figure:
    """A figure of the view: one heatmap, or a grid with one panel per head; colour bar 0..1."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows, cols = _grid_shape(view.panels)
    n_query, n_key = view.weights.shape[1:]
    cell = _cell_inches(view, rows, cols)
    fontsize = float(np.clip(cell * 72 * 0.62, 5.5, 10.0))
    label_room = 0.0085 * fontsize * max(len(s) for s in [*view.query_labels, *view.key_labels])
    width = cols * n_key * cell + label_room + 1.6
    height = rows * n_query * cell + label_room + 1.0 + 0.25 * rows
    fig = Figure(figsize=(max(width, 4.5), max(height, 3.5)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for p, ax in enumerate(axes.flat):
        if p >= view.panels:
            ax.set_axis_off()
            continue
        image = ax.imshow(view.weights[p], cmap=CMAP, vmin=0.0, vmax=1.0, aspect="equal")
        last_in_column = p + cols >= view.panels
        _label_axes(ax, view, fontsize, x=last_in_column, y=p % cols == 0)
        if view.panels > 1:
            ax.set_title(f"head {p}", fontsize=fontsize + 1)
    bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=min(1.0, 4.0 / height + 0.5))
    bar.set_label("attention weight", fontsize=fontsize + 1)
    bar.ax.tick_params(labelsize=fontsize)
    fig.suptitle(title, fontsize=fontsize + 3)
    return fig


def view_title(view: AttentionView, step: int | None, index: int) -> str:
    """Two lines: what the view shows; the step and the sentence index."""
    where = f"step {step}, sentence {index}" if step is not None else f"sentence {index}"
    return f"{view.description}\n{where}"


def render_rgb(view: AttentionView, title: str, dpi: int = DPI) -> np.ndarray:
    """The drawn view as an (H, W, 3) uint8 image."""
    with _style():
        fig = view_figure(view, title)
        fig.set_dpi(dpi)
        fig.canvas.draw()
        rgba = np.asarray(fig.canvas.buffer_rgba())  # (H, W, 4)
    return rgba[..., :3].copy()


def save_png(view: AttentionView, title: str, path: str | Path, dpi: int = 120) -> Path:
    """Draw the view into a PNG file (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _style():
        view_figure(view, title).savefig(path, dpi=dpi)
    return path


# ----------------------------------------------------------------------------- TensorBoard


def _markdown(text: str) -> str:
    """Plain text that TensorBoard's markdown shows as typed (pieces like <unk> included)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\`*_[]#|":
        text = text.replace(ch, "\\" + ch)
    return text or "(empty)"


def sample_markdown(source: str, reference: str, hypothesis: str) -> str:
    """Source, reference and hypothesis as three labelled lines of markdown."""
    lines = [("source", source), ("reference", reference), ("hypothesis", hypothesis)]
    return "  \n".join(f"**{name}:** {_markdown(text)}" for name, text in lines)


def log_validation_views(
    writer: SummaryWriter,
    model: Seq2Seq,
    evalset: EvalSet,
    tokenizers: TokenizerPair,
    step: int,
    device: torch.device,
    n_sentences: int = 4,
    layers: LayerSpec = "last",
    *,
    opts: DecodeOptions,
    label: str = "",
) -> dict[str, float]:
    """Log attention heatmaps, sample translations and attention entropies of the first
    ``n_sentences`` validation sentences; returns the entropy scalars (tag -> value).
    ``label`` (a multilingual run's direction, ``de-en``) goes into every tag and title:
    ``attention/<view>/de-en/sent<k>``, ``samples/de-en/sent<k>``,
    ``attention/entropy/de-en/<kind>_layer<i>``.

    Tags (the same at every validation, so the step slider shows training progress):
    ``attention/<view>/sent<k>`` images (views: see the module docstring; ``layers`` picks
    the self-attention layers), ``samples/sent<k>`` text (torch files it under
    ``samples/sent<k>/text_summary``), ``attention/entropy/<kind>_layer<i>`` scalars for every
    layer of every kind. The sentences are decoded with ``opts``, validation's options. The
    model is put in eval mode and gets its mode back.
    """
    n = min(n_sentences, len(evalset))
    if n <= 0:
        return {}
    batch = make_batch(evalset.data, list(range(n))).to(device)
    forced = evalset.data.forced
    first = None if forced is None else torch.from_numpy(forced[:n]).to(device)
    sentences = attend(model, batch.src, batch.src_lens, opts, forced=first)
    sub = f"{label}/" if label else ""
    for k, sent in enumerate(sentences):
        for view in sentence_views(sent, tokenizers, layers):
            title = view_title(view, step, k)
            title = f"{label}: {title}" if label else title
            image = render_rgb(view, title)  # (H, W, 3)
            writer.add_image(f"attention/{view.name}/{sub}sent{k}", image, step, dataformats="HWC")
        hypothesis = tokenizers.tgt.decode(sent.hypothesis.tokens)
        text = sample_markdown(evalset.src_text[k], evalset.ref_text[k], hypothesis)
        writer.add_text(f"samples/{sub}sent{k}", text, step)
    entropy = attention_entropy(sentences).items()
    scalars = {f"attention/entropy/{sub}{k}": v for k, v in entropy}
    for tag, value in scalars.items():
        writer.add_scalar(tag, value, step)
    writer.flush()
    return scalars


HParamValue = bool | int | float | str


def flatten_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, HParamValue]:
    """Nested config -> {"model.d_model": 256, ...}; None, bools and lists become strings."""
    flat: dict[str, HParamValue] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{name}."))
        elif isinstance(value, bool) or value is None:
            flat[name] = str(value).lower()
        elif isinstance(value, (int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(list(value) if isinstance(value, Sequence) else value)
    return flat


def log_hparams(
    writer: SummaryWriter,
    cfg_dict: Mapping[str, Any],
    metrics: Mapping[str, float],
    step: int | None = None,
) -> dict[str, float]:
    """Record the flattened config with final metrics for TensorBoard's HParams tab.

    Written into the writer's own run directory (``SummaryWriter.add_hparams`` would make a
    sub-folder). Metrics are logged as scalars ``hparams/<name>`` so they never mix with the
    training curves; returns them (tag -> value).
    """
    tags = {k if k.startswith("hparams/") else f"hparams/{k}": float(v) for k, v in metrics.items()}
    experiment, start, end = hparams(flatten_config(cfg_dict), tags)
    file_writer = writer._get_file_writer()
    for summary in (experiment, start, end):
        file_writer.add_summary(summary, step)
    for tag, value in tags.items():
        writer.add_scalar(tag, value, step)
    writer.flush()
    return tags
