"""Typed configuration schema.

Every config group (data/, model/, optim/, trainer/) is backed by a dataclass registered in
Hydra's ConfigStore, so a misspelt key, a value of the wrong type or a choice outside its Enum
fails when the config is composed, before any data is read. The defaults are declared here only:
a YAML file under configs/ sets just the values that make it differ. Checks that span several
values (:func:`nmt.config_checks.check_train_config`) raise :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from nmt.cli import UserError


class ConfigError(UserError, ValueError):
    """An invalid configuration value; the message names the key."""


if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, Enum):
        """Python 3.11's enum.StrEnum: a member is its value, also for str() and format()."""

        def __str__(self) -> str:
            return str(self.value)


# The closed choices of the schema. OmegaConf types a field by its Enum and accepts a member's
# *name*, so a misspelt choice fails when the config is composed, naming the key and the allowed
# names. A member is a str equal to its name: code compares it with plain strings, configs store
# plain strings (:func:`to_container`). ``trainer.precision`` is a str: Hydra parses ``32`` as int.


class Corpus(StrEnum):
    multi30k = "multi30k"  # Multi30k task 1, fetched and verified
    parallel = "parallel"  # the user's own files


class TagPlacement(StrEnum):
    source = "source"  # the target tag <2xx> is the source's first token
    target = "target"  # the target tag is the first target token, forced when decoding
    both = "both"  # as target, and the source's first token is its own language's tag (NLLB)


class SpmModelType(StrEnum):
    unigram, bpe = "unigram", "bpe"


class OptimizerName(StrEnum):
    adam = "adam"
    adamw = "adamw"  # decoupled weight decay


class Schedule(StrEnum):
    noam = "noam"
    inverse_sqrt = "inverse_sqrt"
    cosine = "cosine"
    linear = "linear"
    constant = "constant"


class DecayOver(StrEnum):
    steps = "steps"  # to trainer.max_steps
    time = "time"  # to the training-time limit


class AttentionScore(StrEnum):
    additive = "additive"
    dot = "dot"
    general = "general"
    scaled_dot = "scaled_dot"


class Activation(StrEnum):
    relu = "relu"
    gelu = "gelu"  # exact (erf), as transformers' "gelu"
    swish = "swish"  # x * sigmoid(x), SiLU: OPUS-MT's Marian models


class PositionStyle(StrEnum):
    vaswani = "vaswani"  # sin/cos(t / 10000^(2k/d)) from position 0 (Vaswani et al.; Marian)
    fairseq = "fairseq"  # frequencies over d/2 - 1, positions from 2 (fairseq; M2M100, NLLB)


# What decodes (nmt.decode.engines): auto (the faster of torch and ctranslate2 for the model and
# search, measured once), torch (our search), torch-int8 (the GRU, int8 weights, CPU), ctranslate2
# (a --format ctranslate2 package). Functional API: "torch-int8" is not a Python name.
ENGINE_NAMES = ("auto", "torch", "torch-int8", "ctranslate2")
Engine = StrEnum("Engine", [(name, name) for name in ENGINE_NAMES])


class EvalSplit(StrEnum):
    test = "test"  # the run's data.test split(s)
    valid = "valid"  # its data.valid split: where decoding and presets are chosen


class AttentionFormat(StrEnum):
    png = "png"  # heatmap images
    html = "html"  # the explorer page (nmt.viz.explorer)


class CheckpointChoice(StrEnum):
    best = "best"
    last = "last"
    averaged = "averaged"
    auto = "auto"  # averaged if its validation BLEU beat the best single checkpoint's, else best


