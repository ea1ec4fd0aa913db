"""Decoding engines: our PyTorch search, or a package's CTranslate2 model (``engine=...``).

* ``torch``: :func:`nmt.decode.search.decode_dataset`, for any checkpoint or package;
* ``torch-int8``: the same search on the GRU with int8 weights (:class:`TorchInt8Engine`, CPU);
* ``ctranslate2``: :class:`nmt.decode.ct2.CTranslate2Engine`, for a package exported with
  ``--format ctranslate2`` (the Transformer only);
* ``auto``: ``torch`` unless the package holds a CTranslate2 model and CTranslate2 is installed;
  then the faster of the two for this model, beam size and machine, measured once by a short
  probe and cached in ``<data.root>/cache/engine/`` like the precision probe, so later runs start
  without measuring. Where the command has its sentences (``nmt-eval``) both engines decode the
  first ``PROBE_SAMPLE`` of them as asked, in turns (their outputs are the same, so is their
  work); otherwise (``nmt-translate``, ``nmt-serve``) they decode a synthetic batch to the same
  fixed length. A fixed output length is not the test set's, so where the two engines are
  close the two probes can disagree.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import torch

from nmt.cli import Advance, no_progress
from nmt.config import ENGINE_NAMES, ConfigError
from nmt.data.batching import TokenDataset
from nmt.decode import ct2
from nmt.decode.options import DecodeOptions
from nmt.decode.search import Hypothesis, decode_dataset
from nmt.models.int8 import quantize_int8
from nmt.runtime.measured import Choice, ChoiceCache
from nmt.runtime.precision import machine_key
from nmt.store.loading import Trained
from nmt.store.package import CT2_DIR, is_package, read_manifest, verified_file

log = logging.getLogger(__name__)

CACHE_VERSION = 3  # 3: CTranslate2 on CPU decodes with `threads` workers
PROBE_SENTENCES, PROBE_SOURCE, PROBE_OUTPUT = 32, 16, 16  # synthetic batch, fixed length
PROBE_SAMPLE = 256  # sentences of the command's own input, decoded as asked
PROBE_ROUNDS = 3


class Engine(Protocol):
    name: str

    def hypotheses(
        self,
        data: TokenDataset,
        opts: DecodeOptions,
        limit: int = 0,
        keep_attention: bool = False,
        advance: Advance = no_progress,  # called with the sentences done
    ) -> list[Hypothesis]: ...


class TorchEngine:
    """Our search (:mod:`nmt.decode.search`) on the PyTorch model."""

    name = "torch"

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device

    def hypotheses(
        self,
        data: TokenDataset,
        opts: DecodeOptions,
        limit: int = 0,
        keep_attention: bool = False,
        advance: Advance = no_progress,
    ) -> list[Hypothesis]:
        return decode_dataset(self.model, data, opts, self.device, limit, keep_attention, advance)


class TorchInt8Engine(TorchEngine):
    """Our search on the GRU with int8 linear layers and GRU cells (``engine=torch-int8``, CPU
    only; :func:`nmt.models.int8.quantize_int8`). On a briefly trained GRU on a busy 2-core CPU
    it decoded Multi30k's test set at 1.74x the fp32 model with beam 5 (BLEU 0.04 lower) and
    1.68x greedy (medians of 5 rounds); for the Transformer, int8 is CTranslate2's."""

    name = "torch-int8"

    def __init__(self, trained: Trained, device: torch.device) -> None:
        arch = trained.cfg.model.arch
        if arch != "gru_bahdanau":
            raise ConfigError(
                f"engine=torch-int8 decodes the GRU model; {trained.path} is a {arch}: export it "
                "with --format ctranslate2 --quantize int8 and use engine=ctranslate2"
            )
        if device.type != "cpu":
            raise ConfigError(f"engine=torch-int8 decodes on the CPU, not {device}")
        super().__init__(quantize_int8(trained.model), device)


