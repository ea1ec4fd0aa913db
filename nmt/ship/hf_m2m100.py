"""Converting a run imported from an M2M100 or NLLB-200 folder back into one
(``nmt-export --format hf``): ``M2M100ForConditionalGeneration`` with the folder's own tokenizer.

Our ids are not theirs (:mod:`nmt.store.m2m100_import`: our four specials first, the language
tags next), and their sinusoid counts positions from their padding id, so the layout cannot be
ours: the export restores theirs. The import keeps what that takes with the run's tokenizers
(``TokenizerPair.origin``), which fine-tuning carries unchanged: their id behind each of ours,
their vocabulary size, their code of each language, and their tokenizer's files as they were.
Each of their rows is then the row of the one id of ours that is not held at NEVER: our EOS
for their ``</s>`` (our BOS reads EOS's row, ``model.embedding_aliases``), our UNK for
``<unk>`` (the pieces their vocabulary lacks read it too). The output bias, which M2M100 does
not have, is ours only to hold those ids at NEVER (``model.frozen_output_bias``): a bias that
is anything else is refused, as is a model whose settings are no longer the import's.

The folder holds their tokenizer (``M2M100Tokenizer`` or ``NllbTokenizer``: a source language
code first, the target's forced as the first output token), and a generation config with our
decoding defaults and their ids; :func:`verify_folder` loads it as a user would and compares
the tokenizer's ids and the teacher-forced log-probabilities with ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from nmt.config import ConfigError
from nmt.data.tokenizer import BOS_ID, EOS_ID, TokenizerPair
from nmt.ship import hf
from nmt.store.hf_import import NEVER, VOCABULARY_ROWS
from nmt.store.m2m100_import import (
    M2M100_SETTINGS,
    ORIGIN_FILES,
    THEIR_BOS,
    THEIR_EOS,
    THEIR_PAD,
    classes_of,
)

if TYPE_CHECKING:
    import torch

    from nmt.models.transformer import Transformer

ARCHITECTURE = "M2M100ForConditionalGeneration"
# the largest log-probability difference allowed, per unit of the largest logit: a conversion
# error moves log-probabilities by the scale of the logits, float32 by 1e-6 of it per layer
TOLERANCE = 1e-4
# the model settings of an import the export relies on: its own and those of every M2M100
IMPORTED = {**M2M100_SETTINGS, "tie_embeddings": True, "learned_positions": False,
            "output_bias": True}  # fmt: skip


def refusal(cfg: DictConfig, tokenizers: TokenizerPair) -> str | None:
    """Why a run imported from an M2M100 folder cannot go back into one, or None."""
    m = cfg.model
    for key, value in IMPORTED.items():
        if m.get(key) != value:
            return (f"--format hf: model.{key}={m.get(key)} differs from the M2M100 import's "
                    f"{value}; the folder's layout cannot hold this model")  # fmt: skip
    try:
        origin_of(tokenizers)
    except ConfigError as e:
        return str(e)
    return None


def check_exportable(cfg: DictConfig, tokenizers: TokenizerPair) -> None:
    why = refusal(cfg, tokenizers)
    if why is not None:
        raise ConfigError(why)


def origin_of(tokenizers: TokenizerPair) -> dict[str, Any]:
    """The run's record of the folder it came from (``tokenizers.origin``), checked as plain
    data."""
    origin, vocab_size = tokenizers.origin, tokenizers.src.vocab_size
    where = "--format hf: the run's record of its M2M100 folder"
    if not isinstance(origin, dict) or origin.get("kind") not in ("m2m100", "nllb"):
        raise ConfigError(f"{where} is not one of an M2M100 or NLLB import")
    ids, never, size = origin.get("ids"), origin.get("never"), origin.get("size")
    if not (isinstance(size, int) and isinstance(ids, list) and isinstance(never, list)):
        raise ConfigError(f"{where} lacks its ids, never-output ids or size")
    if len(ids) != vocab_size or not all(isinstance(i, int) and 0 <= i < size for i in ids):
        raise ConfigError(f"{where}: its ids do not match the tokenizer's {vocab_size} pieces")
    files = origin.get("files")
    if not isinstance(files, dict) or not all(
        k in ORIGIN_FILES and isinstance(v, bytes) for k, v in files.items()
    ):
        raise ConfigError(f"{where}: its tokenizer files are not {', '.join(ORIGIN_FILES)}")
    codes = origin.get("codes")
    if not isinstance(codes, dict) or not all(isinstance(v, str) for v in codes.values()):
        raise ConfigError(f"{where}: its language codes are not a mapping of names")
    return origin


def sources(origin: dict[str, Any]) -> torch.Tensor:
    """Our id whose row each of their rows is (the one not held at NEVER)."""
    import torch

    classes = classes_of(origin["ids"], origin["never"])
    missing = [i for i in range(origin["size"]) if i not in classes]
    if missing:
        raise ConfigError(f"--format hf: their id {missing[0]} is none of ours")
    return torch.tensor([classes[i] for i in range(origin["size"])])


def architecture(model: Transformer) -> str:
    return ARCHITECTURE


# ----------------------------------------------------------------------------------- weights


def hf_config(model: Transformer, size: int) -> Any:
    """The ``M2M100Config`` of ``model`` with ``size`` rows in their layout."""
    transformers = hf.require()
    return transformers.M2M100Config(
        vocab_size=size,
        **hf.stack_fields(model),
        pad_token_id=THEIR_PAD,
        bos_token_id=THEIR_BOS,
        eos_token_id=THEIR_EOS,
        decoder_start_token_id=THEIR_EOS,
        forced_eos_token_id=THEIR_EOS,
        tie_word_embeddings=True,
    )


def hf_weights(model: Transformer, origin: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Our weights under M2M100's names, features permuted, rows in their ids; ConfigError
    where the output bias is more than NEVER on the ids they lack."""
    weights = hf.hf_weights(model, pre_norm=True)
    bias = weights.pop("final_logits_bias")[0]
    never = list(origin["never"])
    held = bias[never]
    bias[never] = 0.0
    if bool(bias.any()) or bool((held > NEVER).any()):
        raise ConfigError("--format hf: the output bias was trained, and M2M100 has none "
                          "(an import keeps it fixed: model.frozen_output_bias=true)")  # fmt: skip
    rows = sources(origin)
    for name in VOCABULARY_ROWS:
        if name in weights:
            weights[name] = weights[name].index_select(0, rows).contiguous()
    return weights


