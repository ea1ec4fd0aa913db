"""Watching attention: views, TensorBoard logging, hparams, the nmt-attention command and the
attention pooling demo. Models are tiny and random; sentences are a few tokens long."""

from __future__ import annotations

import gzip
import importlib.util
import io
import math
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pytest
import torch
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from nmt.config import ConfigError, GRUBahdanauConfig, TrainConfig, TransformerConfig, to_container
from nmt.data.batching import TokenDataset, make_batch
from nmt.data.datasets import EvalSet
from nmt.data.tokenizer import BOS_ID, EOS_ID, TokenizerPair, train_tokenizer
from nmt.decode.options import DecodeOptions
from nmt.decode.sampling import Sampling
from nmt.decode.search import greedy_search, max_output_lengths
from nmt.models.base import Seq2Seq
from nmt.models.registry import create_model
from nmt.store.checkpoint import save_checkpoint
from nmt.train.validation import validation_options
from nmt.viz import visualize
from nmt.viz.plot_attention import plot_attention, quote_free_text
from nmt.viz.visualize import (
    attend,
    flatten_config,
    log_hparams,
    log_validation_views,
    sample_markdown,
    select_layers,
    sentence_views,
)

from .helpers import compose_config

REPO = Path(__file__).resolve().parents[1]
PIECES = ["<pad>", "<unk>", "<s>", "</s>", "▁Ein", "▁Mann", "▁fährt", "▁Fahrrad", "."]
PIECES += ["▁Žena", "▁v", "▁červeném", "▁kabátě", "▁A", "▁man", "▁rides", "▁bike", "ß"]
VOCAB = len(PIECES)
SENTENCES = [  # (source ids, target ids): real pieces, so the labels show non-ASCII glyphs
    ([4, 5, 6, 7, 8], [13, 14, 15, 16, 8]),
    ([9, 10, 11, 12], [13, 14, 8]),
    ([4, 5, 17, 8], [13, 14, 8]),
]
TINY = {
    "gru": (GRUBahdanauConfig, dict(emb_dim=8, hidden_dim=12, attn_dim=10)),
    "transformer": (
        TransformerConfig,
        dict(d_model=16, heads=2, d_ff=32, enc_layers=2, dec_layers=2, max_positions=64),
    ),
}
TRANSFORMER_VIEWS = {
    "cross",
    "cross_layer0",
    "cross_layer0_heads",
    "cross_layer1",
    "cross_layer1_heads",
    "enc_self_layer1_heads",
    "dec_self_layer1_heads",
}


class PieceTokenizer:
    """Stands in for a sentencepiece model: ids <-> the fixed piece list above."""

    vocab_size = VOCAB

    def pieces(self, ids: list[int]) -> list[str]:
        return [PIECES[int(i)] for i in ids]

    def decode(self, ids: list[int]) -> str:
        text = "".join(PIECES[int(i)] for i in ids if int(i) > EOS_ID)
        return text.replace("▁", " ").strip()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tokenizers() -> TokenizerPair:
    fake = PieceTokenizer()
    return TokenizerPair(src=fake, tgt=fake, joint=False)  # type: ignore[arg-type]


@pytest.fixture
def evalset(tokenizers: TokenizerPair) -> EvalSet:
    src, tgt = zip(*SENTENCES, strict=True)
    return EvalSet(
        "val",
        [tokenizers.src.decode(s) for s in src],
        [tokenizers.tgt.decode(t) for t in tgt],
        TokenDataset(list(src), list(tgt)),
    )


def _views(model, src, src_lens, tokenizers, layers="last"):
    """The views of every sentence of a batch, src (B, S), src_lens (B,): one list each."""
    return [sentence_views(s, tokenizers, layers) for s in attend(model, src, src_lens)]


def build(kind: str, vocab: int = VOCAB) -> Seq2Seq:
    torch.manual_seed(0)
    schema, sizes = TINY[kind]
    return create_model(
        OmegaConf.structured(schema(**sizes)), src_vocab_size=vocab, tgt_vocab_size=vocab
    )


