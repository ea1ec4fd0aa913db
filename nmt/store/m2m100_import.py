"""Reading a Hugging Face ``M2M100ForConditionalGeneration`` folder (M2M100, and NLLB-200's
dense models, which share its architecture) into our Transformer and one joint tokenizer; the
checks of :mod:`nmt.store.hf_import` apply (nothing in the folder chooses code, every tensor is
checked by name).

**The architecture.** M2M100 is our pre-norm Transformer with a final layer norm on each stack
(``model.norm_first=true``), embeddings scaled by sqrt(d_model), fairseq's sinusoid counted from
its padding id + 1 (``model.position_style=fairseq``, the same table as transformers'), and one
embedding matrix for the source, the target and the output.

**Languages.** Every source starts with its own language's code and every output with the
target's, forced (``__de__ ... </s>``; the decoder starts from ``</s>``): our
``data.tag_placement=both``, with the codes as our language tags ``<2de>``. The run lists the
model's languages (``data.languages``) and trains or decodes any pair of them
(``data.directions=all``).

**The vocabulary keeps our special ids.** Their ids are ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2,
``<unk>`` 3, then ``vocab.json``'s pieces, the 100 language codes, and unused rows; ours are
PAD 0 (a zero row that is never output), UNK 1, BOS 2 and EOS 3, both of the latter taking
``</s>``'s row (BOS, the decoder's first input, is never output), the language tags from 4 on,
then their ``<s>`` and ``<pad>`` and every other row in their order, so the output keeps every
class of theirs. The tokenizer is their ``sentencepiece.bpe.model`` rebuilt in that order; a
piece of it that ``vocab.json`` lacks (which M2M100 reads as ``<unk>``) is kept with UNK's
embedding and is never output.

**NLLB-200** has no ``vocab.json``: its ids are the sentencepiece model's plus one (fairseq's
offset, after the four specials), and its 202 codes (``deu_Latn``) and ``<mask>`` have the ids
its ``tokenizer.json`` gives them. A language is named by its ISO 639-1 code where it has one
that no other of its languages shares (``deu_Latn`` is ``de``, our tag ``<2de>``), else by
NLLB's code (``arb_Arab``, ``zho_Hans``), so that a corpus's ``.de`` files and ``src_lang=de``
reach it. A tokenizer with ``legacy_behaviour=true`` (the source's code after ``</s>``) is
refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nmt.config import ConfigError
from nmt.data.tokenizer import (
    BOS_ID,
    PAD_ID,
    SPECIAL_PIECES,
    Tokenizer,
    TokenizerPair,
    language_tag,
)
from nmt.models.registry import create_model
from nmt.models.transformer import Transformer
from nmt.store.hf_import import (
    Imported,
    Piece,
    Vocabulary,
    field_of,
    iso_names,
    load_weights,
    model_fields,
    read_config,
    read_json_object,
    read_json_vocab,
    read_spm,
    read_weights,
    rebuilt_spm,
    refuse,
)

# M2M100's language codes (``language_codes: m2m100``), in the order of their ids
# fmt: off
M2M100_LANGUAGES = (
    "af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs", "cy",
    "da", "de", "el", "en", "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd", "gl", "gu",
    "ha", "he", "hi", "hr", "ht", "hu", "hy", "id", "ig", "ilo", "is", "it", "ja", "jv", "ka",
    "kk", "km", "kn", "ko", "lb", "lg", "ln", "lo", "lt", "lv", "mg", "mk", "ml", "mn", "mr",
    "ms", "my", "ne", "nl", "no", "ns", "oc", "or", "pa", "pl", "ps", "pt", "ro", "ru", "sd",
    "si", "sk", "sl", "so", "sq", "sr", "ss", "su", "sv", "sw", "ta", "th", "tl", "tn", "tr",
    "uk", "ur", "uz", "vi", "wo", "xh", "yi", "yo", "zh", "zu",
)
# fmt: on
SPM_FILE = "sentencepiece.bpe.model"
# the tokenizer files of an M2M100 or NLLB folder, kept with the run for its export
ORIGIN_FILES = (SPM_FILE, "vocab.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json")  # fmt: skip
# their special pieces, ids 0-3, and the ids of their specials (M2M100's and NLLB's)
THEIR_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
THEIR_BOS, THEIR_PAD, THEIR_EOS = 0, 1, 2
# the settings of an imported model beside its config's (:func:`m2m100_fields`): an export
# back to the folder's layout relies on them (nmt.ship.hf_m2m100)
M2M100_SETTINGS = {"norm_first": True, "position_style": "fairseq",
                   "frozen_output_bias": True, "embedding_aliases": True}  # fmt: skip


def m2m100_fields(config: dict[str, Any]) -> dict[str, Any]:
    """Our ``model`` config of an M2M100 config: its output bias (our classes it lacks held at
    NEVER) and the rows our BOS and its unread pieces share with other ids never trained."""
    return model_fields({"activation_function": "relu", **config}) | M2M100_SETTINGS


def languages_of(folder: Path) -> list[str]:
    """The language codes of the folder's tokenizer, in the order of their ids."""
    tokenizer = read_json_object(folder, "tokenizer_config.json")
    codes = tokenizer.get("language_codes", "m2m100")
    if codes != "m2m100":
        raise refuse(folder, f"tokenizer_config.json: language_codes={codes!r} is not read "
                     "(M2M100's m2m100 codes are)")  # fmt: skip
    return list(M2M100_LANGUAGES)