@dataclass
class DataConfig:
    """Where the corpus comes from, how it is cleaned, tokenized and batched.

    ``corpus: multi30k`` fetches Multi30k task 1 (download from ``NMT_MULTI30K_URL`` or the
    official URL, or a copy from ``NMT_MULTI30K_MIRROR``) and reads the split names below from
    it. ``corpus: parallel`` reads the user's own files: ``train``, ``valid`` and each ``test``
    entry are path prefixes, completed by ``.<src_lang>`` / ``.<tgt_lang>`` (optionally
    followed by ``.gz``), or Hugging Face datasets: a ``.parquet`` file or a pattern of them
    (``train-*.parquet``), a ``.jsonl`` / ``.jsonl.gz`` file, or a folder written by
    ``save_to_disk`` (one split's), whose ``column`` maps each row's language codes to its
    sentences.

    ``train`` is one corpus (``/corpus/train``) or a list of them
    (``[/corpus/news:0.5, /corpus/crawl]``). An entry may end in ``:<weight>``, a number > 0
    (default 1): each epoch draws ``round(weight * pairs)`` of that corpus's pairs, every pair
    ``floor(weight)`` times and a seeded random share of them once more, so ``2`` doubles a
    corpus and ``0.5`` takes a different half of it each epoch. A path whose last ``:`` is
    followed by a number takes an explicit ``:1``.

    The training corpora are prepared once (``nmt-prepare``; ``nmt-train`` does it when
    needed) into ``<root>/cache/prepared/<key>/``: token ids in memory-mapped arrays and the
    sentencepiece model(s), trained on ``spm_sample`` pairs drawn uniformly from the cleaned
    training pairs (all of them when there are fewer). ``num_workers`` processes encode
    (0: one per available core; 1: in this process).

    ``directions`` makes a multilingual run (one model, a target-language tag per sentence):
    each split is read in every direction, ``{src}`` / ``{tgt}`` in a prefix replaced by the
    direction's languages; see :mod:`nmt.data.multilingual` and :mod:`nmt.data.multiprep`.
    """

    name: str = MISSING  # the data config's name (multi30k_de_en, parallel, ...)
    corpus: Corpus = Corpus.multi30k  # multi30k (fetched) or parallel (your own files)
    src_lang: str = "de"  # source language code: the files' suffix (<prefix>.de)
    tgt_lang: str = "en"  # target language code
    root: str = "data"  # downloads and caches live here
    # one corpus, or a list of them; each may end in :<weight> (see above)
    train: Any = "train"
    valid: str = "val"  # the validation split (a name, a path prefix or a dataset)
    # the test split(s) nmt-eval scores (names, path prefixes or datasets)
    test: list[str] = field(default_factory=lambda: ["test_2016_flickr"])
    # a dataset corpus's column holding {language code: sentence} in each row
    column: str = "translation"
    # multilingual (one model for several directions, each written src-tgt: [de-en, en-fr]),
    # or all: every ordered pair of data.languages; empty: the one direction src_lang ->
    # tgt_lang. See docs/how-to/multilingual.md
    directions: Any = field(default_factory=list)
    # the corpus's languages, whose every ordered pair data.directions=all trains
    languages: list[str] = field(default_factory=list)
    # the target-language tag <2xx>: target (first target token, forced; better on Multi30k),
    # source (the source's first token, Marian's convention) or both (target, and the source's tag)
    tag_placement: TagPlacement = TagPlacement.target
    # multilingual: directions not trained (each language in some trained direction) that
    # nmt-eval also scores, each against pivoting, unless its zero_shot=[...] says otherwise
    zero_shot: list[str] = field(default_factory=list)
    # multilingual: a direction's share of an epoch follows pairs ** (1 / T): 1 by size,
    # 5 flatter, inf uniform
    sampling_temperature: float = 1.0
    # cleaning (training split only; valid/test are only stripped)
    max_len: int = 100  # subword tokens per side
    max_len_ratio: float = 3.0  # longer side / shorter side, in subword tokens
    # sentencepiece
    joint_vocab: bool = True  # one sentencepiece model for both sides (else one per side)
    vocab_size: int = 8000  # pieces per sentencepiece model
    spm_model_type: SpmModelType = SpmModelType.unigram  # sentencepiece's unigram or bpe
    character_coverage: float = 1.0  # share of characters sentencepiece covers
    spm_sample: int = 100_000  # training pairs drawn for sentencepiece training
    # subword regularization: each epoch re-encodes the training pairs with a sampled
    # segmentation (unigram: probability ** alpha, 0.1-0.5 usual; bpe: BPE-dropout's
    # probability); 0 = the one best segmentation. See nmt.data.resegment
    subword_alpha: float = 0.0
    num_workers: int = 0  # preparation's encoding processes (0: one per core, 1: this process)
    # batching
    max_tokens: int = 4096  # per batch: sentences x longest side, padding included
    eval_max_tokens: int = 8192  # per batch when validation scores or decodes