def read_events(logdir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(logdir), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


# -- the matrices ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gru", "transformer"])
def test_views_are_distributions_with_labels(kind: str, tokenizers, evalset) -> None:
    model = build(kind)
    batch = make_batch(evalset.data, [0, 1])
    per_sentence = _views(model, batch.src, batch.src_lens, tokenizers, layers="last")
    assert len(per_sentence) == 2
    for views in per_sentence:
        names = {v.name for v in views}
        assert names == ({"cross"} if kind == "gru" else TRANSFORMER_VIEWS)
        for v in views:
            assert v.weights.shape[1:] == (len(v.query_labels), len(v.key_labels))
            assert v.weights.min() >= 0
            rows = torch.from_numpy(v.weights).sum(-1)  # (P, Tq)
            assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5), v.name
        cross = next(v for v in views if v.name == "cross")
        assert cross.key_labels[-1] == "</s>" and cross.query_labels[-1] == "</s>"


def test_transformer_alignment_matches_teacher_forced_last_layer(tokenizers, evalset) -> None:
    """The greedy alignment equals the head-averaged last layer of the forced hypothesis."""
    batch = make_batch(evalset.data, [0])
    views = _views(build("transformer"), batch.src, batch.src_lens, tokenizers)
    by_name = {v.name: v for v in views[0]}
    assert by_name["cross"].weights == pytest.approx(by_name["cross_layer1"].weights, abs=1e-5)


def test_empty_hypothesis_gives_one_row(tokenizers, evalset) -> None:
    model = build("gru")
    with torch.no_grad():
        model.out_proj.bias[EOS_ID] = 100.0  # EOS at once
    batch = make_batch(evalset.data, [0])
    (sent,) = attend(model, batch.src, batch.src_lens)
    assert sent.hypothesis.tokens == []
    (views,) = _views(model, batch.src, batch.src_lens, tokenizers)
    assert views[0].weights.shape == (1, 1, 6) and views[0].query_labels == ["</s>"]


def test_the_views_follow_a_sampled_hypothesis_when_the_options_sample(tokenizers, evalset) -> None:
    model = build("transformer").eval()
    batch = make_batch(evalset.data, [0, 1, 2])
    opts = DecodeOptions(sampling_topk=0, sampling_seed=4)
    caps = max_output_lengths(model, batch.src_lens, opts)
    sampled = greedy_search(
        model, batch.src, batch.src_lens, caps, BOS_ID, EOS_ID, sampling=Sampling.of(opts)
    )
    views = attend(model, batch.src, batch.src_lens, opts)
    assert [v.hypothesis.tokens for v in views] == [h.tokens for h in sampled]
    assert [v.hypothesis.tokens for v in attend(model, batch.src, batch.src_lens)] != [
        h.tokens for h in sampled
    ]


def test_select_layers() -> None:
    assert select_layers("last", 3) == [2]
    assert select_layers("all", 3) == [0, 1, 2]
    assert select_layers("none", 3) == []
    assert select_layers("0,-1", 3) == [0, 2]
    assert select_layers([1], 3) == [1]
    assert select_layers(-2, 3) == [1]
    for bad in ("first", "3", [5]):
        with pytest.raises(ConfigError):
            select_layers(bad, 3)


