"""Reading a pretrained Hugging Face ``MarianMTModel`` folder (the OPUS-MT models) into our
Transformer and tokenizers, to decode and fine-tune it as a model trained here.

**The folder chooses nothing.** ``config.json`` is read as JSON and every field this reads is
checked; a config that asks for code (``auto_map``) or names an architecture other than Marian
is refused in one line. Weights come from ``model.safetensors``, or from ``pytorch_model.bin``
read with ``weights_only=True``; a missing, unexpected, misshapen or non-finite tensor is
refused by name. Every refusal is a :class:`~nmt.config.ConfigError`.

**The architecture.** Marian is our post-norm Transformer (``model.norm_first=false``) with
embeddings scaled by sqrt(d_model), the sinusoid laid out sin-half then cos-half (undone by
the inverse of :func:`nmt.store.hf_names.permutation`, as the export does it), its
feed-forward activation (``swish`` in OPUS-MT) and an output bias (``final_logits_bias``).

**The vocabulary keeps our special ids.** Marian's ids are those of ``vocab.json`` (EOS 0, UNK
1, PAD last, the decoder starting from PAD, no BOS); ours are PAD 0, UNK 1, BOS 2, EOS 3 in
every model. The import renumbers the vocabulary instead of the code: our BOS takes the
decoder's start (Marian's PAD), our EOS and UNK take Marian's, the other pieces follow in
Marian's order, and our PAD is a row of zeros whose output logit is held at
:data:`NEVER` (its probability is 0 in fp32, as Marian has no such class). A folder this
project exported starts from a token of its own (our BOS) and has our ids already: it is read
back with them, its PAD a class as in the model it came from. The embedding rows,
the output projection and its bias are reordered to match. Each side's tokenizer is
Marian's sentencepiece model (``source.spm``, ``target.spm``) rebuilt with its pieces in that
order, scores and normalization unchanged, so it segments text as Marian's tokenizer does: a
piece of ``vocab.json`` that side's model lacks is kept as an unused piece (decoded, never
produced), and a piece the source model produces that ``vocab.json`` lacks (which Marian reads
as UNK) is added with UNK's embedding; without such pieces both sides' ids are the same and
the model has one embedding matrix (``model.shared_embeddings``), as Marian's. A model with a
vocabulary per side
(``share_encoder_decoder_embeddings=false``) has the target's in ``target_vocab.json``: each side
is renumbered from its own file, its own special ids included. A multi-target model's codes
(``>>fra<<`` in ``vocab.json``) become our language tags, right after our specials, named by
ISO 639-1 codes where they have one (:func:`iso_names`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sentencepiece import sentencepiece_model_pb2 as spm_pb

from nmt.config import ConfigError
from nmt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_PIECES,
    UNK_ID,
    Tokenizer,
    TokenizerPair,
    language_tag,
)
from nmt.models.registry import create_model
from nmt.models.transformer import ACTIVATIONS, Transformer
from nmt.store.hf_names import permutation, permuted, weight_slots

# the output bias of our PAD row in an imported model: exp(NEVER) is 0 in fp32 and bf16
NEVER = -1e4
ACTIVATION_NAMES = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
Piece = spm_pb.ModelProto.SentencePiece


def refuse(folder: Path, why: str) -> ConfigError:
    return ConfigError(f"{folder}: {why}")


def read_json_object(folder: Path, name: str) -> dict[str, Any]:
    """The JSON object in ``folder / name``; ConfigError naming the file otherwise."""
    try:
        data = json.loads((folder / name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise refuse(folder, f"no {name}: not a transformers model folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise refuse(folder, f"{name} cannot be read: {e}") from None
    if not isinstance(data, dict):
        raise refuse(folder, f"{name} is not a JSON object")
    return data


# the architectures read: config.json's model_type and its class
READABLE = {"marian": "MarianMTModel", "m2m_100": "M2M100ForConditionalGeneration"}


def read_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of a folder, checked: no remote code, an architecture we read."""
    config = read_json_object(folder, "config.json")
    if "auto_map" in config:
        raise refuse(folder, "config.json asks for remote code (auto_map); nothing is run")
    names = config.get("architectures") or []
    kind = READABLE.get(config.get("model_type"))  # type: ignore[arg-type]
    if kind is None or names not in ([], [kind]):
        raise refuse(
            folder,
            f"architecture {', '.join(map(str, names)) or config.get('model_type')!r} is not "
            "read: nmt-import reads MarianMTModel (OPUS-MT) and "
            "M2M100ForConditionalGeneration (M2M100, NLLB-200)",
        )
    return config


