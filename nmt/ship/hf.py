"""Converting the Transformer to Hugging Face ``transformers`` (``nmt-export --format hf``).

The converted model is one of the architectures ``transformers`` ships, so it loads with
``AutoModelForSeq2SeqLM.from_pretrained`` and no custom code:

* post-norm -> ``MarianMTModel``: post-norm layers, sinusoidal positions, separate source and
  target embeddings when asked (``share_encoder_decoder_embeddings``);
* pre-norm -> ``PegasusForConditionalGeneration``: pre-norm layers with a final layer norm after
  each stack (our ``enc_norm`` / ``dec_norm``), the same sinusoid, one vocabulary size.

Both compute the sinusoid with Vaswani's frequencies but lay it out sin-half then cos-half,
where ours interleaves sin and cos (:func:`nmt.models.transformer.sinusoidal_positions`). One
fixed permutation of the model dimension, :func:`permutation`, turns our table into theirs;
applied to every weight that reads or writes the residual stream (token embeddings, the input
side of the query/key/value and first feed-forward projections, the output side of the
attention output and second feed-forward projections, every layer norm, the input side of the
output projection) it gives the same function, since layer norm, residual sums and the
position-wise sub-layers commute with a permutation of features.

Settings that would change the function are written explicitly: embeddings scaled by
sqrt(d_model), the feed-forward activation (relu, gelu or swish), layer-drop 0, the output
projection's bias as ``final_logits_bias`` (zero where it has none), layer norm epsilon 1e-5,
our pad/BOS/EOS ids with BOS as ``decoder_start_token_id``, the position limit.
What cannot be expressed is refused with the reason (:func:`check_exportable`).

The tokenizer is ``MarianTokenizer`` over our sentencepiece model(s), with a vocabulary file
that maps every piece to its sentencepiece id, so its ids are ours; see :func:`write_tokenizer`.

A multilingual model names its languages by Marian-style codes: ``>>fr<<`` is the name its tag
piece (``<2fr>``) takes in the exported vocabulary. The tags are added (special) tokens of the
tokenizer that keep their ids and take the space after them, so that ``">>fr<< Ein Hund."``
gives our ids for ``Ein Hund.`` after the tag. Where the tag goes follows the run's
``data.tag_placement``:

* ``source``: Marian's convention, the target language's code first in the source text;
* ``target``: the convention of M2M100 and NLLB, the target language's code as the first output
  token, ``generate(..., forced_bos_token_id=tok.convert_tokens_to_ids(">>fr<<"))``, and first
  in the text of a label (``text_target=">>fr<< A dog."``) for training;
* ``both``: as ``target``, and the source text starts with its own language's code.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from nmt.config import ConfigError
from nmt.data.multilingual import directions_of, placement_of, target_languages
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_PIECES, UNK_ID, TokenizerPair
from nmt.store.hf_names import permutation, permuted, weight_slots

if TYPE_CHECKING:  # `import nmt.ship.hf` needs neither PyTorch nor transformers
    import torch

    from nmt.models.transformer import Transformer

MISSING_EXTRA = (
    "--format hf needs Hugging Face transformers, which is not installed: pip install 'nmt[hf]'"
)
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json")


def require() -> Any:
    """The ``transformers`` module, or a ConfigError saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(MISSING_EXTRA) from None
    return transformers


