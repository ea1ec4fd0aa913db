"""Evaluation: ``nmt-eval`` / ``make eval``.

Decodes test sets with a trained checkpoint (greedy, or beam search with ``beam=K
length_penalty=ALPHA``) and scores the detokenized output against the raw references with
sacreBLEU (BLEU, chrF, TER, each with its signature; BLEU and chrF with sacreBLEU's bootstrap
95% confidence interval: ``bootstrap=1000`` resamples drawn with ``bootstrap_seed=12345``, 0
for none). Beside them, in a field of its own (``bleu_paper``), the BLEU the Multi30k papers
report: lowercased and Moses-tokenized (:func:`nmt.evaluate.metrics.paper_bleu`). By default
the test split(s) of the run's own data config are used; ``test=[...]`` names others, several
at once: file pairs ``src:ref``, or splits of the run's corpus as ``data.test`` names them
(Multi30k's held-out ``test_2017_flickr``, ``test_2017_mscoco``, ``test_2018_flickr``). A
multilingual run is scored in each direction (:mod:`nmt.evaluate.multilingual`: ``test=[...]``
names splits or path prefixes, scored in each direction whose two languages they have;
``zero_shot=[de-fr]`` adds directions it never trained, with a pivot baseline).
On a terminal a bar counts each test set's sentences as they are decoded (``progress=false``:
none). Hypotheses and a JSON of scores, signatures, decoding options and checkpoint go into
``<run>/eval`` (``out=DIR`` elsewhere), named after the checkpoint and the search.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import hydra
from omegaconf import DictConfig

from nmt.atomic import atomic_write_bytes
from nmt.cli import Progress, config_dir, exit_on_error, setup_logging
from nmt.config import ConfigError, EvalSplit, register_configs
from nmt.data.corpus import DataError, read_lines, strip_lines
from nmt.data.datasets import EvalSet, encode_texts, load_test_sets, load_valid_set
from nmt.data.multilingual import directions_of
from nmt.data.tokenizer import TokenizerPair
from nmt.decode.engines import make_engine, translate_texts
from nmt.decode.options import DecodeOptions
from nmt.environment import multi30k_source
from nmt.evaluate.metrics import (
    all_scores,
    check_bootstrap,
    moses_tokenize,
    paper_entry,
    paper_line,
)
from nmt.evaluate.multilingual import evaluate_multilingual
from nmt.runtime.device import setup_device
from nmt.store.loading import Trained, decode_defaults, load_model
from nmt.store.package import is_package, model_argument
from nmt.store.paths import checkpoint_run_dir, resolve_run_dir

log = logging.getLogger(__name__)
register_configs()


def file_test_set(spec: str, tokenizers: TokenizerPair) -> EvalSet:
    """A ``src_file:ref_file`` pair given on the command line."""
    if spec.count(":") != 1:
        raise ConfigError(f"test={spec!r}: expected SOURCE_FILE:REFERENCE_FILE")
    src_file, ref_file = (Path(p) for p in spec.split(":"))
    src, ref = read_lines(src_file), read_lines(ref_file)
    if len(src) != len(ref):
        raise DataError(
            f"{src_file} has {len(src)} lines but {ref_file} has {len(ref)}: "
            "source and reference must be parallel"
        )
    src, ref = strip_lines(src), strip_lines(ref)
    return EvalSet(src_file.name, src, ref, encode_texts(tokenizers, src, ref))


def test_set(spec: str, trained: Trained) -> EvalSet:
    """A ``test=`` entry: a ``src_file:ref_file`` pair, or a split of the run's own corpus by the
    name ``data.test`` would give it (Multi30k: ``test_2017_flickr``, fetched like the others)."""
    if ":" in spec:
        return file_test_set(spec, trained.tokenizers)
    data = trained.cfg.data
    return load_test_sets(data, trained.tokenizers, multi30k_source(), [spec])[0]


def output_dir(cfg: DictConfig, ckpt: Path) -> Path:
    """``out`` if given, else ``eval/`` in the checkpoint's run (or in ``run``); for a model
    package (which may be read-only, and is handed on as it is) ``outputs/eval/<package>``;
    ``eval-valid`` in place of ``eval`` for ``split=valid``."""
    if cfg.out:
        return Path(cfg.out)
    folder = "eval-valid" if cfg.split == EvalSplit.valid else "eval"
    if is_package(ckpt):
        return Path("outputs") / folder / ckpt.resolve().name
    return (checkpoint_run_dir(ckpt) or resolve_run_dir(cfg.run)) / folder


def options_tag(ckpt: Path, opts: DecodeOptions, engine: str = "torch") -> str:
    """File-name tag of a checkpoint and search: ``best.beam1``, ``averaged.beam5.lp0.6``,
    or of sampling: ``best.sample.k0.p0.9.t1.seed3``; another engine than torch adds its name
    (``package.beam1.ctranslate2``)."""
    tag = f"{ckpt.stem}.beam{opts.beam}"
    tag = f"{tag}.lp{opts.length_penalty:g}" if opts.beam > 1 else tag
    if opts.samples:
        tag = (
            f"{ckpt.stem}.sample.k{opts.sampling_topk}.p{opts.sampling_topp:g}"
            f".t{opts.sampling_temperature:g}.seed{opts.sampling_seed}"
        )
    return tag if engine == "torch" else f"{tag}.{engine}"


def output_tag(trained: Trained, opts: DecodeOptions, engine: str, report: dict) -> str:
    """:func:`options_tag` of the model, with ``.ensembleN`` for an ensemble of N, whose
    members are then listed in ``report`` (and printed)."""
    tag = options_tag(trained.path, opts, engine)
    if not trained.members:
        return tag
    report["ensemble"] = [str(p) for p in trained.members]
    print(f"ensemble of {len(trained.members)}: " + ", ".join(map(str, trained.members)))
    return f"{tag}.ensemble{len(trained.members)}"


def unique_names(sets: list[EvalSet]) -> None:
    """Rename sets that share a name (``a/test.de`` and ``b/test.de``): ``test.de.2``."""
    seen: dict[str, int] = {}
    for ds in sets:
        count = seen[ds.name] = seen.get(ds.name, 0) + 1
        if count > 1:
            ds.name = f"{ds.name}.{count}"


def evaluate(cfg: DictConfig) -> dict:
    """Decode and score every test set; returns the report also written as JSON."""
    check_bootstrap(cfg.bootstrap, cfg.bootstrap_seed, "bootstrap", "bootstrap_seed")
    if cfg.split == EvalSplit.valid and cfg.test:
        raise ConfigError("split=valid scores the run's validation split and test=[...] names "
                          "files to score instead: give one of them")  # fmt: skip
    device = setup_device(cfg.device, cfg.tf32)
    trained = load_model(cfg, device)
    path = trained.path
    opts = DecodeOptions.from_config(cfg, decode_defaults(trained))
    out_dir = output_dir(cfg, path)
    if directions_of(trained.cfg.data):
        return _multilingual(cfg, trained, opts, out_dir)
    if cfg.zero_shot:
        raise ConfigError(f"zero_shot={list(cfg.zero_shot)}: {path} is not a multilingual model")
    if cfg.test:
        sets = [test_set(spec, trained) for spec in cfg.test]
    elif cfg.split == EvalSplit.valid:
        sets = [load_valid_set(trained.cfg.data, trained.tokenizers, multi30k_source())]
    else:
        sets = load_test_sets(trained.cfg.data, trained.tokenizers, multi30k_source())
    unique_names(sets)
    for ds in sets:
        if len(ds) == 0:
            raise DataError(f"test set {ds.name} has no sentences")
    engine = make_engine(cfg.engine, trained, opts, device, sample=sets[0].data)
    print(f"{'package' if is_package(path) else 'checkpoint'} {path} (step {trained.step})")
    print(f"engine: {engine.name}")
    print("decoding: " + " ".join(f"{k}={v}" for k, v in asdict(opts).items()))
    if cfg.bootstrap:
        print(
            f"95% confidence intervals: sacreBLEU bootstrap, {cfg.bootstrap} resamples, "
            f"seed {cfg.bootstrap_seed}"
        )
    report: dict = {
        "checkpoint": str(path),
        "step": trained.step,
        "engine": engine.name,
        "options": asdict(opts),
        "direction": f"{trained.cfg.data.src_lang}-{trained.cfg.data.tgt_lang}",
        "sets": {},
    }
    tag = output_tag(trained, opts, engine.name, report)
    lang = trained.cfg.data.tgt_lang
    progress = Progress(cfg.progress)
    for ds in sets:
        start = time.perf_counter()
        with progress.bar(ds.name, len(ds)) as advance:
            hyps = translate_texts(engine, ds.data, trained, opts, advance=advance)
        seconds = time.perf_counter() - start
        scores = all_scores(hyps, ds.ref_text, cfg.bootstrap, cfg.bootstrap_seed)
        ref_tokens = moses_tokenize(ds.ref_text, lang)
        paper = paper_entry(hyps, ref_tokens, lang, cfg.bootstrap, cfg.bootstrap_seed)
        hyp_file = out_dir / f"{ds.name}.{tag}.hyp"
        atomic_write_bytes(hyp_file, "".join(h + "\n" for h in hyps).encode("utf-8"))
        ref_file = out_dir / f"{ds.name}.ref"  # what nmt-compare pairs hypotheses with
        atomic_write_bytes(ref_file, "".join(r + "\n" for r in ds.ref_text).encode("utf-8"))
        print(f"{ds.name}: {len(hyps)} sentences in {seconds:.1f}s -> {hyp_file}")
        for s in scores:
            print(f"  {s.line()}")
        print(f"  {paper_line(paper)}")
        report["sets"][ds.name] = {
            "sentences": len(hyps),
            "seconds": seconds,
            "hypotheses": str(hyp_file),
            "references": str(ref_file),
            "scores": {s.name: s.as_dict() for s in scores},
            "bleu_paper": paper,
        }
    score_file = out_dir / f"scores.{tag}.json"
    atomic_write_bytes(score_file, json.dumps(report, indent=2).encode("utf-8"))
    print(f"scores written to {score_file}")
    return report


def _multilingual(cfg: DictConfig, trained: Trained, opts: DecodeOptions, out_dir: Path) -> dict:
    """:func:`evaluate` of a multilingual run (:mod:`nmt.evaluate.multilingual`)."""
    print(f"checkpoint {trained.path} (step {trained.step})")
    print("engine: torch")
    print("decoding: " + " ".join(f"{k}={v}" for k, v in asdict(opts).items()))
    report = {"checkpoint": str(trained.path), "step": trained.step, "engine": "torch",
              "options": asdict(opts)}  # fmt: skip
    tag = output_tag(trained, opts, "torch", report)
    report.update(evaluate_multilingual(cfg, trained, opts, out_dir, tag))
    score_file = out_dir / f"scores.{tag}.json"
    atomic_write_bytes(score_file, json.dumps(report, indent=2).encode("utf-8"))
    print(f"scores written to {score_file}")
    return report


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="eval")
def _main(cfg: DictConfig) -> None:
    setup_logging()
    cfg.run = str(resolve_run_dir(cfg.run))
    with exit_on_error(log):
        evaluate(cfg)


def main() -> None:
    sys.argv[1:] = model_argument(sys.argv[1:])
    _main()


if __name__ == "__main__":
    main()