def field_of(config: Mapping[str, Any], key: str, kind: Any, default: Any = None) -> Any:
    """``config[key]`` (or ``default``) if it is a ``kind`` (a bool only where asked for)."""
    value = config.get(key, default)
    if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
        name = "number" if isinstance(kind, tuple) else kind.__name__
        raise ConfigError(f"config.json: {key}={value!r} is not a {name}")
    return value


def model_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """Our ``model`` config of a Marian config; ConfigError naming what we cannot hold."""
    sizes = {k: field_of(config, k, int) for k in (
        "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
        "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
        "max_position_embeddings",
    )}  # fmt: skip
    for ours, (a, b) in {
        "model.heads": ("encoder_attention_heads", "decoder_attention_heads"),
        "model.d_ff": ("encoder_ffn_dim", "decoder_ffn_dim"),
    }.items():
        if sizes[a] != sizes[b]:
            raise ConfigError(f"config.json: {a}={sizes[a]} and {b}={sizes[b]} differ; "
                              f"{ours} is one value for both stacks")  # fmt: skip
    given = field_of(config, "activation_function", str, "swish")
    activation = ACTIVATION_NAMES.get(given)
    if activation not in ACTIVATIONS:
        raise ConfigError(f"config.json: activation_function={given!r} is not relu, gelu or swish")
    if not field_of(config, "scale_embedding", bool, False):
        raise ConfigError("config.json: scale_embedding=false is not read (our Transformer "
                          "scales its embeddings by sqrt(d_model))")  # fmt: skip
    return {
        "arch": "transformer",
        "d_model": sizes["d_model"],
        "heads": sizes["encoder_attention_heads"],
        "d_ff": sizes["encoder_ffn_dim"],
        "enc_layers": sizes["encoder_layers"],
        "dec_layers": sizes["decoder_layers"],
        "dropout": float(field_of(config, "dropout", (int, float), 0.1)),
        "attn_dropout": float(field_of(config, "attention_dropout", (int, float), 0.0)),
        "act_dropout": float(field_of(config, "activation_dropout", (int, float), 0.0)),
        "activation": activation,
        "norm_first": False,
        "tie_embeddings": bool(field_of(config, "tie_word_embeddings", bool, True)),
        "output_bias": True,
        "learned_positions": False,
        "max_positions": sizes["max_position_embeddings"],
    }


# ------------------------------------------------------------------------------- vocabulary


@dataclass
class Vocabulary:
    """Where each of our ids comes from: ``rows[i]``, the Marian id whose embedding (and
    output row) our id ``i`` takes, per side; and each side's rebuilt sentencepiece model."""

    src_rows: list[int]
    tgt_rows: list[int]
    src_proto: bytes
    tgt_proto: bytes
    # our target ids the model never outputs (their logit held at NEVER): PAD, and ids whose
    # row copies another one's (our BOS where it is the model's EOS, pieces read as UNK)
    never: tuple[int, ...] = (PAD_ID,)
    size: int = 0  # the model's (target) vocabulary: rows of its embedding; 0: max(tgt_rows) + 1
    src_size: int = 0  # rows of its source embedding; 0: as the target's
    languages: tuple[str, ...] = ()  # the languages of its tags, in the order of their ids
    codes: tuple[str, ...] = ()  # the folder's own code of each (NLLB's deu_Latn), if it differs


def read_json_vocab(folder: Path, name: str = "vocab.json") -> dict[str, int]:
    vocab = read_json_object(folder, name)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in vocab.values()):
        raise refuse(folder, f"{name} is not an object of pieces to ids")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise refuse(folder, f"{name}'s ids are not 0 .. its size - 1, each once")
    return vocab


def read_spm(folder: Path, name: str) -> spm_pb.ModelProto:
    proto = spm_pb.ModelProto()
    try:
        proto.ParseFromString((folder / name).read_bytes())
    except OSError as e:
        raise refuse(folder, f"{name} cannot be read: {e}") from None
    except Exception as e:  # protobuf's DecodeError
        raise refuse(folder, f"{name} is not a sentencepiece model ({e})") from None
    return proto