def convert_model(model: Transformer, origin: dict[str, Any]) -> Any:
    """The ``M2M100ForConditionalGeneration`` holding ``model``'s function (eval, float32)."""
    import torch

    transformers = hf.require()
    with torch.device("cpu"):
        out = transformers.M2M100ForConditionalGeneration(hf_config(model, origin["size"]))
    hf.load_into(out.float().eval(), hf_weights(model, origin))
    return out


# ------------------------------------------------------------------------------------ folder


def generation_config(decode: DictConfig | dict, max_positions: int, max_len: int) -> Any:
    """Our decoding defaults with their ids: the decoder starts from ``</s>``, the target
    language's code is forced after it (``forced_bos_token_id``, given per call)."""
    config = hf.generation_config(decode, max_positions, max_len)
    config.max_length += 1  # the forced language code
    config.decoder_start_token_id = THEIR_EOS
    config.bos_token_id = THEIR_BOS
    config.eos_token_id = THEIR_EOS
    config.pad_token_id = THEIR_PAD
    config.forced_eos_token_id = THEIR_EOS
    return config


def write_folder(
    model: Transformer,
    tokenizers: TokenizerPair,
    cfg: DictConfig,
    decode: DictConfig | dict,
    out: Path,
) -> None:
    """The model, its generation config and the folder's own tokenizer files into ``out``."""
    origin = origin_of(tokenizers)
    converted = convert_model(model, origin)
    converted.generation_config = generation_config(
        decode, model.max_positions, int(cfg.data.max_len)
    )
    converted.save_pretrained(str(out), safe_serialization=True)
    for name, data in origin["files"].items():
        (out / name).write_bytes(data)


def their_code(origin: dict[str, Any], lang: str) -> str:
    """The tokenizer's name of our language ``lang`` (``de``; NLLB's ``deu_Latn``)."""
    code = origin["codes"].get(lang)
    if code is None:
        raise ConfigError(f"--format hf: {lang!r} is none of the folder's languages")
    return str(code)