def translate_texts(
    engine: Engine,
    data: TokenDataset,
    trained: Trained,
    opts: DecodeOptions,
    limit: int = 0,
    advance: Advance = no_progress,
) -> list[str]:
    """Detokenized best translations of (the first ``limit`` sentences of) ``data``
    (``advance``: called with the sentences decoded)."""
    hyps = engine.hypotheses(data, opts, limit, advance=advance)
    return [trained.tokenizers.tgt.decode(h.tokens) for h in hyps]


def ct2_model_dir(trained: Trained) -> Path | None:
    """The verified CTranslate2 folder of a package, None for a checkpoint or a package
    without one."""
    if not is_package(trained.path):
        return None
    manifest = read_manifest(trained.path)
    if manifest.ctranslate2 is None:
        return None
    for name in manifest.files:
        if name.startswith(f"{CT2_DIR}/"):
            verified_file(trained.path, manifest, name)
    return trained.path / CT2_DIR


def make_ct2_engine(trained: Trained, device: torch.device) -> ct2.CTranslate2Engine:
    folder = ct2_model_dir(trained)
    if folder is None:
        raise ConfigError(
            f"engine=ctranslate2 needs a package exported with --format ctranslate2; "
            f"{trained.path} has no CTranslate2 model (nmt-export RUN --out DIR "
            "--format ctranslate2)"
        )
    if trained.model is not None:
        max_positions = trained.model.max_positions
    else:  # a CTranslate2-only package
        max_positions = trained.cfg.model.get("max_positions")
    return ct2.CTranslate2Engine(
        folder,
        trained.tokenizers,
        max_positions,
        device,
        threads=torch.get_num_threads(),
        suppress_start=bool(trained.cfg.model.get("suppress_start", False)),
    )


# ------------------------------------------------------------------------------------ probe


def synthetic_data(vocab_size: int, seed: int = 0) -> TokenDataset:
    """PROBE_SENTENCES random sources of PROBE_SOURCE ordinary pieces (no special ids)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab_size, (PROBE_SENTENCES, PROBE_SOURCE), generator=g)
    return TokenDataset(src.tolist(), [[] for _ in range(PROBE_SENTENCES)])


def probe_options(opts: DecodeOptions) -> DecodeOptions:
    """``opts`` decoding exactly PROBE_OUTPUT tokens per sentence: equal work for both."""
    return replace(
        opts, max_output_len_a=0.0, max_output_len_b=PROBE_OUTPUT, min_output_len=PROBE_OUTPUT
    )


def measure(
    engines: dict[str, Engine], data: TokenDataset, opts: DecodeOptions, rounds: int = PROBE_ROUNDS
) -> tuple[dict[str, float], bool]:
    """Sentences/s of each engine on ``data`` (one untimed run each, then ``rounds`` timed runs
    in turns; the median per engine) and whether every round found the same engine faster."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    for engine in engines.values():
        engine.hypotheses(data, opts)
    for _ in range(rounds):
        for name, engine in engines.items():
            start = time.perf_counter()
            engine.hypotheses(data, opts)
            times[name].append(time.perf_counter() - start)
    winners = {min(times, key=lambda name: times[name][r]) for r in range(rounds)}
    speeds = {name: len(data) / statistics.median(t) for name, t in times.items()}
    return speeds, len(winners) == 1


def _cache_key(trained: Trained, opts: DecodeOptions, device: torch.device) -> dict:
    manifest = read_manifest(trained.path)
    return {
        "version": CACHE_VERSION,
        "machine": machine_key(),
        "device": str(device),
        "ctranslate2": ct2.version(),
        "weights": manifest.files.get("ctranslate2/model.bin"),
        "quantization": manifest.ctranslate2.quantization,
        "beam": opts.beam,
    }


ENGINE_CACHE = ChoiceCache("engine", "sentences_per_s", ("torch", "ctranslate2"))