def rebuilt_spm(
    proto: spm_pb.ModelProto,
    order: list[str],
    extra: list[str],
    control: frozenset[str] = frozenset(),
) -> bytes:
    """``proto`` with pieces ``order`` (our specials first) then ``extra``: the model's own
    pieces keep their score and type, those it lacks are unused (decoded, never produced), or
    control pieces where named in ``control`` (never produced, decoded as nothing)."""
    own = {
        p.piece: p for p in proto.pieces if p.type in (Piece.NORMAL, Piece.USER_DEFINED, Piece.BYTE)
    }
    out = spm_pb.ModelProto()
    out.CopyFrom(proto)
    del out.pieces[:]
    kinds = [Piece.CONTROL, Piece.UNKNOWN, Piece.CONTROL, Piece.CONTROL]
    for piece, kind in zip(SPECIAL_PIECES, kinds, strict=True):
        out.pieces.add(piece=piece, score=0.0, type=kind)
    for piece in [*order, *extra]:
        if piece in own:
            out.pieces.add().CopyFrom(own[piece])
        else:
            kind = Piece.CONTROL if piece in control else Piece.UNUSED
            out.pieces.add(piece=piece, score=0.0, type=kind)
    spec = out.trainer_spec
    spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    for field, piece in zip(("pad_piece", "unk_piece", "bos_piece", "eos_piece"),
                            SPECIAL_PIECES, strict=True):  # fmt: skip
        setattr(spec, field, piece)
    spec.vocab_size = len(out.pieces)
    return out.SerializeToString()


# a multi-target OPUS-MT model's target-language code, first in the source: >>fra<<
MARIAN_CODE = re.compile(r">>([a-z]{2,3}(?:_[A-Za-z]{4})?)<<")


def _side(
    vocab: dict[str, int], ids: tuple[int, int, int, int], codes: dict[str, str]
) -> tuple[list[str], list[int]]:
    """A side's pieces after our specials, in Marian's order, and the Marian id behind each of
    our ids: ``ids`` are its pad, unk, decoder start and eos, which our PAD (its row zeroed
    later), UNK, BOS and EOS take. The language ``codes`` (piece -> our language name) come
    first, as our tags."""
    by_id = sorted(vocab, key=vocab.__getitem__)
    order = [p for p in by_id if vocab[p] not in ids and p not in codes]
    tags = [p for p in by_id if p in codes]
    rows = [*ids, *(vocab[p] for p in tags), *(vocab[p] for p in order)]
    return [language_tag(codes[p]) for p in tags] + order, rows


def separate_vocabularies(config: Mapping[str, Any]) -> bool:
    """Whether the model has a vocabulary per side (``vocab.json`` and ``target_vocab.json``)."""
    return not field_of(config, "share_encoder_decoder_embeddings", bool, True)


def vocabulary(folder: Path, config: Mapping[str, Any]) -> Vocabulary:
    """Our ids for a Marian folder's vocabulary, one shared by both sides or one per side;
    see the module doc."""
    src_vocab = read_json_vocab(folder)
    separate = separate_vocabularies(config)
    tgt_vocab = read_json_vocab(folder, "target_vocab.json") if separate else src_vocab
    pad, eos = field_of(config, "pad_token_id", int), field_of(config, "eos_token_id", int)
    start = field_of(config, "decoder_start_token_id", int, pad)
    unk = tgt_vocab.get("<unk>")
    where = "target_vocab.json" if separate else "vocab.json"
    if unk is None or not {pad, eos, start} <= set(tgt_vocab.values()):
        raise refuse(folder, f"{where} and config.json disagree on <unk>, pad, eos or the "
                      "decoder's start")  # fmt: skip
    # a multi-target model's codes (one vocabulary): our tags, named by ISO 639-1 codes
    found = {} if separate else {
        p: m.group(1) for p in src_vocab if (m := MARIAN_CODE.fullmatch(p))
    }  # fmt: skip
    names = iso_names(list(found.values()))
    codes = {p: names[code] for p, code in found.items()}
    order, rows = _side(tgt_vocab, (pad, unk, start, eos), codes)
    src_order, src_rows = order, rows
    if separate:  # the source's own ids of its specials
        s_pad, s_eos, s_unk = (src_vocab.get(p) for p in ("<pad>", "</s>", "<unk>"))
        if s_pad is None or s_eos is None or s_unk is None:
            raise refuse(folder, "vocab.json lacks <pad>, </s> or <unk>")
        src_order, src_rows = _side(src_vocab, (s_pad, s_unk, s_pad, s_eos), {})
    src_unk = src_rows[UNK_ID]
    src, tgt = read_spm(folder, "source.spm"), read_spm(folder, "target.spm")
    named = set(src_vocab) | set(SPECIAL_PIECES)
    extra = [p.piece for p in src.pieces if p.type == Piece.NORMAL and p.piece not in named]
    return Vocabulary(
        src_rows=src_rows + [src_unk] * len(extra),
        tgt_rows=rows,
        src_proto=rebuilt_spm(src, src_order, extra),
        tgt_proto=rebuilt_spm(tgt, order, []),
        src_size=len(src_vocab) if separate else 0,
        languages=tuple(codes[p] for p in sorted(codes, key=src_vocab.__getitem__)),
        # OPUS-MT starts from pad, which our BOS then takes: our PAD is a class it lacks
        never=(PAD_ID,) if start == pad else (),
    )