def check_special_ids(folder: Path, config: dict[str, Any]) -> int:
    """The folder's vocabulary size; their special ids checked (M2M100's and NLLB's)."""
    expected = {
        "bos_token_id": THEIR_BOS,
        "pad_token_id": THEIR_PAD,
        "eos_token_id": THEIR_EOS,
        "decoder_start_token_id": THEIR_EOS,
    }
    for key, value in expected.items():
        if field_of(config, key, int, value) != value:
            raise refuse(folder, f"config.json: {key}={config[key]} is not M2M100's {value}")
    return field_of(config, "vocab_size", int)


def layout(
    folder: Path,
    size: int,
    pieces: dict[int, str],
    codes: dict[str, int],
    named: dict[int, str],
    own: dict[str, str] | None = None,
) -> Vocabulary:
    """Our ids for a vocabulary of ``size`` rows whose ids 0-3 are ``<s> <pad> </s> <unk>``:
    ``pieces`` (their id -> a piece of the sentencepiece model), language ``codes`` (language ->
    their id) and the ``named`` rows that decode to nothing (their id -> name); any other row is
    kept as an unnamed class; ``own``: the folder's code of each language (its name else).
    See the module doc."""
    taken = set(pieces) | set(codes.values()) | {0, 1, 2, 3}
    if max(taken) >= size or len(taken) != len(pieces) + len(codes) + 4:
        raise ConfigError(f"{folder}: the tokenizer's ids do not fit the model's vocab_size="
                          f"{size} (or two pieces share an id)")  # fmt: skip
    rows_named = {0: "<m2m_s>", 1: "<m2m_pad>"} | {
        i: named.get(i, f"<m2m_row_{i}>") for i in range(4, size) if i not in taken
    }
    others = dict(sorted((rows_named | pieces).items()))  # their rows in their order
    langs = sorted(codes, key=codes.__getitem__)
    order = [*(language_tag(lang) for lang in langs), *others.values()]
    proto = read_spm(folder, SPM_FILE)
    known = set(pieces.values()) | set(SPECIAL_PIECES)
    extra = [p.piece for p in proto.pieces if p.type == Piece.NORMAL and p.piece not in known]
    rows = [2, 3, 2, 2, *(codes[lang] for lang in langs), *others]  # PAD: zeroed
    rows += [3] * len(extra)
    never = (PAD_ID, BOS_ID, *range(len(rows) - len(extra), len(rows)))
    return Vocabulary(
        src_rows=rows,
        tgt_rows=rows,
        src_proto=rebuilt_spm(proto, order, extra, frozenset(rows_named.values())),
        tgt_proto=b"",
        never=never,
        size=size,
        languages=tuple(langs),
        codes=tuple((own or {}).get(lang, lang) for lang in langs),
    )


def m2m100_vocabulary(folder: Path, config: dict[str, Any]) -> Vocabulary:
    """Our ids for an M2M100 folder (``vocab.json``, then the 100 codes)."""
    langs = languages_of(folder)
    vocab = read_json_vocab(folder)
    if [vocab.get(p) for p in THEIR_SPECIALS] != [0, 1, 2, 3]:
        raise refuse(folder, "vocab.json does not start with <s>, <pad>, </s>, <unk> (ids 0-3)")
    size = check_special_ids(folder, config)
    if size < len(vocab) + len(langs):
        raise ConfigError(f"config.json: vocab_size={size} has no room for vocab.json's "
                          f"{len(vocab)} pieces and {len(langs)} language codes")  # fmt: skip
    pieces = {i: p for p, i in vocab.items() if i >= 4}
    codes = {lang: len(vocab) + k for k, lang in enumerate(langs)}
    return layout(folder, size, pieces, codes, {})


# an NLLB-200 language code: ISO 639-3 and the script (deu_Latn)
NLLB_CODE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")


