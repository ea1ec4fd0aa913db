"""Random M2M100 and NLLB-200 folders made by transformers itself (small, with their own
sentencepiece model and tokenizer files), for the import and export tests."""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm

from .helpers import QUIET_TINY_RUN, saved_random_model

DROPPED = 3  # pieces of the sentencepiece model left out of vocab.json: read as <unk>
LANGS = ("de", "en", "fr")
NLLB_LANGS = {"de": "deu_Latn", "en": "eng_Latn", "fr": "fra_Latn"}


def make_m2m100(threeway: Path, folder: Path) -> Path:
    """A random M2M100 model (relu, pre-norm) with M2M100Tokenizer's files in ``folder``."""
    import transformers

    lines = [ln for lang in LANGS for ln in Path(f"{threeway}.{lang}").read_text().splitlines()]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, vocab_size=180, model_type="bpe",
        character_coverage=1.0, minloglevel=2, num_threads=1,
    )  # fmt: skip
    (folder / "sentencepiece.bpe.model").write_bytes(out.getvalue())
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(out.getvalue())
    pieces = [sp.IdToPiece(i) for i in range(3, sp.GetPieceSize() - DROPPED)]
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab |= {p: i + 4 for i, p in enumerate(pieces)}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "M2M100Tokenizer", "language_codes": "m2m100",
        "num_madeup_words": 8, "src_lang": "de", "tgt_lang": "en",
    }), encoding="utf-8")  # fmt: skip
    config = transformers.M2M100Config(
        vocab_size=len(vocab) + 100 + 8, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, activation_function="relu", max_position_embeddings=256,
        scale_embedding=True, dropout=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2,
    )  # fmt: skip
    saved_random_model(transformers.M2M100ForConditionalGeneration, config, folder, seed=0)
    return folder


def make_nllb(m2m100: Path, folder: Path, scratch: Path) -> Path:
    """A random NLLB-200 model in ``folder``: M2M100's architecture with NllbTokenizer (the
    sentencepiece model of ``m2m100`` with fairseq's offset, the 202 codes and <mask> in
    tokenizer.json)."""
    import transformers
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    model = (m2m100 / "sentencepiece.bpe.model").read_bytes()
    (scratch / "sentencepiece.bpe.model").write_bytes(model)
    tok = transformers.NllbTokenizer.from_pretrained(
        str(scratch), src_lang="deu_Latn", tgt_lang="eng_Latn",
        extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES),
    )  # fmt: skip
    tok.save_pretrained(folder)
    (folder / "sentencepiece.bpe.model").write_bytes(model)
    base = transformers.M2M100ForConditionalGeneration.from_pretrained(str(m2m100)).config
    config = transformers.M2M100Config(**{**base.to_dict(), "vocab_size": len(tok)})
    saved_random_model(transformers.M2M100ForConditionalGeneration, config, folder, seed=1)
    return folder


def fine_tune_args(
    threeway: Path, tmp_path: Path, init_from: str, steps: int, directions: str = "[de-en]"
) -> list[str]:
    """A fine-tuning run of ``steps`` updates from ``init_from`` on ``threeway``."""
    return [
        "data=parallel", f"data.directions={directions}", f"data.train={threeway}",
        f"data.valid={threeway}", f"data.test=[{threeway}]", f"data.root={tmp_path / 'data'}",
        f"outputs={tmp_path / 'outputs'}", f"trainer.init_from={init_from}",
        f"trainer.max_steps={steps}", f"trainer.val_every={steps}", "trainer.val_sentences=4",
        *QUIET_TINY_RUN,
    ]  # fmt: skip
