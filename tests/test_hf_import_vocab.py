"""Importing MarianMTModel folders whose vocabulary is not one shared list: one per side
(``vocab.json`` and ``target_vocab.json``, as the larger OPUS-MT models have), and a
multi-target model's ``>>fra<<`` codes. Made by transformers itself, small and random; our
ids, log-probabilities and greedy tokens are checked against it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from benchmarks.hf_trainer import pieces, spm_model
from nmt.config import ConfigError
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.decode.search import greedy_search
from nmt.ship.import_command import main as import_main
from nmt.store.hf_import import import_marian

from .helpers import saved_random_model
from .test_hf_import import hf_tokenizer, sentences

transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses:UserWarning"),
]


# ------------------------------------------------------------- a vocabulary for each side


@pytest.fixture(scope="module")
def marian_separate(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random MarianMTModel with a vocabulary per side (``vocab.json`` for the source,
    ``target_vocab.json`` for the target: share_encoder_decoder_embeddings=false, as the larger
    OPUS-MT models have), of different sizes, so that their pad ids differ."""
    folder = tmp_path_factory.mktemp("marian-separate")
    de = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()
    en = Path(f"{corpus}.en").read_text(encoding="utf-8").splitlines()
    source, target = spm_model(de, 150), spm_model(en, 110)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    tgt_vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces(target))}}
    tgt_vocab["<pad>"] = len(tgt_vocab)
    src_vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces(source))}}
    src_vocab["<pad>"] = len(src_vocab)
    (folder / "vocab.json").write_text(json.dumps(src_vocab), encoding="utf-8")
    (folder / "target_vocab.json").write_text(json.dumps(tgt_vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "de", "target_lang": "en", "separate_vocabs": True}
    ), encoding="utf-8")  # fmt: skip
    pad = tgt_vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(src_vocab), decoder_vocab_size=len(tgt_vocab),
        share_encoder_decoder_embeddings=False, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, activation_function="swish", max_position_embeddings=256,
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0,
        scale_embedding=True,
    )  # fmt: skip
    saved_random_model(
        transformers.MarianMTModel, config, folder, seed=2, embeddings="embed_tokens",
        output_bias=True,
    )  # fmt: skip
    return folder


def test_separate_vocabularies_give_transformers_ids_and_log_probabilities(
    marian_separate, corpus
) -> None:
    imported = import_marian(marian_separate)
    src_vocab = json.loads((marian_separate / "vocab.json").read_text())
    assert imported.vocab.src_size == len(src_vocab) and not imported.tokenizers.joint
    tok = transformers.MarianTokenizer.from_pretrained(str(marian_separate))
    src, refs = sentences(corpus)
    src_rows = torch.tensor(imported.vocab.src_rows)
    tgt_rows = torch.tensor(imported.vocab.tgt_rows)
    ours = [imported.tokenizers.src.encode(s) + [EOS_ID] for s in src]
    assert [src_rows[row].tolist() for row in ours] == tok(src)["input_ids"]
    labels = tok(text_target=refs)["input_ids"]
    ours_tgt = [imported.tokenizers.tgt.encode(r) + [EOS_ID] for r in refs]
    assert [tgt_rows[row].tolist() for row in ours_tgt] == labels
    hf = transformers.MarianMTModel.from_pretrained(str(marian_separate)).eval().double()
    model = copy.deepcopy(imported.model).double()
    tgt_ids = [[BOS_ID, *t[:-1]] for t in ours_tgt]
    s_len, t_len = max(map(len, ours)), max(map(len, tgt_ids))
    src_t = torch.tensor([s + [PAD_ID] * (s_len - len(s)) for s in ours])
    tgt_t = torch.tensor([t + [PAD_ID] * (t_len - len(t)) for t in tgt_ids])
    lens = torch.tensor([len(s) for s in ours])
    mask = torch.arange(s_len)[None] < lens[:, None]
    with torch.inference_mode():
        mine = model(src_t, lens, tgt_t).log_softmax(-1)
        out = hf(input_ids=src_rows[src_t], attention_mask=mask.long(),
                 decoder_input_ids=tgt_rows[tgt_t])  # fmt: skip
    theirs = out.logits.log_softmax(-1)
    real = torch.arange(t_len)[None] < torch.tensor([len(t) for t in tgt_ids])[:, None]
    # fp64, with each side's sinusoid table computed in fp32 its own way (as above)
    assert (mine[..., 1:] - theirs[..., tgt_rows[1:]]).abs()[real].max() < 1e-5
    hyps = greedy_search(imported.model, src_t, lens, torch.full((len(src),), 10), BOS_ID,
                         EOS_ID)  # fmt: skip
    with torch.inference_mode():
        gen = hf.float().generate(input_ids=src_rows[src_t], attention_mask=mask.long(),
                                  num_beams=1, do_sample=False, max_new_tokens=11,
                                  bad_words_ids=None)  # fmt: skip
    for hyp, row in zip(hyps, gen.tolist(), strict=True):
        body = row[1 : row.index(0)] if 0 in row[1:] else row[1:]
        assert [imported.vocab.tgt_rows[t] for t in hyp.tokens] == body