def verify_folder(
    model: Transformer, tokenizers: TokenizerPair, out: Path, cfg: DictConfig
) -> None:
    """Load ``out`` as a user would and compare it with ``model`` in the run's direction: the
    tokenizer's ids (source and target, language codes included) and the teacher-forced
    log-probabilities of every class of theirs, sentence by sentence, to :data:`TOLERANCE`
    times the largest logit. ConfigError on a difference."""
    import torch

    transformers = hf.require()
    origin = origin_of(tokenizers)
    ids = torch.tensor(origin["ids"])
    loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out)).float().eval()
    src_lang, tgt_lang = str(cfg.data.src_lang), str(cfg.data.tgt_lang)
    tok = transformers.AutoTokenizer.from_pretrained(
        str(out), src_lang=their_code(origin, src_lang), tgt_lang=their_code(origin, tgt_lang)
    )
    never = set(origin["never"])
    classes = torch.tensor([i for i in range(len(ids)) if i not in never])
    ours = tokenizers.src
    for s, t in zip(*hf.probe(tokenizers), strict=True):
        enc = tok(s, text_target=t)
        src = [ours.tags[src_lang], *ours.encode(s), EOS_ID]
        tgt = [ours.tags[tgt_lang], *ours.encode(t), EOS_ID]
        if enc["input_ids"] != ids[src].tolist() or enc["labels"] != ids[tgt].tolist():
            raise ConfigError(f"--format hf: the exported tokenizer encodes {s!r} differently")
        tgt_in = torch.tensor([[BOS_ID, *tgt[:-1]]])
        theirs_in = ids[tgt_in]
        theirs_in[:, 0] = THEIR_EOS  # their decoder starts from </s>
        with torch.inference_mode():
            mine = model(torch.tensor([src]), torch.tensor([len(src)]), tgt_in)
            theirs = loaded(input_ids=ids[torch.tensor([src])], decoder_input_ids=theirs_in)
        logits = theirs.logits[..., ids[classes]]
        mine = mine.float().log_softmax(-1)[..., classes]
        gap = (mine - logits.log_softmax(-1)).abs().max().item()
        scale = max(1.0, logits.abs().max().item())  # float32 rounds in proportion to it
        if gap > TOLERANCE * scale:
            raise ConfigError(f"--format hf: the converted model differs by {gap:.2e} in "
                              f"log-prob (logits up to {scale:.1f})")  # fmt: skip


# ---------------------------------------------------------------------------------- the card


def card_use(cfg: DictConfig, tokenizers: TokenizerPair, decode: DictConfig | dict) -> list[str]:
    """The model card's "Use with transformers" of an M2M100 folder."""
    from nmt.decode.options import DecodeOptions

    origin = origin_of(tokenizers)
    opts = DecodeOptions.of_run(decode)
    src, tgt = (their_code(origin, str(lang)) for lang in (cfg.data.src_lang, cfg.data.tgt_lang))
    token = f"__{tgt}__" if origin["kind"] == "m2m100" else tgt
    tokenizer = "M2M100Tokenizer" if origin["kind"] == "m2m100" else "NllbTokenizer"
    return [
        "## Use with transformers",
        "",
        f"An `{ARCHITECTURE}` (no custom code) with the `{tokenizer}` of the folder the model "
        "was imported from, in that folder's token ids: the same function as the nmt model, "
        "tested to 1e-4 in log-probability per unit of the largest logit. The source starts "
        "with its language's code (`src_lang`); the output with the target's, which `generate` "
        "forces:",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        f'tok = AutoTokenizer.from_pretrained("<this folder>", src_lang="{src}")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("<this folder>")',
        'batch = tok(["<a source sentence>"], return_tensors="pt", padding=True)',
        f'target = tok.convert_tokens_to_ids("{token}")',
        "out = model.generate(**batch, forced_bos_token_id=target)",
        "print(tok.batch_decode(out, skip_special_tokens=True))",
        "```",
        "",
        "`generation_config.json` holds the nmt decoding defaults: "
        f"`num_beams={opts.beam}`, `length_penalty={opts.length_penalty}` (transformers divides "
        "a hypothesis's log-probability by `n ** alpha`, nmt by `((5 + n) / 6) ** alpha`: greedy "
        "search is identical, beam search may rank the beam's hypotheses otherwise), and one "
        "`max_length` for the per-sentence cap of nmt.",
        "",
    ]