@dataclass
class GRUBahdanauConfig:
    arch: str = "gru_bahdanau"  # the model's name in nmt.models.registry
    emb_dim: int = 256  # embeddings, and the pre-output layer before the vocabulary projection
    hidden_dim: int = 512  # GRU state size (per direction in the encoder)
    enc_layers: int = 1  # encoder GRU layers
    dec_layers: int = 1  # decoder GRU cells, stacked
    bidirectional: bool = True  # the encoder reads the source both ways
    dropout: float = 0.3  # on embeddings, encoder outputs, between layers and pre-output
    attention: AttentionScore = AttentionScore.additive  # additive | dot | general | scaled_dot
    attn_dim: int = 512  # hidden size of the additive score
    tie_embeddings: bool = False  # the output projection shares the target embedding


@dataclass
class TransformerConfig:
    arch: str = "transformer"  # the model's name in nmt.models.registry
    d_model: int = 256  # width of the residual stream
    heads: int = 4  # attention heads (d_model must divide by it)
    d_ff: int = 1024  # hidden size of the feed-forward sub-layers
    enc_layers: int = 3  # encoder layers
    dec_layers: int = 3  # decoder layers
    dropout: float = 0.1  # on every sub-layer output (before the residual sum) and embeddings
    attn_dropout: float = 0.1  # on the attention weights
    act_dropout: float = 0.0  # after the feed-forward activation
    activation: Activation = Activation.relu  # of the feed-forward sub-layers: relu | gelu | swish
    norm_first: bool = True  # pre-norm (layer norm before each sub-layer); false: post-norm
    tie_embeddings: bool = True  # the decoder's input embedding is the output projection
    shared_embeddings: bool = False  # and the source's, one id space for two segmenters (Marian)
    output_bias: bool = False  # a bias on the vocabulary projection (Marian's final_logits_bias)
    frozen_output_bias: bool = False  # never trained (an imported M2M100's classes it lacks)
    embedding_aliases: bool = False  # ids read another id's row (an imported M2M100, its BOS)
    suppress_start: bool = False  # the search never outputs BOS (OPUS-MT: it is their pad)
    learned_positions: bool = False  # learned position embeddings instead of sinusoidal ones
    position_style: PositionStyle = PositionStyle.vaswani  # the sinusoid: vaswani | fairseq
    max_positions: int = 1024  # longest sequence the position table holds


@dataclass
class OptimConfig:
    name: OptimizerName = OptimizerName.adam  # adam | adamw
    lr: float = 1e-3  # peak learning rate
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam's beta1, beta2
    eps: float = 1e-9  # Adam's epsilon
    weight_decay: float = 0.0  # not applied to 1-d parameters (biases, layer norms)
    schedule: Schedule = Schedule.inverse_sqrt  # the learning-rate multiplier over updates
    warmup_steps: int = 800  # updates of linear warmup to the peak
    min_lr: float = 0.0  # floor for cosine/linear decay
    # cosine/linear decay runs over `steps` (to trainer.max_steps) or `time` (to the
    # training-time limit: trainer.max_time, or trainer.cpu_max_time on CPU)
    decay_over: DecayOver = DecayOver.steps


