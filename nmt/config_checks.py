"""The checks of a training config that its types cannot express (:func:`check_train_config`):
values that span several keys, ranges, and the corpus lists of ``data.train`` and
``data.directions``. Each raises :class:`~nmt.config.ConfigError` naming the offending key."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig

from nmt.config import MODEL_SCHEMAS, ConfigError

# the parts of a model that trainer.freeze names (nmt.train.freeze)
FREEZABLE = ("embeddings", "encoder", "decoder", "output")


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(allowed)}")


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{key}={value} must be {bound}")


def check_decode(d: Any, prefix: str = "") -> None:
    """Check the decoding fields of ``d`` (a :class:`DecodeConfig` or a runtime
    ``DecodeOptions``); raise ConfigError naming the first bad one (``prefix`` + its name)."""
    if d.beam is not None:
        _positive(f"{prefix}beam", d.beam)
    if d.length_penalty is not None and not d.length_penalty >= 0:
        raise ConfigError(f"{prefix}length_penalty={d.length_penalty} must be >= 0")
    for key in ("max_output_len_a", "max_output_len_b", "min_output_len"):
        _positive(f"{prefix}{key}", getattr(d, key), allow_zero=True)
    _positive(f"{prefix}max_tokens", d.max_tokens)
    _choice(f"{prefix}precision", str(d.precision), ("auto", "32", "bf16", "16"))
    _check_sampling(d, prefix)


def _check_sampling(d: Any, prefix: str) -> None:
    topk, topp, temperature = d.sampling_topk, d.sampling_topp, d.sampling_temperature
    _positive(f"{prefix}sampling_topk", topk, allow_zero=True)
    if not 0 < topp <= 1:
        raise ConfigError(f"{prefix}sampling_topp={topp} must be > 0 and <= 1")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ConfigError(f"{prefix}sampling_temperature={temperature} must be a number > 0")
    if topk == 1:  # search: the other sampling options would change nothing
        for key, value in (("sampling_topp", topp), ("sampling_temperature", temperature)):
            if value != 1:
                raise ConfigError(
                    f"{prefix}{key}={value} applies to sampling, which sampling_topk=1 turns "
                    "off: set sampling_topk=0 (every token) or the number of tokens to draw from"
                )
    elif d.beam is not None and d.beam > 1:
        raise ConfigError(
            f"{prefix}sampling_topk={topk} draws one translation per sentence instead of a "
            f"search: it needs beam=1 (or beam unset), not beam={d.beam}"
        )


def check_train_config(cfg: DictConfig, training: bool = True) -> None:
    """Check values that the type system cannot; raise ConfigError naming the key.
    ``training=False`` (a stored model's config, read to decode) skips what only training
    needs: a multilingual model's one sentencepiece model (an imported multi-target OPUS-MT
    model has one per side)."""
    _check_data(cfg.data, training)
    _check_optim(cfg.optim, cfg.trainer)
    _check_trainer(cfg.trainer)
    dec = cfg.decode
    check_decode(dec, "decode.")
    if dec.checkpoint == "averaged" and cfg.trainer.average_last == 0:
        raise ConfigError("decode.checkpoint=averaged needs trainer.average_last > 0")
    check_model_config(cfg.model)
    t = cfg.trainer
    if (
        training
        and cfg.model.get("shared_embeddings")
        and not (cfg.data.joint_vocab or t.init_from or t.resume)
    ):
        raise ConfigError(
            "model.shared_embeddings=true gives the source the target's embedding matrix: an "
            "imported OPUS-MT model's, whose two sentencepiece models share one vocab.json; a "
            "model trained here shares its embeddings through data.joint_vocab=true"
        )


def _check_data(d: DictConfig, training: bool = True) -> None:
    directions = parse_directions(d.directions, languages=d.get("languages"))
    if directions:
        _check_multilingual(d, directions, training)
    elif d.get("zero_shot"):
        raise ConfigError(
            f"data.zero_shot={list(d.zero_shot)} needs a multilingual run: set data.directions"
        )
    elif d.src_lang == d.tgt_lang:
        raise ConfigError(f"data.src_lang and data.tgt_lang are both {d.src_lang!r}")
    if d.corpus == "multi30k" and not directions:
        for key, lang in (("data.src_lang", d.src_lang), ("data.tgt_lang", d.tgt_lang)):
            _choice(key, lang, ("en", "de", "fr", "cs"))
    train_corpora(d.train)
    if not (d.sampling_temperature > 0):  # nan fails too
        raise ConfigError(f"data.sampling_temperature={d.sampling_temperature} must be > 0")
    _positive("data.spm_sample", d.spm_sample)
    _positive("data.num_workers", d.num_workers, allow_zero=True)
    _positive("data.max_len", d.max_len)
    if d.max_len_ratio < 1:
        raise ConfigError(f"data.max_len_ratio={d.max_len_ratio} must be >= 1")
    _positive("data.vocab_size", d.vocab_size)
    _check_subword_alpha(d, bool(directions))
    _positive("data.max_tokens", d.max_tokens)
    # +2: room for the BOS/EOS added around the longest allowed sentence
    if d.max_tokens < d.max_len + 2:
        raise ConfigError(
            f"data.max_tokens={d.max_tokens} is smaller than one sentence of data.max_len="
            f"{d.max_len} tokens (+2 for BOS/EOS); raise data.max_tokens or lower data.max_len"
        )


def _check_subword_alpha(d: DictConfig, multilingual: bool) -> None:
    """``data.subword_alpha``: 0 (off), a unigram model's smoothing exponent or BPE-dropout's
    probability (below 1, where no merge would be left)."""
    alpha = d.subword_alpha
    if not alpha >= 0:  # nan fails too
        raise ConfigError(f"data.subword_alpha={alpha} must be >= 0 (0: no subword sampling)")
    if alpha and d.spm_model_type == "bpe" and alpha >= 1:
        raise ConfigError(
            f"data.subword_alpha={alpha} is BPE-dropout's probability with "
            "data.spm_model_type=bpe and must be below 1"
        )
    if alpha and multilingual:
        raise ConfigError(
            "data.subword_alpha: subword sampling is for one direction's training pairs; "
            "a multilingual run (data.directions) trains on the best segmentation"
        )


def _check_multilingual(d: DictConfig, directions: list[Direction], training: bool) -> None:
    if d.corpus == "multi30k":
        for i, direction in enumerate(directions):
            for lang in (direction.src, direction.tgt):
                _choice(f"data.directions[{i}] ({direction})", lang, ("en", "de", "fr", "cs"))
    if training and not d.joint_vocab:
        raise ConfigError(
            "data.directions: a multilingual model has one sentencepiece model over all its "
            "languages; set data.joint_vocab=true"
        )
    _check_zero_shot(d, directions)


def _check_zero_shot(data: DictConfig, directions: list[Direction]) -> None:
    """``data.zero_shot``: directions not trained whose languages the model reads and writes.
    (The ground floor: ``nmt.data.multilingual``'s helpers are a layer above.)"""
    known = sorted({lang for d in directions for lang in (d.src, d.tgt)})
    targets = sorted({d.tgt for d in directions})
    for i, d in enumerate(parse_directions(data.get("zero_shot"), "data.zero_shot")):
        where = f"data.zero_shot[{i}]={d}"
        if d in directions:
            raise ConfigError(f"{where} is a trained direction (data.directions)")
        if d.src not in known:
            raise ConfigError(f"{where}: {d.src!r} is in no trained direction: {', '.join(known)}")
        if d.tgt not in targets:
            raise ConfigError(
                f"{where}: {d.tgt!r} is not a trained target language: {', '.join(targets)}"
            )


def _check_optim(o: DictConfig, t: DictConfig) -> None:
    _positive("optim.lr", o.lr)
    _positive("optim.warmup_steps", o.warmup_steps, allow_zero=True)
    _positive("optim.weight_decay", o.weight_decay, allow_zero=True)
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        raise ConfigError(f"optim.betas={list(o.betas)} must be two numbers in [0, 1)")
    decays = o.schedule in ("cosine", "linear")
    if decays and o.decay_over == "steps" and t.max_steps <= 0:
        raise ConfigError(
            f"optim.schedule={o.schedule} decays to trainer.max_steps: set it > 0, or decay "
            "over a time budget with optim.decay_over=time and trainer.max_time"
        )
    if decays and o.decay_over == "time" and t.max_time <= 0 and t.cpu_max_time <= 0:
        raise ConfigError(
            "optim.decay_over=time decays to the training-time limit: set trainer.max_time > 0"
        )


def _check_trainer(t: DictConfig) -> None:
    _choice("trainer.precision", str(t.precision), ("auto", "32", "bf16", "16"))
    for key in ("accumulate", "log_every", "val_every", "keep_last"):
        _positive(f"trainer.{key}", t[key])
    for key in ("max_steps", "max_epochs", "max_time", "cpu_max_time", "patience",
                "clip_grad_norm", "average_last", "save_every_minutes"):  # fmt: skip
        _positive(f"trainer.{key}", t[key], allow_zero=True)
    if not 0 <= t.label_smoothing < 1:
        raise ConfigError(f"trainer.label_smoothing={t.label_smoothing} must be in [0, 1)")
    if not 0 <= t.rdrop_alpha < math.inf:
        raise ConfigError(f"trainer.rdrop_alpha={t.rdrop_alpha} must be 0 (off) or positive")
    for i, part in enumerate(t.freeze):
        _choice(f"trainer.freeze[{i}]", str(part), FREEZABLE)
    if t.needs_init_from and not (t.init_from or t.resume):
        raise ConfigError(
            "trainer.init_from is not set: this preset fine-tunes a model that already "
            "translates; name it with trainer.init_from=<run dir, checkpoint or hf:SOURCE>"
        )
    if t.init_from and t.resume:
        raise ConfigError(
            f"trainer.init_from={t.init_from!r} and trainer.resume={t.resume!r} exclude each "
            "other: init_from starts a new run from a checkpoint's weights, resume continues a "
            "run (a fine-tuning run included) where it stopped; set only one"
        )
    if t.attention_every < 0:
        raise ConfigError(
            f"trainer.attention_every={t.attention_every} must be >= 0 (updates between two "
            "drawings of the attention views; 0 draws them at every validation)"
        )
    if t.attention_html and t.attention_sentences <= 0:
        raise ConfigError(
            "trainer.attention_html=true shows the first trainer.attention_sentences validation "
            f"sentences, but trainer.attention_sentences={t.attention_sentences}: set it > 0"
        )
    if t.average_last > t.keep_last:
        raise ConfigError(
            f"trainer.average_last={t.average_last} needs trainer.keep_last>={t.average_last} "
            "step checkpoints on disk"
        )


def check_model_config(m: DictConfig) -> None:
    """Model-specific checks, keyed by the fields a model config has."""
    _choice("model.arch", m.get("arch", "<missing>"), tuple(MODEL_SCHEMAS))
    for key, value in m.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if key.endswith("dropout"):
                if not 0 <= value < 1:
                    raise ConfigError(f"model.{key}={value} must be in [0, 1)")
            elif value <= 0:
                raise ConfigError(f"model.{key}={value} must be > 0")
    if "heads" in m and m.d_model % m.heads != 0:
        raise ConfigError(f"model.d_model={m.d_model} is not divisible by model.heads={m.heads}")
    if m.get("attention") in ("dot", "scaled_dot") and m.get("bidirectional"):
        raise ConfigError(
            f"model.attention={m.attention} needs keys of the decoder's size, and "
            "model.bidirectional=true makes them 2 x model.hidden_dim: use "
            "model.attention=general, or model.bidirectional=false"
        )


@dataclass(frozen=True)
class TrainCorpus:
    """One entry of ``data.train``: a split name or path prefix and its sampling weight."""

    prefix: str
    weight: float = 1.0  # an epoch draws round(weight * pairs) of the corpus (1: each pair once)


def train_corpora(value: Any, key: str = "data.train") -> list[TrainCorpus]:
    """The corpora named by ``data.train``: a string or a list of strings, each optionally
    ending in ``:<weight>`` (a number > 0). Raises ConfigError naming the entry."""
    if isinstance(value, str):
        entries, keys = [value], [key]
    elif isinstance(value, (list, tuple, ListConfig)):
        entries, keys = list(value), [f"{key}[{i}]" for i in range(len(value))]
        if not entries:
            raise ConfigError(f"{key}=[] names no training corpus")
    else:
        raise ConfigError(
            f"{key}={value!r} must be a corpus (split name or path prefix) or a list of them"
        )
    corpora = []
    for entry, where in zip(entries, keys, strict=True):
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigError(f"{where}={entry!r} must be a non-empty split name or path prefix")
        prefix, weight = entry, 1.0
        head, sep, tail = entry.rpartition(":")
        if sep and head:
            try:
                weight = float(tail)
            except ValueError:
                pass  # a colon inside the path itself
            else:
                prefix = head
                if not (math.isfinite(weight) and weight > 0):
                    raise ConfigError(
                        f"{where}={entry!r}: the sampling weight after ':' must be a number > 0"
                    )
        corpora.append(TrainCorpus(prefix, weight))
    return corpora


@dataclass(frozen=True)
class Direction:
    """One translation direction of a multilingual run: source and target language codes."""

    src: str
    tgt: str

    @property
    def name(self) -> str:
        return f"{self.src}-{self.tgt}"

    def __str__(self) -> str:
        return self.name


def parse_directions(
    value: Any, key: str = "data.directions", languages: Sequence[str] | None = None
) -> list[Direction]:
    """The directions of ``data.directions`` (``[de-en, en-fr]``); raises ConfigError naming the
    entry. An empty list is an empty result (a bilingual run). ``all`` is every ordered pair of
    ``languages`` (``data.languages``), sources in their order, then targets."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, ListConfig)):
        raise ConfigError(f"{key}={value!r} must be a list of directions such as [de-en, en-fr]")
    if list(value) == [ALL_DIRECTIONS]:
        value = every_pair(languages or [], key)
    out: dict[Direction, None] = {}  # in order, each once (a hundred languages: 9,900)
    for i, entry in enumerate(value):
        where = f"{key}[{i}]"
        parts = entry.split("-") if isinstance(entry, str) else []
        if len(parts) != 2 or not all(p.isascii() and p.replace("_", "x").isalnum() for p in parts):
            raise ConfigError(
                f"{where}={entry!r} is not a direction: write <source>-<target> language "
                "codes, such as de-en"
            )
        d = Direction(parts[0], parts[1])
        if d.src == d.tgt:
            raise ConfigError(f"{where}={entry!r} translates a language into itself")
        if d in out:
            raise ConfigError(f"{where}={entry!r} is named twice")
        out[d] = None
    return list(out)


ALL_DIRECTIONS = "all"


def every_pair(languages: Sequence[str], key: str = "data.directions") -> list[str]:
    """Every ordered pair of ``languages`` as directions (``de-en``); ConfigError for fewer
    than two distinct languages."""
    langs = list(dict.fromkeys(str(lang) for lang in languages))
    if len(langs) < 2:
        raise ConfigError(
            f"{key}=all needs data.languages, the corpus's languages (two or more, such as "
            f"[cs, de, en, fr]); it is {list(languages)}"
        )
    return [f"{a}-{b}" for a in langs for b in langs if a != b]