def auto_choice(
    trained: Trained,
    opts: DecodeOptions,
    device: torch.device,
    cache_dir: Path | None,
    make: Callable[[], Engine] | None = None,
    sample: TokenDataset | None = None,
) -> tuple[str, dict[str, float], bool]:
    """(engine name, sentences/s of each, cached?) for ``engine=auto`` on a package holding a
    CTranslate2 model; ``sample``: the sentences to decode, whose first ``PROBE_SAMPLE`` the
    probe decodes (else a synthetic batch, to a fixed length)."""
    if sample is not None and len(sample) > 0:
        data = sample.subset(range(min(PROBE_SAMPLE, len(sample))))
        probe_opts, source = opts, "sample"
    else:
        data = synthetic_data(trained.tokenizers.src.vocab_size)
        probe_opts, source = probe_options(opts), "synthetic"

    def probe() -> Choice:
        engines = {
            "torch": TorchEngine(trained.model, device),
            "ctranslate2": make() if make is not None else make_ct2_engine(trained, device),
        }
        speeds, agree = measure(engines, data, probe_opts)
        if not agree:
            log.warning(
                "engine=auto: the timed rounds disagree on the faster engine (the two are "
                "close, or the machine is busy); not cached, the next run measures again"
            )
        return Choice(max(speeds, key=lambda name: speeds[name]), speeds, agree)

    key = {**_cache_key(trained, opts, device), "probe": source}
    choice = ENGINE_CACHE.choose(cache_dir, key, probe)
    return choice.winner, choice.figures, choice.source is not None


def engine_cache_dir(trained: Trained) -> Path:
    return Path(trained.cfg.data.root) / "cache" / "engine"


def make_engine(
    name: str,
    trained: Trained,
    opts: DecodeOptions,
    device: torch.device,
    sample: TokenDataset | None = None,
) -> Engine:
    """The engine ``name`` (auto | torch | torch-int8 | ctranslate2) for ``trained``;
    ``sample``: the sentences to decode, for the probe of ``auto`` (see the module docstring)."""
    if name not in ENGINE_NAMES:  # the names engine= takes (the config schema's)
        raise ConfigError(f"engine={name!r} is not one of: {', '.join(ENGINE_NAMES)}")
    if opts.samples and (name == "ctranslate2" or trained.model is None):
        only = f" ({trained.path} holds only a CTranslate2 model)" if trained.model is None else ""
        raise ConfigError(
            f"sampling_topk={opts.sampling_topk} samples with our search (engine=torch or "
            "torch-int8), whose draws for a sentence depend on sampling_seed and its line "
            f"only; CTranslate2 draws with a generator shared by its batches{only}"
        )
    if opts.samples and name == "auto":
        return TorchEngine(trained.model, device)
    if trained.model is None:  # a CTranslate2-only package
        if name in ("torch", "torch-int8"):
            raise ConfigError(
                f"{trained.path} holds only a CTranslate2 model: use engine=ctranslate2"
            )
        return make_ct2_engine(trained, device)
    if trained.members:
        if name not in ("torch", "auto"):
            raise ConfigError(
                f"engine={name}: an ensemble decodes with engine=torch, the one engine that "
                "combines several models"
            )
        return TorchEngine(trained.model, device)
    if name == "torch":
        return TorchEngine(trained.model, device)
    if name == "torch-int8":
        return TorchInt8Engine(trained, device)
    if name == "ctranslate2":
        return make_ct2_engine(trained, device)
    if ct2_model_dir(trained) is None or not ct2.available():
        return TorchEngine(trained.model, device)
    ct2_engine = make_ct2_engine(trained, device)
    choice, speeds, cached = auto_choice(
        trained, opts, device, engine_cache_dir(trained), lambda: ct2_engine, sample
    )
    figures = ", ".join(f"{k} {v:,.0f}" for k, v in speeds.items())
    how = "cached" if cached else "measured"
    log.info("engine=auto: %s for beam %d (%s sentences/s, %s)", choice, opts.beam, figures, how)
    return ct2_engine if choice == "ctranslate2" else TorchEngine(trained.model, device)