@dataclass
class TrainerConfig:
    seed: int = 1234  # seeds model initialisation, batch order and dropout
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch intra-op threads on CPU; 0 keeps torch's default
    max_steps: int = 0  # optimizer updates; 0 = no limit
    max_epochs: int = 0  # 0 = no limit
    max_time: float = 0.0  # seconds of training; 0 = no limit
    cpu_max_time: float = 1800.0  # cap applied when running on CPU with no other limit set
    precision: str = "auto"  # auto | 32 | bf16 | 16 (auto: see nmt.runtime.precision)
    tf32: bool = True  # CUDA: fp32 matrix products in TF32 where the GPU has it (Ampere on)
    accumulate: int = 1  # batches per optimizer update (gradient accumulation)
    label_smoothing: float = 0.1  # share of the target probability spread over the vocabulary
    rdrop_alpha: float = 0.0  # R-Drop: 2 dropout passes, alpha x their symmetric KL (0 = 1 pass)
    # parts not trained (fine-tuning a large model): embeddings, encoder, decoder, output
    freeze: list[str] = field(default_factory=list)
    clip_grad_norm: float = 1.0  # 0 disables clipping
    log_every: int = 50  # updates per log line, TensorBoard point and train event
    val_every: int = 500  # updates per validation (and checkpoint)
    val_sentences: int = 0  # 0 = the whole validation split (decoded with decode's output caps)
    patience: int = 10  # validations without BLEU improvement before stopping; 0 = off
    attention_sentences: int = 4  # validation sentences drawn in TensorBoard; 0 = none
    attention_layers: str = "last"  # self-attention layers drawn: last | all | none | 0,2
    # updates between two drawings: the first validation, then the first one at or past each
    # multiple of this many updates; 0 = every validation. Drawing a Transformer's views takes
    # seconds (often more than the validation), so presets that validate often set it
    attention_every: int = 0
    attention_html: bool = False  # also their explorer, <run>/attention/validation.html
    keep_last: int = 5  # validations' step_N.pt kept (for averaging), besides last.pt, best.pt
    # also checkpoint when this many minutes passed since the last checkpoint (rank 0's clock,
    # every rank follows it); 0 = off: only validations and a stop write one. The clock's and a
    # stop's are resume_N.pt, deleted by the next checkpoint and never kept or averaged
    save_every_minutes: float = 0.0
    average_last: int = 0  # > 0: at the end, average the last N validations' step_N.pt files
    resume: str | None = None  # run dir, checkpoint file, or "auto"
    # fine-tuning: a checkpoint file, run dir or hf:<transformers folder or Hub id> whose weights
    # and tokenizers start a new run (fresh optimizer, schedule, step count); see nmt.train.start
    init_from: str | None = None
    needs_init_from: bool = False  # refuse to start without init_from (experiment=finetune)
    compile: bool = False  # torch.compile the model for training
    progress: bool = True  # the progress bar (drawn on a terminal only)


@dataclass
class DecodeConfig:
    """The decoding options, declared here once.

    Every command that decodes (``nmt-eval``, ``nmt-translate``, ``nmt-attention``,
    ``nmt-serve``) extends this schema, so ``nmt-eval beam=5`` sets a field on the command line,
    and so does a training run's ``decode`` section (:class:`RunDecodeConfig`). The search reads
    them as :class:`nmt.decode.options.DecodeOptions`, built from a command's fields and its
    run's section; ``beam`` and ``length_penalty`` left unset (null) come from the run.
    """

    beam: int | None = None  # 1 = greedy search; null: the run's decode.beam, else 1
    # GNMT alpha for beam search: ((5 + len) / 6) ** alpha; 0 = none; null: the run's, else 1
    length_penalty: float | None = None
    max_output_len_a: float = 1.2  # output cap: a * source_length + b tokens (EOS excluded)
    max_output_len_b: int = 10  # the b of the output cap
    min_output_len: int = 0  # no EOS before this many tokens (equal-length timing runs)
    max_tokens: int = 8192  # token budget of a decoding batch
    precision: str = "32"  # autocast for decoding: 32 | bf16 | 16 | auto (nmt.runtime.precision)
    # random sampling instead of search (nmt.decode.sampling), as for back-translation: draw
    # from the k most probable tokens; 1: off (search); 0: from every token
    sampling_topk: int = 1
    sampling_topp: float = 1.0  # ... and of those from the most probable holding this mass
    sampling_temperature: float = 1.0  # log-probabilities / temperature before both cuts
    sampling_seed: int = 0  # a sentence's draws depend on this seed and its input line only


