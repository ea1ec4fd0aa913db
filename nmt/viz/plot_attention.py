"""Attention of a trained model, as heatmaps or as an explorer page: ``nmt-attention`` /
``make attention``.

::

    nmt-attention run=outputs/latest "sentence=Ein Mann fährt Fahrrad."
    nmt-attention ckpt=run/checkpoints/best.pt input=sentences.de out=plots layers=all
    nmt-attention format=html input=test.de references=test.en

For the k-th sentence it writes ``<out>/sent<k>/<view>.png`` (the views of
:mod:`nmt.viz.visualize`: the alignment ``cross``, and for the Transformer every decoder layer's
cross-attention plus the chosen self-attention layers) and a line
``sent<k> TAB source TAB translation`` in ``<out>/translations.tsv``. ``out`` defaults to
``<run dir>/attention``. With ``format=html`` it writes one self-contained page instead,
``<out>/explorer.html`` (:mod:`nmt.viz.explorer`), with the sentence BLEU of each translation where
``reference`` (with ``sentence``) or ``references`` (a file parallel to ``input``) is given.
The values of ``sentence`` and ``reference`` may be given unquoted: they are quoted for
Hydra's override parser, which rejects spaces, most punctuation and non-ASCII letters.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from nmt.atomic import atomic_write_bytes
from nmt.cli import config_dir, exit_on_error, setup_logging
from nmt.config import ConfigError, register_configs
from nmt.data.batching import make_batch
from nmt.data.corpus import read_lines
from nmt.decode.languages import choose_target, target_dataset
from nmt.decode.options import DecodeOptions
from nmt.runtime.device import setup_device
from nmt.store.loading import Trained, load_model
from nmt.store.package import is_package, model_argument
from nmt.store.paths import checkpoint_run_dir, resolve_run_dir
from nmt.viz.explorer import document, explore_sentences, model_info, write_html
from nmt.viz.visualize import attend, save_png, sentence_views, view_title

log = logging.getLogger(__name__)
register_configs()

BATCH_SENTENCES = 16
FREE_TEXT_KEYS = ("sentence", "reference")
_BEFORE_QUOTE = re.compile(r"(\\*)'")  # a quote and the backslashes before it
_BACKSLASHES_AT_END = re.compile(r"(\\+)$")


def _references(cfg: DictConfig, n_lines: int) -> list[str] | None:
    """The lines of ``reference=`` / ``references=``, one per input line; None without."""
    if cfg.sentence is not None and cfg.references is not None:
        raise ConfigError("references=FILE goes with input=FILE; with sentence= give reference=")
    if cfg.input is not None and cfg.reference is not None:
        raise ConfigError("reference= goes with sentence=; with input=FILE give references=FILE")
    if cfg.reference is not None:
        return [str(cfg.reference).strip()]
    if cfg.references is None:
        return None
    refs = read_lines(Path(cfg.references))
    if len(refs) != n_lines:
        raise ConfigError(
            f"references={cfg.references} has {len(refs)} lines but input={cfg.input} has "
            f"{n_lines}: give one reference per input line"
        )
    return [line.strip() for line in refs]


def read_inputs(cfg: DictConfig) -> tuple[list[str], list[str] | None]:
    """The non-empty sentences of ``sentence=`` or ``input=`` (at most ``max_sentences``) and
    their references, if any (see :func:`_references`)."""
    if cfg.sentence is not None and cfg.input is not None:
        raise ConfigError("give either sentence=... or input=FILE, not both")
    if cfg.sentence is not None:
        lines, given = [str(cfg.sentence)], f"sentence={str(cfg.sentence)!r}"
    elif cfg.input is not None:
        lines, given = read_lines(Path(cfg.input)), f"input={cfg.input}"
    else:
        raise ConfigError("nothing to plot: give sentence='...' or input=FILE")
    refs = _references(cfg, len(lines))
    kept = [i for i, line in enumerate(lines) if line.strip()][: cfg.max_sentences]
    if not kept:
        raise ConfigError(f"{given}: no non-empty sentence to translate")
    sentences = [lines[i].strip() for i in kept]
    return sentences, None if refs is None else [refs[i] for i in kept]


def check_request(cfg: DictConfig) -> DecodeOptions:
    """Refuse a wrong ``format``, a bad decoding option or a missing run before any model is
    loaded; returns the decoding options (greedy: a run's beam is not taken)."""
    opts = DecodeOptions.from_config(cfg)
    if opts.beam != 1:
        raise ConfigError(f"beam={opts.beam}: the attention drawn is greedy search's (beam=1)")
    if not cfg.ckpt and not cfg.get("model_dir") and not resolve_run_dir(cfg.run).is_dir():
        raise ConfigError(
            f"run={cfg.run}: no such run directory (train a model first, or give ckpt=FILE)"
        )
    return opts


def output_dir(cfg: DictConfig, ckpt: Path) -> Path:
    """``out``, or ``attention/`` in the run directory the checkpoint belongs to."""
    if cfg.out:
        return Path(cfg.out)
    if is_package(ckpt):  # a package is handed on as it is: nothing is written into it
        return Path("outputs") / "attention" / ckpt.resolve().name
    return (checkpoint_run_dir(ckpt) or ckpt.resolve().parent) / "attention"


def plot_sentences(
    trained: Trained,
    sentences: list[str],
    cfg: DictConfig,
    opts: DecodeOptions,
    out: Path,
    device: torch.device,
) -> list[Path]:
    """Write every view of every sentence as PNG, and the translations; returns the PNGs."""
    tokenizers = trained.tokenizers
    target = choose_target(trained.cfg, tokenizers, cfg.tgt_lang, cfg.src_lang)
    data = target_dataset(tokenizers, sentences, target)
    multilingual = target.tag is not None
    written, rows = [], []
    for start in range(0, len(sentences), BATCH_SENTENCES):
        index = list(range(start, min(start + BATCH_SENTENCES, len(sentences))))
        batch = make_batch(data, index).to(device)
        forced = None if data.forced is None else torch.from_numpy(data.forced[index]).to(device)
        decoded = attend(trained.model, batch.src, batch.src_lens, opts, forced=forced)
        for k, sent in zip(index, decoded, strict=True):
            folder = out / f"sent{k:03d}"
            for view in sentence_views(sent, tokenizers, cfg.layers):
                title = view_title(view, trained.step, k)
                if multilingual:  # the direction on the title's second line
                    title += f" [{target.label}]"
                written.append(save_png(view, title, folder / f"{view.name}.png", cfg.dpi))
            hypothesis = tokenizers.tgt.decode(sent.hypothesis.tokens)
            rows.append(f"sent{k:03d}\t{sentences[k]}\t{hypothesis}\n")
            log.info("sent%03d: %s -> %s", k, sentences[k], hypothesis)
    atomic_write_bytes(out / "translations.tsv", "".join(rows).encode("utf-8"))
    return written


def write_explorer(
    trained: Trained,
    sentences: list[str],
    references: list[str] | None,
    cfg: DictConfig,
    opts: DecodeOptions,
    out: Path,
    device: torch.device,
) -> Path:
    """Write ``<out>/explorer.html`` for the sentences (see :mod:`nmt.viz.explorer`); a
    multilingual model's are marked with the direction, ``[de-fr]``, as in training."""
    target = choose_target(trained.cfg, trained.tokenizers, cfg.tgt_lang, cfg.src_lang)
    data = target_dataset(trained.tokenizers, sentences, target)
    shown = sentences
    if target.tag is not None:
        shown = [f"[{target.label}] {s}" for s in sentences]
    records = explore_sentences(
        trained.model, trained.tokenizers, shown, references, device, opts, data
    )
    for k, record in enumerate(records):
        log.info("sent%03d: %s -> %s", k, record["source"], record["hypothesis"])
    steps = [{"step": trained.step, "note": "", "sentences": records}]
    doc = document(model_info(trained.cfg, str(trained.path)), steps, join_words=cfg.words)
    path = write_html(out / "explorer.html", doc)
    log.info("wrote the attention explorer of %d sentence(s): %s", len(records), path)
    return path


def plot_attention(cfg: DictConfig) -> list[Path]:
    """Load the run's checkpoint and draw the configured sentences; returns the files written
    (the PNGs, or with ``format=html`` the explorer page)."""
    sentences, references = read_inputs(cfg)
    opts = check_request(cfg)
    device = setup_device(cfg.device, cfg.tf32)
    trained = load_model(cfg, device)
    out = output_dir(cfg, trained.path)
    if cfg.format == "html":
        return [write_explorer(trained, sentences, references, cfg, opts, out, device)]
    written = plot_sentences(trained, sentences, cfg, opts, out, device)
    log.info("wrote %d heatmaps for %d sentence(s) to %s", len(written), len(sentences), out)
    return written


def _quoted(value: str) -> bool:
    return len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""


def quote_free_text(args: list[str]) -> list[str]:
    """``sentence=Ein Mann fährt.`` -> ``sentence='Ein Mann fährt.'`` (escaped for Hydra)."""
    quoted = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+~") in FREE_TEXT_KEYS and not _quoted(value):
            escaped = _BACKSLASHES_AT_END.sub(r"\1\1", _BEFORE_QUOTE.sub(r"\1\1\\'", value))
            arg = f"{key}='{escaped}'"
        quoted.append(arg)
    return quoted


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="attention")
def _main(cfg: DictConfig) -> None:
    setup_logging()
    with exit_on_error(log):
        plot_attention(cfg)


def main() -> None:
    sys.argv[1:] = quote_free_text(model_argument(sys.argv[1:]))
    _main()


if __name__ == "__main__":
    main()