def refusal(cfg: DictConfig, src_vocab: int, tgt_vocab: int) -> str | None:
    """Why the model of ``cfg`` (with these vocabulary sizes) cannot be converted, or None."""
    m = cfg.model
    if m.arch != "transformer":
        return (
            f"--format hf: model.arch={m.arch!r} cannot be exported: transformers has no "
            "recurrent (GRU with Bahdanau attention) sequence-to-sequence model to hold it; "
            "only the Transformer converts (this model ships with --format torch)"
        )
    if m.learned_positions:
        return (
            "--format hf: model.learned_positions=true cannot be exported: Marian and Pegasus "
            "compute their own sinusoidal position table and load no learned one "
            "(this model ships with --format torch or ctranslate2)"
        )
    if m.get("position_style", "vaswani") != "vaswani":
        return (
            f"--format hf: model.position_style={m.position_style} cannot be exported: Marian "
            "and Pegasus compute Vaswani's sinusoid from position 0, and only a run imported "
            "from M2M100 or NLLB (its checkpoint, which keeps the folder's layout) goes back "
            "to M2M100 (this model ships with --format torch or ctranslate2)"
        )
    if m.norm_first and src_vocab != tgt_vocab:
        return (
            f"--format hf: a pre-norm model with vocabularies of {src_vocab} and {tgt_vocab} "
            "pieces cannot be exported: Pegasus, the pre-norm architecture of transformers, has "
            "one vocabulary size for both sides (train with data.joint_vocab=true or equal "
            "data.vocab_size, or model.norm_first=false for Marian)"
        )
    return None


def check_exportable(cfg: DictConfig, tokenizers: TokenizerPair) -> None:
    """ConfigError (one line, the reason) unless the model of ``cfg`` converts exactly."""
    why = refusal(cfg, tokenizers.src.vocab_size, tokenizers.tgt.vocab_size)
    if why is not None:
        raise ConfigError(why)


# ----------------------------------------------------------------------------------- weights


def architecture(model: Transformer) -> str:
    """The transformers class that holds ``model``: Pegasus (pre-norm) or Marian (post-norm)."""
    norm_first = model.encoder_layers[0].norm_first
    return "PegasusForConditionalGeneration" if norm_first else "MarianMTModel"


def _embeddings_shared(model: Transformer) -> bool:
    """Whether one matrix is the source embedding, the target embedding and the projection."""
    return model.src_embed.weight is model.tgt_embed.weight is model.out_proj.weight


def stack_fields(model: Transformer) -> dict[str, Any]:
    """The config fields of ``model``'s stacks, the same for every transformers class that
    holds it (Marian, Pegasus, M2M100): widths, depths, heads, activation, dropouts, the
    position limit and the embedding scale."""
    layer = model.encoder_layers[0]
    return {
        "d_model": model.d_model,
        "encoder_layers": len(model.encoder_layers),
        "decoder_layers": len(model.decoder_layers),
        "encoder_ffn_dim": layer.linear1.out_features,
        "decoder_ffn_dim": layer.linear1.out_features,
        "encoder_attention_heads": model.heads,
        "decoder_attention_heads": model.heads,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "activation_function": layer.activation,  # relu, gelu or swish: transformers' names
        "dropout": layer.dropout.p,
        "attention_dropout": layer.self_attn.dropout,
        "activation_dropout": layer.act_dropout.p,
        "max_position_embeddings": model.max_positions,
        "scale_embedding": True,  # sqrt(d_model), as Transformer._embed
        "is_encoder_decoder": True,
        "use_cache": True,
    }


def hf_config(model: Transformer) -> Any:
    """The transformers config (Marian or Pegasus) of ``model``."""
    transformers = require()
    shared = _embeddings_shared(model)
    tied = model.tgt_embed.weight is model.out_proj.weight
    common = {
        "vocab_size": model.src_embed.num_embeddings,
        **stack_fields(model),
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "decoder_start_token_id": BOS_ID,  # our decoder input starts with BOS
        "forced_eos_token_id": EOS_ID,  # at the length cap EOS closes the output, as ours
    }
    if architecture(model) == "MarianMTModel":
        return transformers.MarianConfig(
            **common,
            decoder_vocab_size=model.tgt_embed.num_embeddings,
            share_encoder_decoder_embeddings=shared,
            tie_word_embeddings=tied,
        )
    # Pegasus ties all of its embeddings or none: untied, each is written out
    return transformers.PegasusConfig(**common, tie_word_embeddings=shared)