@dataclass
class RunDecodeConfig(DecodeConfig):
    """How a run is meant to be decoded (the ``decode`` section of a training config).

    Its ``beam`` and ``length_penalty`` are the defaults of the run's ``nmt-eval``,
    ``nmt-translate`` and ``nmt-serve``; validation decodes greedily with its output caps
    (``max_output_len_a/b``; runs before these moved here had them as trainer.max_output_len_a/b,
    which nmt.store.gate reads into them), in batches of ``data.eval_max_tokens`` and in the
    precision of :func:`nmt.runtime.precision.validation_decode_precision`. ``min_output_len``,
    ``max_tokens`` and ``precision`` are set per command; a run's section holds them only as part of
    the shared schema and nothing reads them from it.
    """

    # averaged: trainer.average_last writes averaged.pt; auto: see CheckpointChoice
    checkpoint: CheckpointChoice = CheckpointChoice.best


@dataclass
class TrainConfig:
    # the corpus, tokenizers and batches (configs/data/)
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = MISSING  # the architecture and its sizes (configs/model/)
    # optimiser and learning-rate schedule (configs/optim/)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # the loop, its limits and checkpoints (configs/trainer/)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # a run that names no search is decoded greedily (beam 1), alpha 1 for a later beam
    decode: RunDecodeConfig = field(
        default_factory=lambda: RunDecodeConfig(beam=1, length_penalty=1.0)
    )
    outputs: str = "outputs"  # parent of run directories and of the `latest` link


# sacreBLEU's own defaults for bootstrap resampling (confidence intervals, paired tests)
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 12345


@dataclass
class ModelSource:
    """The model a command loads (:func:`nmt.store.loading.load_model`) and where it runs."""

    run: str = "outputs/latest"  # a run directory (outputs/latest: the newest run)
    # a file, or a name in <run>/checkpoints (best, last, averaged, step_400);
    # default: the run's decode.checkpoint, else best
    ckpt: str | None = None
    # a model package (nmt-export) instead of run/ckpt; `model=DIR` on the command line
    model_dir: str | None = None
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    tf32: bool = True  # as trainer.tf32, for our search (engine=torch) on a GPU


@dataclass
class EngineSource(ModelSource):  # ... and the engine that decodes it (nmt.decode.engines)
    engine: Engine = Engine.auto  # ctranslate2: a package exported with it


@dataclass
class EnsembleSource(EngineSource):  # ... and more models decoding with it
    # more models (runs, checkpoint files, packages) decoding with this one as an ensemble
    ensemble: list[str] = field(default_factory=list)


@dataclass
class EvalConfig(EnsembleSource, DecodeConfig):
    """``nmt-eval``: decode and score test sets; the decoding fields are :class:`DecodeConfig`'s."""

    # test sets in place of the run's data.test: "src_file:ref_file" pairs, or its corpus's splits
    test: list[str] = field(default_factory=list)
    # without test files: the run's split to score, test or valid (the validation split,
    # written to <run>/eval-valid unless out is given, apart from the test results)
    split: EvalSplit = EvalSplit.test
    out: str | None = None  # where hypotheses and scores go; default: <run>/eval
    progress: bool = True  # a bar over each test set's sentences (on a terminal only)
    # 95% confidence intervals of BLEU and chrF: sacreBLEU's bootstrap over this many resampled
    # test sets (0 = none; else at least 100), drawn with this seed (a positive integer)
    bootstrap: int = BOOTSTRAP_RESAMPLES
    bootstrap_seed: int = BOOTSTRAP_SEED
    # a multilingual run: directions it never trained to score too ([de-fr]), each also through
    # the pivot (two decodes); unset: the run's data.zero_shot; [] scores the trained ones only
    zero_shot: list[str] | None = None
    pivot: str = "en"  # the language a zero-shot direction is pivoted through
    pivot_trained: bool = True  # trained directions without the pivot (de-fr) are pivoted too
    # a multilingual run: the share of outputs not in the target language (py3langid)
    off_target: bool = True


@dataclass
class TranslateConfig(EnsembleSource, DecodeConfig):
    """``nmt-translate``; the decoding fields are :class:`DecodeConfig`'s."""

    input: str | None = None  # default: stdin (an interactive prompt when it is a terminal)
    output: str | None = None  # default: stdout
    n_best: int = 1  # > 1: print "index<TAB>score<TAB>translation" for the n best (<= beam)
    progress: bool = True  # a bar over the input's sentences on standard error (a terminal only)
    # a multilingual model: the target language (needed when it translates into several)
    tgt_lang: str | None = None
    src_lang: str | None = None  # a multilingual model: the input's language, checked and logged