def nllb_vocabulary(folder: Path, config: dict[str, Any]) -> Vocabulary:
    """Our ids for an NLLB-200 folder: the sentencepiece model's pieces
    with fairseq's offset (piece ``i`` is their id ``i + 1``), and the language codes and
    ``<mask>`` where ``tokenizer.json`` puts them."""
    tokenizer = read_json_object(folder, "tokenizer_config.json")
    if tokenizer.get("legacy_behaviour", False) is not False:
        raise refuse(folder, "tokenizer_config.json: legacy_behaviour=true (the source language "
                     "code after </s>) is not read")  # fmt: skip
    added = read_json_object(folder, "tokenizer.json").get("added_tokens")
    if not isinstance(added, list) or not all(
        isinstance(t, dict) and isinstance(t.get("id"), int) and isinstance(t.get("content"), str)
        for t in added
    ):
        raise refuse(folder, "tokenizer.json: added_tokens is not a list of {id, content}")
    ids = {t["content"]: t["id"] for t in added}
    if [ids.get(p) for p in THEIR_SPECIALS] != [0, 1, 2, 3]:
        raise refuse(folder, "tokenizer.json: <s>, <pad>, </s>, <unk> are not ids 0-3")
    codes = {c: i for c, i in ids.items() if NLLB_CODE.fullmatch(c)}
    if len(codes) < 2:
        raise refuse(folder, "tokenizer.json names fewer than two language codes (deu_Latn)")
    named = {i: c for c, i in ids.items() if c not in codes and c not in THEIR_SPECIALS}
    proto = read_spm(folder, SPM_FILE)
    pieces = {
        i + 1: p.piece
        for i, p in enumerate(proto.pieces)
        if p.type in (Piece.NORMAL, Piece.USER_DEFINED)
    }
    size = check_special_ids(folder, config)
    names = iso_names(list(codes))
    own = {names[c]: c for c in codes}
    return layout(folder, size, pieces, {names[c]: i for c, i in codes.items()}, named, own)


def import_m2m100(folder: Path) -> Imported:
    """An M2M100 folder as our Transformer (eval mode) and its joint tokenizer (its languages
    in ``vocab.languages``); ConfigError otherwise."""
    folder = Path(folder)
    config = read_config(folder)
    if config["model_type"] != "m2m_100":
        raise refuse(folder, f"{config['model_type']} is not an M2M100 model")
    if "auto_map" in read_json_object(folder, "tokenizer_config.json"):
        raise refuse(folder, "tokenizer_config.json asks for remote code (auto_map); nothing "
                     "is run")  # fmt: skip
    fields = m2m100_fields(config)
    is_nllb = not (folder / "vocab.json").is_file() and (folder / "tokenizer.json").is_file()
    vocab = (nllb_vocabulary if is_nllb else m2m100_vocabulary)(folder, config)
    tokenizer = Tokenizer.from_proto(vocab.src_proto, origin=f"{folder}/{SPM_FILE}")
    model = create_model(
        fields, src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
        pad_id=PAD_ID, shared_vocab=True,
    )  # fmt: skip
    assert isinstance(model, Transformer) and model.embed_rows is not None
    load_weights(model, read_weights(folder), vocab, marian=False)
    model.embed_rows.copy_(torch.tensor(aliases(vocab)))
    origin = folder_origin(folder, vocab, "nllb" if is_nllb else "m2m100")
    tokenizers = TokenizerPair(src=tokenizer, tgt=tokenizer, joint=True, origin=origin)
    return Imported(model.eval(), tokenizers, fields, vocab)


def classes_of(ids: list[int], never: Sequence[int]) -> dict[int, int]:
    """Their id -> the one id of ours that is that class of theirs: the one not held at NEVER
    among ours that take its row (``ids``: their id behind each of ours). ConfigError where two
    of ours would be one class."""
    out: dict[int, int] = {}
    held = set(never)
    for ours, theirs in enumerate(ids):
        if ours not in held:
            if theirs in out:
                raise ConfigError(f"their id {theirs} is two classes of ours, {out[theirs]} and "
                                  f"{ours}")  # fmt: skip
            out[theirs] = ours
    return out


def aliases(vocab: Vocabulary) -> list[int]:
    """The embedding row each of our ids reads: its own, but for the ids held at NEVER whose
    row of theirs is another id's (our BOS reads EOS's, a piece they read as ``<unk>`` UNK's),
    so that training keeps them one row as the folder has it."""
    rows, never = vocab.src_rows, set(vocab.never)
    primary = classes_of(rows, vocab.never)
    return [primary.get(row, i) if i in never and i != PAD_ID else i for i, row in enumerate(rows)]


def folder_origin(folder: Path, vocab: Vocabulary, kind: str) -> dict[str, Any]:
    """What an export back to the folder's layout needs (``TokenizerPair.origin``): its id
    behind each of ours, its vocabulary size, its code of each language and its tokenizer's
    files as they are."""
    files = {name: (folder / name).read_bytes() for name in ORIGIN_FILES
             if (folder / name).is_file()}  # fmt: skip
    return {
        "kind": kind,
        "ids": list(vocab.src_rows),
        "never": list(vocab.never),
        "size": vocab.size,
        "codes": dict(zip(vocab.languages, vocab.codes, strict=True)),
        "files": files,
    }