def hf_weights(model: Transformer, pre_norm: bool) -> dict[str, torch.Tensor]:
    """Our weights under the transformers names, permuted (see :func:`permutation`).

    Position tables are left out: Marian and Pegasus compute their own."""
    import torch

    perm = permutation(model.d_model)
    out = {
        name: permuted(t, kind, perm) for name, (t, kind) in weight_slots(model, pre_norm).items()
    }
    bias = model.out_proj.bias
    out["final_logits_bias"] = (
        torch.zeros(1, model.out_proj.out_features) if bias is None else bias[None]
    )
    return {k: v.detach().float().contiguous().clone() for k, v in out.items()}


def convert_model(model: Transformer) -> Any:
    """The transformers model holding ``model``'s function (eval mode, float32)."""
    import torch

    transformers = require()
    config = hf_config(model)
    cls = getattr(transformers, architecture(model))
    with torch.device("cpu"):
        hf = cls(config).float().eval()
    load_into(hf, hf_weights(model, pre_norm=architecture(model) != "MarianMTModel"))
    return hf


def load_into(hf: Any, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` into the transformers model ``hf``, every one of its tensors but the
    position tables named once; ConfigError otherwise."""
    import torch

    theirs = hf.state_dict()
    unknown = sorted(set(weights) - set(theirs))
    if "model.shared.weight" in unknown:  # Marian with separate embeddings has none
        weights.pop("model.shared.weight")
        unknown.remove("model.shared.weight")
    unset = sorted(k for k in set(theirs) - set(weights) if ".embed_positions." not in k)
    if unknown or unset:
        raise ConfigError(f"--format hf: names do not match: {unknown or unset}")
    with torch.no_grad():
        for name, tensor in weights.items():
            if theirs[name].shape != tensor.shape:
                raise ConfigError(f"--format hf: {name} is {tuple(theirs[name].shape)} there")
            theirs[name].copy_(tensor)  # tied parameters receive the same values


# --------------------------------------------------------------------------------- tokenizer


def marian_code(lang: str) -> str:
    """The token that names ``lang`` as the target language in Marian's convention."""
    return f">>{lang}<<"


def code_languages(cfg: DictConfig) -> list[str]:
    """The languages whose codes a multilingual model reads, sorted: those it translates into,
    and at ``both`` placement those it translates from (none for a bilingual model)."""
    directions = directions_of(cfg.data)
    langs = set(target_languages(cfg.data))
    if placement_of(cfg.data) == "both":
        langs |= {d.src for d in directions}
    return sorted(langs)


def language_codes(cfg: DictConfig, tokenizer: Any) -> dict[int, str]:
    """Tag id -> Marian code of each language in :func:`code_languages`."""
    return {tokenizer.tags[lang]: marian_code(lang) for lang in code_languages(cfg)}


def forces_first(cfg: DictConfig) -> bool:
    """Whether the model's first output token is the target language's tag (``target`` and
    ``both`` placement), which ``generate`` takes as ``forced_bos_token_id``."""
    return bool(directions_of(cfg.data)) and placement_of(cfg.data) != "source"


def piece_vocabulary(tokenizer: Any, codes: dict[int, str] | None = None) -> dict[str, int]:
    """Every sentencepiece piece to its id, a tag under its Marian code (``codes``):
    MarianTokenizer looks ids up here, so they are sentencepiece's (pieces are unique within a
    model)."""
    sp, codes = tokenizer._sp, codes or {}
    vocab = {codes.get(i, sp.IdToPiece(i)): i for i in range(sp.GetPieceSize())}
    if len(vocab) != sp.GetPieceSize():
        raise ConfigError("--format hf: the sentencepiece model has repeated pieces")
    return vocab


def write_tokenizer(tokenizers: TokenizerPair, out: Path, cfg: DictConfig, max_len: int) -> None:
    """``MarianTokenizer`` files into ``out``: source.spm, target.spm (the same model for one
    joint vocabulary), vocab.json (and target_vocab.json for two vocabularies), its config.

    It encodes as ours: the pieces of sentencepiece (our models normalize nothing), EOS
    appended, no BOS; and decodes as ours, through sentencepiece's decoder."""
    transformers = require()
    codes = language_codes(cfg, tokenizers.src)
    with tempfile.TemporaryDirectory(prefix=".hf-tokenizer.", dir=out) as scratch:
        tmp = Path(scratch)
        (tmp / "source.spm").write_bytes(tokenizers.src.proto)
        (tmp / "target.spm").write_bytes(tokenizers.tgt.proto)
        src_vocab = piece_vocabulary(tokenizers.src, codes)
        (tmp / "vocab.json").write_text(json.dumps(src_vocab, ensure_ascii=False), "utf-8")
        extra: dict[str, Any] = {}
        if not tokenizers.joint:
            tgt_vocab = piece_vocabulary(tokenizers.tgt)
            target_vocab = tmp / "target_vocab.json"
            target_vocab.write_text(json.dumps(tgt_vocab, ensure_ascii=False), "utf-8")
            extra = {"target_vocab_file": str(target_vocab), "separate_vocabs": True}
        tokenizer = transformers.MarianTokenizer(
            source_spm=str(tmp / "source.spm"),
            target_spm=str(tmp / "target.spm"),
            vocab=str(tmp / "vocab.json"),
            source_lang=cfg.data.src_lang,
            target_lang=cfg.data.tgt_lang,
            unk_token=SPECIAL_PIECES[UNK_ID],
            eos_token=SPECIAL_PIECES[EOS_ID],
            pad_token=SPECIAL_PIECES[PAD_ID],
            model_max_length=max_len,
            clean_up_tokenization_spaces=False,  # our detokenizer is sentencepiece's alone
            **extra,
        )
        add_language_codes(tokenizer, codes)
        tokenizer.save_pretrained(str(out))


def add_language_codes(tokenizer: Any, codes: dict[int, str]) -> None:
    """Make each Marian code a token of its own that keeps its tag's id and takes the spaces
    after it (our pieces of ``Ein`` and of `` Ein`` differ: the sentencepiece models keep
    whitespace as it is)."""
    from tokenizers import AddedToken

    added = [AddedToken(c, rstrip=True, lstrip=False, normalized=False, special=True)
             for c in codes.values()]  # fmt: skip
    tokenizer.add_tokens(added, special_tokens=True)
    for tag, code in codes.items():
        if tokenizer.convert_tokens_to_ids(code) != tag:
            raise ConfigError(f"--format hf: the tokenizer gave {code} another id than {tag}")


# ------------------------------------------------------------------------------------ folder


def generation_config(
    decode: DictConfig | dict,
    max_positions: int,
    max_len: int,
    suppress_start: bool = False,
    forced_first: bool = False,
) -> Any:
    """Our decoding defaults as a transformers ``GenerationConfig``.

    ``num_beams`` is the run's beam; ``length_penalty`` its GNMT alpha (transformers divides by
    ``length ** alpha`` where we divide by ``((5 + length) / 6) ** alpha``: the same preference,
    not the same scores). Our per-sentence cap ``a * source_length + b`` has no counterpart: the
    fixed ``max_length`` is that cap for the longest source training kept (``max_len``), within
    the position table, and one token more where the first is the forced language tag
    (``forced_first``)."""
    from nmt.decode.options import DecodeOptions

    transformers = require()
    opts = DecodeOptions.of_run(decode)
    cap = int(opts.caps([max_len + 1], max_positions)[0])  # EOS counts in the source length
    return transformers.GenerationConfig(
        num_beams=opts.beam,
        length_penalty=opts.length_penalty,
        early_stopping=False,
        do_sample=False,
        max_length=cap + 2 + int(forced_first),  # the start token, the tag, the cap, the EOS
        decoder_start_token_id=BOS_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID,
        bad_words_ids=[[BOS_ID]] if suppress_start else None,  # model.suppress_start
    )


def write_folder(
    model: Transformer,
    tokenizers: TokenizerPair,
    cfg: DictConfig,
    decode: DictConfig | dict,
    out: Path,
) -> None:
    """The transformers model, its generation config and its tokenizer into the folder ``out``
    (which exists): what ``from_pretrained(out)`` loads."""
    hf = convert_model(model)
    hf.generation_config = generation_config(
        decode, model.max_positions, int(cfg.data.max_len), model.suppress_start,
        forces_first(cfg),
    )  # fmt: skip
    hf.save_pretrained(str(out), safe_serialization=True)
    write_tokenizer(tokenizers, out, cfg, model.max_positions)


def probe(tokenizers: TokenizerPair) -> tuple[list[str], list[str]]:
    """Sentences that exercise the tokenizer (byte fallback included) and the model."""
    src = ["Ein Hund läuft über die Wiese.", "Zwei Männer — 3½ Äpfel, ŝ ǅ 😀 .", "a"]
    tgt = ["A dog runs across the meadow.", "Two men — 3½ apples, ŝ ǅ 😀 .", "b"]
    return src, tgt


Head = tuple[int, str] | None  # a language tag's id and its Marian code, or none


def probe_heads(
    cfg: DictConfig, tokenizers: TokenizerPair, n: int
) -> tuple[list[Head], list[Head]]:
    """The code before each of ``n`` probe sources and targets, where the run's placement puts
    one: the languages' codes in turn (a source code at ``both`` placement is the next one, as
    the function is compared, not the direction)."""
    tags = list(language_codes(cfg, tokenizers.src).items())
    if not tags:
        return [None] * n, [None] * n
    placement = placement_of(cfg.data)
    first: list[Head] = [tags[i % len(tags)] for i in range(n)]
    nxt: list[Head] = [tags[(i + 1) % len(tags)] for i in range(n)]
    if placement == "source":
        return first, [None] * n
    return (nxt if placement == "both" else [None] * n), first


def _head_id(head: Head) -> list[int]:
    return [] if head is None else [head[0]]


def verify_folder(
    model: Transformer, tokenizers: TokenizerPair, out: Path, cfg: DictConfig
) -> None:
    """Load ``out`` as a user would (no custom code) and compare it with ``model`` (trained
    with ``cfg``): the tokenizer's ids and the teacher-forced log-probabilities, a multilingual
    model's with the codes its placement asks for (:func:`probe_heads`). ConfigError on a
    difference."""
    import torch

    transformers = require()
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out)).float().eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    sources, targets = probe(tokenizers)
    src_heads, tgt_heads = probe_heads(cfg, tokenizers, len(sources))
    texts = [f"{h[1]} {s}" if h else s for h, s in zip(src_heads, sources, strict=True)]
    labels_text = [f"{h[1]} {t}" if h else t for h, t in zip(tgt_heads, targets, strict=True)]
    enc = tok(texts, text_target=labels_text, padding=True, return_tensors="pt")
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        want_src = _head_id(src_heads[i]) + tokenizers.src.encode(s) + [EOS_ID]
        want_tgt = _head_id(tgt_heads[i]) + tokenizers.tgt.encode(t) + [EOS_ID]
        got_src = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
        got_tgt = [x for x in enc["labels"][i].tolist() if x != PAD_ID]
        if got_src != want_src or got_tgt != want_tgt:
            raise ConfigError(f"--format hf: the exported tokenizer encodes {s!r} differently")
    src, lens = enc["input_ids"], enc["attention_mask"].sum(1)
    labels = enc["labels"]
    tgt_in = torch.cat([torch.full((len(labels), 1), BOS_ID), labels[:, :-1]], dim=1)
    with torch.inference_mode():
        ours = model(src, lens, tgt_in).float().log_softmax(-1)
        theirs = hf(
            input_ids=src, attention_mask=enc["attention_mask"], decoder_input_ids=tgt_in
        ).logits.log_softmax(-1)
    real = labels != PAD_ID
    gap = (ours - theirs).abs()[real].max().item()
    if gap > 1e-4:
        raise ConfigError(f"--format hf: the converted model differs by {gap:.2e} in log-prob")