def iso_names(codes: list[str]) -> dict[str, str]:
    """Each language code's name in the run: its ISO 639-1 code where it has one that no other
    of ``codes`` has (NLLB's ``deu_Latn`` and OPUS-MT's ``deu`` are ``de``), else the code
    itself (``arb_Arab``, an individual language of Arabic; ``zho_Hans`` and ``zho_Hant``, one
    language in two scripts). A two-letter code is its own name."""
    try:
        import pycountry
    except ImportError:
        raise ConfigError(
            "importing a model's language codes names them by ISO 639-1 codes through "
            "pycountry: pip install 'nmt[hf]'"
        ) from None
    two: dict[str, str | None] = {}
    for code in codes:
        base = code.split("_")[0]
        found = pycountry.languages.get(alpha_3=base) if len(base) == 3 else None
        two[code] = base if len(base) == 2 else getattr(found, "alpha_2", None)
    count = Counter(v for v in two.values() if v)
    return {c: v if v and count[v] == 1 else c for c, v in two.items()}


# ---------------------------------------------------------------------------------- weights


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors, from safetensors or a weights-only PyTorch file."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        try:
            return load_file(str(folder / "model.safetensors"))
        except Exception as e:  # safetensors raises its own SafetensorError
            raise refuse(folder, f"model.safetensors cannot be read: {e}") from None
    if (folder / "pytorch_model.bin").is_file():
        try:
            state = torch.load(folder / "pytorch_model.bin", map_location="cpu",
                               weights_only=True)  # fmt: skip
        except Exception as e:  # an unpickling error names what was refused
            raise refuse(folder, f"pytorch_model.bin cannot be read safely: {e}") from None
        if isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values()):
            return state
        raise refuse(folder, "pytorch_model.bin is not a mapping of names to tensors")
    raise refuse(folder, "no model.safetensors or pytorch_model.bin")


# the tensors whose rows are the vocabulary's, and the side whose ids they take
VOCABULARY_ROWS = {
    "model.shared.weight": "src",
    "model.encoder.embed_tokens.weight": "src",
    "model.decoder.embed_tokens.weight": "tgt",
    "lm_head.weight": "tgt",
}


def load_weights(
    model: Transformer, theirs: dict[str, torch.Tensor], vocab: Vocabulary, marian: bool = True
) -> None:
    """Copy ``theirs`` into ``model``: features un-permuted (Marian and M2M100 keep the
    sinusoid's sines in the first half), vocabulary rows in our order, the output bias
    (``final_logits_bias``, which only Marian has) with :data:`NEVER` where ``vocab.never``
    says."""
    slots = weight_slots(model, pre_norm=not marian)
    known = set(slots) | ({"final_logits_bias"} if marian else set())
    unexpected = sorted(k for k in theirs if k not in known and ".embed_positions." not in k)
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ConfigError(f"weights: unexpected tensor {unexpected[0]}{more}")
    # tied embeddings are saved under one of their names (the output projection too, if tied):
    # with one vocabulary any of the four, with one per side a side's own
    tied_output = model.out_proj.weight is model.tgt_embed.weight
    names = {
        "src": ["model.shared.weight", "model.encoder.embed_tokens.weight"],
        "tgt": ["model.decoder.embed_tokens.weight"] + ["lm_head.weight"] * tied_output,
    }
    if vocab.src_size == 0:  # one vocabulary
        names = {"src": [*names["src"], *names["tgt"]], "tgt": [*names["tgt"], *names["src"]]}
    inverse = torch.argsort(permutation(model.d_model))
    rows = {"src": torch.tensor(vocab.src_rows), "tgt": torch.tensor(vocab.tgt_rows)}
    size = vocab.size or max(vocab.tgt_rows) + 1  # their (target) vocabulary
    sizes = {"src": vocab.src_size or size, "tgt": size}
    with torch.no_grad():
        for name, (ours, kind) in slots.items():
            side = VOCABULARY_ROWS.get(name)
            kin = names[side] if side is not None and name in names[side] else []
            tensor = theirs.get(name, next((theirs[n] for n in kin if n in theirs), None))
            if tensor is None:
                raise ConfigError(f"weights: missing tensor {name}")
            if not torch.isfinite(tensor).all():
                raise ConfigError(f"weights: {name} holds values that are not finite")
            value = tensor.float()
            if side is not None:
                if value.dim() != 2 or value.size(0) != sizes[side]:
                    raise ConfigError(f"weights: {name} is {tuple(value.shape)}, not "
                                      f"{sizes[side]} rows of the vocabulary")  # fmt: skip
                value = value.index_select(0, rows[side])
            value = permuted(value, kind, inverse)
            if value.shape != ours.shape:
                raise ConfigError(f"weights: {name} is {tuple(tensor.shape)}, the config "
                                  f"makes it {tuple(ours.shape)}")  # fmt: skip
            ours.copy_(value)
        bias = theirs.get("final_logits_bias", None if marian else torch.zeros(size))
        if bias is None or bias.numel() != size:
            raise ConfigError("weights: final_logits_bias is missing or of the wrong size")
        if not torch.isfinite(bias).all():
            raise ConfigError("weights: final_logits_bias holds values that are not finite")
        if model.out_proj.bias is None:  # a bias of zeros, and no class held at NEVER
            if bool(bias.any()) or vocab.never:
                raise ConfigError("weights: final_logits_bias is not zero, the config has none")
        else:
            model.out_proj.bias.copy_(bias.reshape(-1).float().index_select(0, rows["tgt"]))
            model.out_proj.bias[list(vocab.never)] = NEVER
        if PAD_ID in vocab.never:  # our PAD, a class they lack: a row of zeros
            model.tgt_embed.weight[PAD_ID].zero_()
            model.src_embed.weight[PAD_ID].zero_()