@dataclass
class AttentionConfig(ModelSource, DecodeConfig):
    """``nmt-attention``: a trained model's attention on given sentences, as heatmap PNGs or
    as one interactive HTML page (``format=html``).

    The sentences are decoded greedily (the drawings follow one hypothesis): of the decoding
    fields, ``beam`` may only be 1 and ``length_penalty`` plays no part."""

    sentence: str | None = None  # one source sentence ...
    input: str | None = None  # ... or a file with one source sentence per line
    # references for the sentence BLEU shown by format=html: one with sentence=, or a file
    # with one line per line of input=
    reference: str | None = None
    references: str | None = None
    # png: one heatmap per sentence; html: the explorer page
    format: AttentionFormat = AttentionFormat.png
    words: bool = False  # format=html: open the page with pieces joined into words
    out: str | None = None  # default: <run dir>/attention
    layers: Any = "last"  # self-attention layers drawn: last | all | none | 2 | [0, 2]
    max_sentences: int = 100  # from the input file
    dpi: int = 120  # resolution of the PNG heatmaps
    tgt_lang: str | None = None  # a multilingual model: the target language, as in nmt-translate
    src_lang: str | None = None  # a multilingual model: the input's language (the views' label)


@dataclass
class ServeConfig(EngineSource, DecodeConfig):
    """``nmt-serve``: an HTTP translation server over a model package (see nmt.serve). The
    decoding fields (:class:`DecodeConfig`) are a request's defaults; ``precision``: torch's."""

    host: str = "127.0.0.1"  # the address to listen on (loopback only by default)
    port: int = 8080  # 0: any free port (printed at start)
    threads: int = 0  # torch intra-op threads, or CTranslate2 CPU workers; 0: each default
    max_sentences: int = 64  # per request (413 beyond)
    max_chars: int = 1000  # per sentence (413 beyond)
    max_body_bytes: int = 1_048_576  # per request body (413 beyond)
    max_beam: int = 16  # largest beam a request may ask for
    batch_wait_ms: float = 5.0  # how long a batch waits for more requests after its first
    max_batch_sentences: int = 256  # sentences of one shared decode
    max_segments: int = 256  # lines or html text nodes of one LibreTranslate request (400 beyond)
    shutdown_timeout: float = 60.0  # seconds given to requests in flight at SIGTERM
    api_keys_file: str | None = None  # the keys a translation needs (python -m nmt.serve.keys)
    allow_open: bool = False  # true: listen on a non-loopback host without api_keys_file
    cors_origins: list[str] = field(default_factory=list)  # web origins allowed to call (CORS)
    max_queued_sentences: int = 512  # sentences waiting for a decode; a request beyond: 503
    request_timeout: float = 30.0  # seconds from a request's arrival to its answer; then 504
    decode_nice: int = 0  # niceness added to the decoding threads, Linux (0: none)
    decode_process: bool = True  # our search decodes in a child process (false: on a thread)
    allow_zero_shot: bool = False  # a multilingual model: serve pairs it was not trained on


# The model schemas by architecture name: a model config's ``arch`` selects one (and, through
# nmt.models.registry, the class that is built). Nothing else can name a model.
MODEL_SCHEMAS: dict[str, type] = {
    "transformer": TransformerConfig,
    "gru_bahdanau": GRUBahdanauConfig,
}


@cache
def register_configs() -> None:
    """Register the schemas that YAML files extend through their defaults lists (once a process)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="eval_schema", node=EvalConfig)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="attention_schema", node=AttentionConfig)
    cs.store(name="serve_schema", node=ServeConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="model", name="gru_bahdanau_schema", node=GRUBahdanauConfig)
    cs.store(group="model", name="transformer_schema", node=TransformerConfig)
    cs.store(group="optim", name="optim_schema", node=OptimConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)


def to_container(cfg: DictConfig) -> dict:
    """The resolved config as plain Python data (for checkpoints and logs): choices become their
    plain strings, since checkpoints load with ``weights_only=True``, which refuses Enum objects."""
    return OmegaConf.to_container(  # type: ignore[return-value]
        cfg, resolve=True, throw_on_missing=True, enum_to_str=True
    )