# -- TensorBoard -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gru", "transformer"])
def test_log_validation_views(kind: str, tokenizers, evalset, tmp_path: Path) -> None:
    model = build(kind).train()
    steps = [100, 200] if kind == "gru" else [100]
    with SummaryWriter(str(tmp_path)) as writer:
        for step in steps:
            scalars = log_validation_views(
                writer, model, evalset, tokenizers, step, torch.device("cpu"), n_sentences=2,
                opts=DecodeOptions(),
            )  # fmt: skip
    assert model.training
    acc = read_events(tmp_path)
    tags = acc.Tags()
    views = {"cross"} if kind == "gru" else TRANSFORMER_VIEWS
    assert set(tags["images"]) == {f"attention/{v}/sent{k}" for v in views for k in (0, 1)}
    for tag in tags["images"]:
        events = acc.Images(tag)
        assert [e.step for e in events] == steps
        assert 300 <= events[0].width <= 2500 and 300 <= events[0].height <= 2500
    first = acc.Images("attention/cross/sent0")[0]
    png = mpimg.imread(io.BytesIO(first.encoded_image_string))  # (H, W, 3 or 4)
    assert png.shape[:2] == (first.height, first.width)
    text_tags = {f"samples/sent{k}/text_summary" for k in (0, 1)}  # torch adds /text_summary
    assert text_tags <= set(tags["tensors"])
    text = acc.Tensors("samples/sent0/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "**source:** Ein Mann fährt Fahrrad." in text and "**hypothesis:**" in text
    layer_kinds = ["cross"] if kind == "gru" else ["cross", "enc_self", "dec_self"]
    n_layers = 1 if kind == "gru" else 2
    expected = {f"attention/entropy/{k}_layer{i}" for k in layer_kinds for i in range(n_layers)}
    assert set(scalars) == expected and expected <= set(tags["scalars"])
    for tag, value in scalars.items():
        assert acc.Scalars(tag)[-1].value == pytest.approx(value, rel=1e-5)
        assert 0.0 <= value <= math.log(30)


def test_log_validation_views_caps_outputs_like_validation(
    tokenizers, evalset, tmp_path: Path, monkeypatch
) -> None:
    """The run's output cap (decode.max_output_len_a/b) holds for the logged views, as it
    does for validation."""
    model = build("gru")
    with torch.no_grad():
        model.out_proj.bias[EOS_ID] = -100.0  # never EOS: every output runs to its cap
    decoded: list[int] = []

    def recording_attend(*args, **kwargs):
        sentences = attend(*args, **kwargs)
        decoded.extend(len(s.hypothesis.tokens) for s in sentences)
        return sentences

    monkeypatch.setattr(visualize, "attend", recording_attend)
    cfg = OmegaConf.structured(TrainConfig)
    cfg.decode.max_output_len_a, cfg.decode.max_output_len_b = 0.0, 3
    opts = validation_options(cfg)
    assert (opts.beam, opts.max_output_len_a, opts.max_output_len_b) == (1, 0.0, 3)
    with SummaryWriter(str(tmp_path)) as writer:
        log_validation_views(
            writer, model, evalset, tokenizers, 1, torch.device("cpu"), n_sentences=2, opts=opts
        )
    assert decoded == [3, 3]


def test_sample_markdown_keeps_pieces_visible() -> None:
    text = sample_markdown("a <unk> b", "x*y*_z_", "")
    assert "<unk>" not in text and "&lt;unk&gt;" in text
    assert "\\*y\\*" in text and "(empty)" in text


def test_log_hparams_lands_in_the_run_dir(tmp_path: Path) -> None:
    cfg = {
        "model": {"arch": "transformer", "d_model": 16},
        "optim": {"betas": [0.9, 0.98], "lr": 1e-3},
        "trainer": {"resume": None, "compile": False},
    }
    flat = flatten_config(cfg)
    assert flat["model.d_model"] == 16 and flat["optim.betas"] == "[0.9, 0.98]"
    assert flat["trainer.resume"] == "none" and flat["trainer.compile"] == "false"
    with SummaryWriter(str(tmp_path)) as writer:
        writer.add_scalar("val/bleu", 3.0, 10)
        tags = log_hparams(writer, cfg, {"best_bleu": 12.5}, step=10)
    assert tags == {"hparams/best_bleu": 12.5}
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []  # no sub-run folder
    acc = read_events(tmp_path)
    assert acc.Scalars("hparams/best_bleu")[0].value == 12.5
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(
        acc.PluginTagToContent("hparams")
    )


# -- the nmt-attention command -----------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(multi30k: Path, tmp_path_factory) -> Path:
    """A random tiny Transformer with a real tokenizer, saved as nmt-train saves it."""
    root = tmp_path_factory.mktemp("run")
    lines = []
    for lang in ("de", "en"):
        with gzip.open(multi30k / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines += f.read().split("\n")[:200]
    tokenizer = train_tokenizer(lines, root / "spm", vocab_size=400)
    pair = TokenizerPair(tokenizer, tokenizer, joint=True)
    cfg = compose_config(
        "train",
        ["model=transformer", "model.d_model=16", "model.heads=2", "model.d_ff=32"]
        + ["model.enc_layers=1", "model.dec_layers=1"],
    )
    torch.manual_seed(0)
    model = create_model(
        cfg.model, src_vocab_size=400, tgt_vocab_size=400, pad_id=0, shared_vocab=True
    )
    config = {k: v for k, v in to_container(cfg).items() if k in ("data", "model", "optim")}
    payload = {
        "model": model.state_dict(),
        "config": {**config, "trainer": to_container(cfg.trainer)},
        "tokenizers": pair.state_dict(),
        "state": {"step": 0},
    }
    path = root / "run" / "checkpoints" / "best.pt"
    save_checkpoint(payload, path)
    return path


def test_plot_attention_writes_pngs(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "png"
    sentence = quote_free_text(["sentence=Ein Mann fährt Fahrrad."])
    overrides = [f"run={checkpoint.parent.parent}", f"out={out}", "layers=all", "dpi=50"]
    overrides += ["max_output_len_a=0.5", "max_output_len_b=2", *sentence]
    written = plot_attention(compose_config("attention", overrides))
    names = {p.name for p in written}
    assert names == {f"{v}.png" for v in ["cross", "cross_layer0", "cross_layer0_heads"]} | {
        "enc_self_layer0_heads.png",
        "dec_self_layer0_heads.png",
    }
    image = mpimg.imread(out / "sent000" / "cross.png")  # (H, W, 4) floats
    assert image.ndim == 3 and min(image.shape[:2]) > 100
    line = (out / "translations.tsv").read_text(encoding="utf-8")
    assert line.startswith("sent000\tEin Mann fährt Fahrrad.\t")


def test_nmt_attention_command_reads_a_file(checkpoint: Path, tmp_path: Path, monkeypatch):
    """The console entry point, Hydra config included; default output in the run dir."""
    from nmt.viz import plot_attention as cli

    src = tmp_path / "in.de"
    src.write_text("Zwei Hunde.\n\nEin Mädchen läuft.\n", encoding="utf-8")
    argv = ["nmt-attention", f"ckpt={checkpoint}", f"input={src}", "max_output_len_b=2"]
    monkeypatch.setattr(sys, "argv", [*argv, "layers=none", "dpi=40"])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    cli.main()
    out = checkpoint.parent.parent / "attention"
    assert len((out / "translations.tsv").read_text(encoding="utf-8").splitlines()) == 2
    assert mpimg.imread(out / "sent001" / "cross_layer0_heads.png").ndim == 3


def test_plot_attention_needs_a_sentence(checkpoint: Path) -> None:
    with pytest.raises(ConfigError, match="sentence"):
        plot_attention(compose_config("attention", [f"ckpt={checkpoint}"]))


# -- the attention pooling demo ----------------------------------------------------------------


def test_attention_pooling_demo(tmp_path: Path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location(
        "attention_pooling", REPO / "scripts" / "attention_pooling.py"
    )
    demo = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, demo)  # dataclasses look their module up
    spec.loader.exec_module(demo)
    result = demo.run(tmp_path, epochs=4)
    assert result["losses"][-1] < result["losses"][0] and result["w"] > 1.0
    mse = list(result["mse"].values())  # average, non-parametric, parametric
    assert mse[2] < mse[1] < mse[0]
    for path in result["files"]:
        assert mpimg.imread(path).ndim == 3
    _, weights = demo.attention_pooling(torch.tensor([1.0, 2.0]), torch.arange(5.0), torch.ones(5))
    assert torch.allclose(weights.sum(-1), torch.ones(2))


def test_plot_attention_draws_greedy_search_only(checkpoint: Path) -> None:
    """nmt-attention shares the decoding options; a beam other than 1 is refused by name."""
    overrides = [f"ckpt={checkpoint}", "sentence=Zwei Hunde.", "beam=2"]
    with pytest.raises(ConfigError, match="beam=2"):
        plot_attention(compose_config("attention", overrides))
    with pytest.raises(ConfigError, match="max_output_len_a=-1"):
        plot_attention(compose_config("attention", [*overrides[:2], "max_output_len_a=-1"]))