@dataclass
class Imported:
    model: Transformer
    tokenizers: TokenizerPair
    fields: dict[str, Any]  # our model config
    vocab: Vocabulary  # the Marian id behind each of ours


def start_forbidden(folder: Path, config: Mapping[str, Any]) -> bool:
    """Whether the folder's generation config never outputs the decoder's start token
    (``bad_words_ids``: a folder this project exported from a model with
    ``model.suppress_start``)."""
    if not (folder / "generation_config.json").is_file():
        return False
    banned = read_json_object(folder, "generation_config.json").get("bad_words_ids") or []
    start = field_of(config, "decoder_start_token_id", int, field_of(config, "pad_token_id", int))
    return isinstance(banned, list) and [start] in banned


def import_marian(folder: Path) -> Imported:
    """A Marian folder as our Transformer (eval mode) and tokenizers; ConfigError otherwise."""
    folder = Path(folder)
    config = read_config(folder)
    if config["model_type"] != "marian":
        raise refuse(folder, f"{config['model_type']} is not a MarianMTModel")
    fields = model_fields(config)
    vocab = vocabulary(folder, config)
    # one vocab.json for both sides, every source piece in it: one matrix, as in transformers
    fields["shared_embeddings"] = fields["tie_embeddings"] and vocab.src_rows == vocab.tgt_rows
    # transformers' Marian never outputs pad, where the decoder starts: our BOS
    fields["suppress_start"] = PAD_ID in vocab.never or start_forbidden(folder, config)
    weights = read_weights(folder)
    bias = weights.get("final_logits_bias")
    # an output bias where the model has one, or needs NEVER (a folder this project exported
    # from a model without one has a bias of zeros and a class of its own for PAD)
    fields["output_bias"] = bool(vocab.never) or bias is None or bool(bias.any())
    sizes = {"vocab_size": (vocab.src_size or max(vocab.tgt_rows) + 1, "vocab.json")}
    if vocab.src_size:
        sizes["decoder_vocab_size"] = (max(vocab.tgt_rows) + 1, "target_vocab.json")
    for key, (pieces, name) in sizes.items():
        if field_of(config, key, int) != pieces:
            raise ConfigError(f"config.json: {key}={config[key]} but {name} has {pieces} "
                              "pieces")  # fmt: skip
    tokenizers = TokenizerPair(
        src=Tokenizer.from_proto(vocab.src_proto, origin=f"{folder}/source.spm"),
        tgt=Tokenizer.from_proto(vocab.tgt_proto, origin=f"{folder}/target.spm"),
        joint=False,
    )
    model = create_model(
        fields, src_vocab_size=tokenizers.src.vocab_size,
        tgt_vocab_size=tokenizers.tgt.vocab_size, pad_id=PAD_ID, shared_vocab=False,
    )  # fmt: skip
    assert isinstance(model, Transformer)
    load_weights(model, weights, vocab)
    return Imported(model.eval(), tokenizers, fields, vocab)