# --------------------------------------------------------- a multi-target model's >>fra<<


@pytest.fixture(scope="module")
def marian_multi(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random multi-target MarianMTModel: its vocab.json holds the target languages' codes
    (>>eng<<, >>fra<<), one of which starts each source."""
    folder = tmp_path_factory.mktemp("marian-multi")
    de = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()
    en = Path(f"{corpus}.en").read_text(encoding="utf-8").splitlines()
    source, target = spm_model(de, 150), spm_model(en, 120)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    kept = dict.fromkeys(pieces(source) + pieces(target))
    vocab = {"</s>": 0, "<unk>": 1, ">>eng<<": 2, ">>fra<<": 3}
    vocab |= {p: i + 4 for i, p in enumerate(kept)}
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "de", "target_lang": "mul"}), encoding="utf-8"
    )
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, activation_function="swish", max_position_embeddings=256,
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0,
        scale_embedding=True,
    )  # fmt: skip
    saved_random_model(transformers.MarianMTModel, config, folder, seed=3)
    return folder


def test_a_multi_target_model_is_told_its_target_by_the_code(marian_multi, corpus,
                                                             tmp_path) -> None:  # fmt: skip
    """The run translates de into en and fr (named by ISO 639-1 codes) with the target's code
    first in the source, as MarianTokenizer puts >>fra<< there and generate() decodes it."""
    from nmt.decode.engines import TorchEngine
    from nmt.decode.languages import choose_target, decode_ids_into
    from nmt.decode.options import DecodeOptions
    from nmt.store.loading import load_trained
    from nmt.store.paths import checkpoint_path

    assert import_main([str(marian_multi), "--out", str(tmp_path / "run")]) == 0
    trained = load_trained(checkpoint_path(tmp_path / "run"), torch.device("cpu"))
    assert list(trained.cfg.data.directions) == ["de-en", "de-fr"]
    rows = import_marian(marian_multi).vocab.src_rows
    tok = hf_tokenizer(marian_multi)
    hf = transformers.MarianMTModel.from_pretrained(str(marian_multi)).eval()
    src, _ = sentences(corpus)
    opts = DecodeOptions(beam=1, max_output_len_a=0.0, max_output_len_b=10)
    engine = TorchEngine(trained.model, torch.device("cpu"))
    for lang, code in (("en", ">>eng<<"), ("fr", ">>fra<<")):
        target = choose_target(trained.cfg, trained.tokenizers, lang)
        assert target.placement == "source"
        sources = trained.tokenizers.src.encode_batch(src)
        theirs = tok([f"{code} {s}" for s in src])["input_ids"]
        assert [[rows[i] for i in [target.tag, *s, EOS_ID]] for s in sources] == theirs
        hyps = decode_ids_into(engine, sources, target, opts)
        batch = tok([f"{code} {s}" for s in src], return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = hf.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=11,
                              bad_words_ids=None)  # fmt: skip
        for hyp, row in zip(hyps, out.tolist(), strict=True):
            body = row[1 : row.index(0)] if 0 in row[1:] else row[1:]
            assert [rows[t] for t in hyp.tokens] == body


def test_fine_tuning_a_multi_target_model_multilingually_is_refused(marian_multi, threeway,
                                                                   tmp_path) -> None:  # fmt: skip
    from nmt.train.command import train

    from .helpers import compose_config

    assert import_main([str(marian_multi), "--out", str(tmp_path / "run")]) == 0
    args = ["data=parallel", "data.directions=[de-en,de-fr]", f"data.train={threeway}",
            f"data.valid={threeway}", f"data.root={tmp_path / 'data'}",
            f"outputs={tmp_path / 'outputs'}", f"trainer.init_from={tmp_path / 'run'}",
            "trainer.max_steps=1"]  # fmt: skip
    with pytest.raises(ConfigError, match="a sentencepiece model per side"):
        train(compose_config("train", args), tmp_path / "tuned", args)
    assert not (tmp_path / "tuned").exists()
