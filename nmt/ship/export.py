"""Writing model packages: ``nmt-export`` / ``make export``, and the model card.

The layout and the torch-free reading of a package are in :mod:`nmt.store.package`, loading
its PyTorch model in :mod:`nmt.store.loading`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml

from nmt.atomic import atomic_write_bytes, fsync_dir, sha256_file
from nmt.cli import exit_on_error, setup_logging
from nmt.config import ConfigError, to_container
from nmt.decode.options import DecodeOptions
from nmt.ship.card_languages import (
    card_directions,
    card_languages,
    direction_results,
    direction_score_lines,
    hf_language_use,
    index_metrics,
    package_languages,
)
from nmt.ship.hf import HF_FILES, forces_first
from nmt.store.loading import Trained, decode_defaults, load_package, load_trained, unique_weights
from nmt.store.package import (
    CARD,
    CONFIG,
    CT2_DIR,
    FORMAT,
    FORMATS,
    MANIFEST,
    MULTI30K_LICENCE,
    QUANTIZATIONS,
    WEIGHTS,
    is_package,
    read_package,
    tokenizer_files,
    verified_file,
)
from nmt.store.paths import checkpoint_path, checkpoint_run_dir, resolve_run_dir

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------- weights


# ---------------------------------------------------------------------------------- writing


def package_config(trained: Trained) -> dict[str, Any]:
    """The run's config as plain data, with ``decode`` set to how the run is meant to be
    decoded (its config.yaml over the checkpoint's)."""
    raw = to_container(trained.cfg)
    decode = decode_defaults(trained)
    if decode is not None:
        raw["decode"] = to_container(decode)
    return raw


def eval_reports(trained: Trained) -> list[dict[str, Any]]:
    """The ``nmt-eval`` score files of the checkpoint's run that scored this checkpoint."""
    run_dir = checkpoint_run_dir(trained.path)
    if run_dir is None or not (run_dir / "eval").is_dir():
        return []
    reports = []
    for path in sorted((run_dir / "eval").glob("scores.*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        same = Path(str(report.get("checkpoint", ""))).resolve() == trained.path.resolve()
        if same and report.get("step") == trained.step:
            reports.append(report)
    return reports


def training_command(trained: Trained) -> str:
    run_dir = checkpoint_run_dir(trained.path)
    summary = run_dir / "summary.json" if run_dir is not None else None
    if summary is not None and summary.is_file():
        try:
            overrides = json.loads(summary.read_text(encoding="utf-8")).get("overrides", [])
            return " ".join(["nmt-train", *map(str, overrides)])
        except (OSError, json.JSONDecodeError):
            pass
    return "not recorded (the run has no summary.json); config.yaml holds the whole config"


def front_matter(trained: Trained, licence: str | None, hf_arch: str | None) -> list[str]:
    """The model card's YAML front matter, as the Hugging Face Hub reads it: languages, the
    licence of the data, the data set, tags, and a model-index with every recorded score and
    its sacreBLEU signature. ``hf_arch``: the transformers class of an ``--format hf`` folder."""
    d, arch = trained.cfg.data, trained.cfg.model.arch
    multi30k = d.corpus == "multi30k" and licence is None
    meta: dict[str, Any] = {"language": card_languages(trained.cfg)}
    if multi30k:  # the data's own terms, which this model does not relicense
        meta.update(license="other", license_name="multi30k-flickr30k-terms")
        meta["license_link"] = "https://github.com/multi30k/dataset"
        meta["datasets"] = ["multi30k"]
    else:  # stated in the card's Data section (--data-licence), else unknown
        meta["license"] = "other" if licence is not None else "unknown"
    meta["library_name"] = "transformers" if hf_arch else "nmt"
    meta["pipeline_tag"] = "translation"
    pair = "multilingual" if package_languages(trained.cfg) else f"{d.src_lang}-{d.tgt_lang}"
    tags = ["translation", "nmt", arch, *card_directions(trained.cfg, [pair])]
    if hf_arch:
        tags.append(HF_TAGS[hf_arch])
    meta["tags"] = tags
    results = []
    task = {"type": "translation", "name": f"Translation {d.src_lang}-{d.tgt_lang}"}
    for report in eval_reports(trained):
        opts = report.get("options", {})
        search = f"beam {opts.get('beam')}, length penalty {opts.get('length_penalty')}"
        for name, entry in report.get("sets", {}).items():
            metrics = index_metrics(entry.get("scores", {}), search)
            results.append(
                {
                    "task": task,
                    "dataset": {"name": str(name), "type": str(d.corpus)},
                    "metrics": metrics,
                }
            )
        results += direction_results(report, str(d.corpus), search)
    if results:
        title = f"{arch}-{pair}-step{trained.step}"
        meta["model-index"] = [{"name": title, "results": results}]
    body = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1000)
    return ["---", *body.rstrip("\n").split("\n"), "---", ""]


def model_card(
    trained: Trained,
    decode: dict[str, Any],
    licence: str | None,
    ct2: dict | None,
    hf_arch: str | None = None,
) -> str:
    """The package's README.md (``hf_arch``: that of an ``--format hf`` folder)."""
    d = trained.cfg.data
    matter = front_matter(trained, licence, hf_arch)
    if licence is None:
        licence = (
            MULTI30K_LICENCE
            if d.corpus == "multi30k"
            else "not recorded: the model was trained on the user's own corpus "
            "(nmt-export --data-licence states it)"
        )
    use = _card_hf_use(trained, decode, hf_arch) if hf_arch else _CARD_USE
    if hf_arch == "M2M100ForConditionalGeneration":
        from nmt.ship.hf_m2m100 import card_use

        use = card_use(trained.cfg, trained.tokenizers, decode)
    pairs = ", ".join(card_directions(trained.cfg, [f"{d.src_lang}->{d.tgt_lang}"]))
    lines = [
        *matter,
        *_card_model(trained, decode, ct2),
        "",
        "## Data",
        "",
        f"- corpus: {d.corpus} ({pairs}), train `{d.train}`, "
        f"valid `{d.valid}`, test {', '.join(f'`{t}`' for t in d.test)}",
        f"- licence of the data: {licence}",
        "",
        "## Training command",
        "",
        "```",
        training_command(trained),
        "```",
        "",
        *_card_scores(trained),
        *use,
    ]
    return "\n".join(lines)


# the Hub's tag of each architecture an --format hf folder holds
HF_TAGS = {"MarianMTModel": "marian", "PegasusForConditionalGeneration": "pegasus",
           "M2M100ForConditionalGeneration": "m2m_100"}  # fmt: skip
# the model card's line on where a multilingual model's language tags go
PLACEMENT_LINES = {
    "source": "the target language's tag goes on the source (`tgt_lang=` names it)",
    "target": "the target language's tag is the first output token (`tgt_lang=` names it)",
    "both": "the source starts with its language's tag and the output with the target's "
    "(`src_lang=` and `tgt_lang=` name them)",
}
_CARD_USE = [
    "## Use",
    "",
    "```",
    "nmt-translate model=<this folder> input=FILE output=FILE",
    "nmt-eval model=<this folder> 'test=[src.txt:ref.txt]'",
    "nmt-serve model=<this folder> port=8080",
    "```",
    "",
]


# ((5 + n) / 6) ** alpha has the slope (in log n) of n ** (alpha * n / (5 + n)): transformers'
# length_penalty that matches ours at n = 15 output tokens, about a Multi30k sentence
HF_SLOPE = 15 / (5 + 15)
# the card's recipe for transformers' beam ranked by our length penalty (`tok`, `model` and
# `batch` as the card's first example makes them); tests/test_hf_export.py runs it
HF_RERANK = (
    "import torch",
    "k, alpha = model.generation_config.num_beams, model.generation_config.length_penalty",
    "out = model.generate(**batch, num_return_sequences=k, output_scores=True,",
    "                     return_dict_in_generate=True)",
    "ended = out.sequences[:, 1:] == model.generation_config.eos_token_id",
    "n = ended.int().argmax(1) + 1  # output tokens up to the first EOS, EOS included",
    "nmt_scores = out.sequences_scores * n**alpha / ((5 + n) / 6) ** alpha",
    "best = nmt_scores.view(-1, k).argmax(1) + torch.arange(0, len(n), k)",
    "print(tok.batch_decode(out.sequences[best], skip_special_tokens=True))",
)


def _card_hf_use(trained: Trained, decode: dict[str, Any], hf_arch: str) -> list[str]:
    """How an ``--format hf`` folder is used, and what transformers cannot express."""
    opts = DecodeOptions.of_run(decode)
    a, b = opts.max_output_len_a, opts.max_output_len_b
    multi, example = hf_language_use(trained.cfg)
    return [
        "## Use with transformers",
        "",
        f"A `{hf_arch}` (no custom code): the same function as the nmt model, tested to 1e-4 in",
        "log-probability, and a `MarianTokenizer` over the model's sentencepiece model(s) that",
        "gives its token ids.",
        *multi,
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        'tok = AutoTokenizer.from_pretrained("<this folder>")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("<this folder>")',
        *example,
        "print(tok.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        "```",
        "",
        "`generation_config.json` holds the nmt decoding defaults: "
        f"`num_beams={opts.beam}`, `length_penalty={opts.length_penalty}`, EOS forced at the "
        "length cap, BOS as the decoder start token. What transformers cannot express:",
        "",
        f"- the output cap per sentence, `{a} * source tokens + {b}` (EOS included in the "
        "source, excluded from the output): transformers has one `max_length`, set here to the "
        "cap of the longest source training kept; pass "
        f"`max_new_tokens=int({a} * len(input_ids) + {b}) + {1 + forces_first(trained.cfg)}` "
        "per sentence for the nmt cap;",
        "- the GNMT length penalty `((5 + n) / 6) ** alpha` (n: output tokens, EOS included): "
        "transformers ranks a finished hypothesis by its summed log-probability over "
        "`n ** alpha`, so plain `generate` with beam search may return another of the beam's "
        "hypotheses than nmt does (greedy search is identical); to rank them as nmt does, see "
        "below;",
        "- the nmt beam search's stopping rule (no alive hypothesis can still win) against "
        "transformers' `early_stopping` heuristics;",
        "- the sentencepiece model's control pieces typed in the text (`</s>`, `<pad>`, `<unk>`) "
        "are special tokens to transformers, plain text to nmt.",
        "",
        "The beam ranked by the nmt length penalty: all of it from `generate`, its summed "
        "log-probabilities (the scores times `n ** alpha`), the best of each sentence under "
        "`((5 + n) / 6) ** alpha`:",
        "",
        "```python",
        *HF_RERANK,
        "```",
        "",
        "An output cut at the length cap ends in a forced EOS, which `generate` scores 0 where "
        "nmt adds the model's log-probability of EOS there (a teacher-forced pass gives it). "
        "What remains different is which finished hypotheses transformers keeps in its beam "
        "and when it stops: passing `generate` also "
        f"`length_penalty={HF_SLOPE * opts.length_penalty:g}` (the slope of the nmt penalty at 15 "
        'output tokens) and `early_stopping="never"` brings both closer to nmt\'s; '
        "`make check-hf` measures these rankings on the run's test set.",
        "",
    ]


def _card_model(trained: Trained, decode: dict[str, Any], ct2: dict | None) -> list[str]:
    """The model card's "Model" section."""
    m, d = trained.cfg.model, trained.cfg.data
    sizes = ", ".join(f"{k}={v}" for k, v in m.items() if k != "arch")
    opts = DecodeOptions.of_run(decode)
    lines = [
        f"# {m.arch} {' '.join(card_directions(trained.cfg, [f'{d.src_lang}->{d.tgt_lang}']))} "
        "(nmt model package)",
        "",
        "## Model",
        "",
        f"- architecture: `{m.arch}` ({sizes})",
        f"- parameters: {trained.model.num_parameters():,} (a tied matrix counted, and stored, "
        "once)",
        f"- training step: {trained.step}; source checkpoint: `{trained.path.name}`",
        f"- vocabulary: sentencepiece {d.spm_model_type}, "
        f"{'one joint model' if trained.tokenizers.joint else 'one model per side'}, "
        f"{trained.tokenizers.src.vocab_size} / {trained.tokenizers.tgt.vocab_size} pieces",
        f"- decoding defaults: beam {opts.beam}, length penalty {opts.length_penalty}",
    ]
    languages = package_languages(trained.cfg)
    if languages:
        lines.append(
            f"- multilingual: {', '.join(languages['directions'])}; "
            + PLACEMENT_LINES[languages["tag_placement"]]
        )
    if ct2 is not None:
        lines.append(
            f"- CTranslate2 model in `ctranslate2/`: {ct2['quantization']} weights, "
            f"written by CTranslate2 {ct2['version']}"
        )
    return lines


def _card_scores(trained: Trained) -> list[str]:
    """The model card's "Scores" section: the run's evaluations with their signatures."""
    lines = ["## Scores", ""]
    reports = eval_reports(trained)
    if not reports:
        lines += [
            "Not evaluated before export: `nmt-eval model=<this folder>` scores it (sacreBLEU).",
            "",
        ]
    for report in reports:
        opts = report.get("options", {})
        search = f"beam {opts.get('beam')}, length penalty {opts.get('length_penalty')}"
        for name, entry in report.get("sets", {}).items():
            lines += [f"{name} ({entry.get('sentences')} sentences, {search}):", ""]
            for metric, s in entry.get("scores", {}).items():
                score = s.get("score", float("nan"))
                lines.append(f"- {metric} {score:.2f} `{s.get('signature')}`")
            lines.append("")
        lines += direction_score_lines(report, search)
    return lines


def source_name(ckpt: Path) -> str:
    """``<run>/checkpoints/<file>`` of a checkpoint in a run, else its file name: the package
    names where it came from without the paths of the machine that wrote it."""
    run_dir = checkpoint_run_dir(ckpt)
    return f"{run_dir.name}/checkpoints/{ckpt.name}" if run_dir is not None else ckpt.name


def export_package(
    ckpt: Path,
    out: Path,
    *,
    fmt: str = "torch",
    quantize: str | None = None,
    licence: str | None = None,
    force: bool = False,
    ctranslate2_only: bool = False,
) -> Path:
    """Write the package of checkpoint ``ckpt`` into the folder ``out`` (created whole, then
    moved into place, so a failed export leaves nothing under ``out``). ``ctranslate2_only``
    leaves the PyTorch weights out: the smallest package, decoded by CTranslate2 alone."""
    out = Path(out)
    _check_export_options(out, fmt, quantize, force, ctranslate2_only)
    if fmt == "hf":
        return export_hf(ckpt, out, licence=licence)
    trained = load_trained(Path(ckpt), torch.device("cpu"))
    ct2 = None
    if fmt == "ctranslate2":
        from nmt.decode import ct2 as ct2_module
        from nmt.ship.ctranslate2 import check_exportable

        check_exportable(trained.cfg)
        ct2 = {"quantization": quantize or "float32", "version": ct2_module.version()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write_package(tmp, trained, Path(ckpt), licence, ct2, ctranslate2_only)
        # what was written loads through the gate
        files = read_package(tmp)
        for name in files.manifest.files:
            verified_file(tmp, files.manifest, name)
        if not ctranslate2_only:
            load_package(tmp, torch.device("cpu"))
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _move_into_place(tmp: Path, out: Path) -> None:
    """Put the finished, checked folder ``tmp`` at ``out`` (replacing what ``--force`` allowed
    to be there) by a rename, and make the rename durable."""
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    fsync_dir(out.parent)


def _check_export_options(
    out: Path, fmt: str, quantize: str | None, force: bool, ctranslate2_only: bool
) -> None:
    """Refuse option combinations that cannot be exported, and an ``out`` that is in the way."""
    if ctranslate2_only and fmt != "ctranslate2":
        raise ConfigError("--ctranslate2-only needs --format ctranslate2")
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is not one of: {', '.join(FORMATS)}")
    if quantize is not None and fmt != "ctranslate2":
        raise ConfigError("--quantize applies to --format ctranslate2 only")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ConfigError(f"--quantize {quantize!r} is not one of: {', '.join(QUANTIZATIONS)}")
    if fmt == "hf":
        if out.exists() and not (force and is_hf_folder(out)):
            why = "use --force to replace it" if is_hf_folder(out) else "and is not one"
            raise ConfigError(f"--out {out} already exists ({why}): --format hf writes a folder")
        return
    if out.exists() and not (force and is_package(out)):
        why = "use --force to replace it" if is_package(out) else "and is not a package"
        raise ConfigError(f"--out {out} already exists ({why})")


def is_hf_folder(path: Path) -> bool:
    """Whether ``path`` is a folder that ``--format hf`` wrote (a transformers model)."""
    return all((path / name).is_file() for name in (*HF_FILES, CARD))


def export_hf(source: Path, out: Path, *, licence: str | None = None) -> Path:
    """Write the transformers folder of ``source`` (a checkpoint or a package) into ``out``:
    written whole in a temporary folder, loaded back with transformers and compared with our
    model (:func:`nmt.ship.hf.verify_folder`), then moved into place, so a failed or killed
    export leaves nothing under ``out``."""
    from nmt.ship import hf, hf_m2m100

    hf.require()
    source = Path(source)
    cpu = torch.device("cpu")
    trained = load_package(source, cpu) if is_package(source) else load_trained(source, cpu)
    # a run imported from M2M100 or NLLB goes back to its folder's layout
    conv: Any = hf if trained.tokenizers.origin is None else hf_m2m100
    conv.check_exportable(trained.cfg, trained.tokenizers)
    decode = package_config(trained)["decode"]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model: Any = trained.model
        conv.write_folder(model, trained.tokenizers, trained.cfg, decode, tmp)
        card = model_card(trained, decode, licence, None, hf_arch=conv.architecture(model))
        atomic_write_bytes(tmp / CARD, card.encode("utf-8"))
        conv.verify_folder(model, trained.tokenizers, tmp, trained.cfg)
        for path in tmp.iterdir():  # what transformers wrote, durable before the rename
            with path.open("rb") as f:
                os.fsync(f.fileno())
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_package(
    tmp: Path,
    trained: Trained,
    ckpt: Path,
    licence: str | None,
    ct2: dict | None,
    ctranslate2_only: bool,
) -> None:
    """Every file of the package into the folder ``tmp``, the manifest (with each file's
    sha256) last."""
    config = package_config(trained)
    atomic_write_bytes(tmp / CONFIG, yaml.safe_dump(config, sort_keys=False).encode("utf-8"))
    if not ctranslate2_only:
        from safetensors.torch import save_file

        save_file(unique_weights(trained.model), str(tmp / WEIGHTS), metadata={"format": "pt"})
    toks = trained.tokenizers
    protos = [toks.src.proto] if toks.joint else [toks.src.proto, toks.tgt.proto]
    for name, proto in zip(tokenizer_files(toks.joint), protos, strict=True):
        atomic_write_bytes(tmp / name, proto)
    if ct2 is not None:
        from nmt.ship.ctranslate2 import convert

        convert(trained.model, toks, tmp / CT2_DIR, ct2["quantization"])
    card = model_card(trained, config["decode"], licence, ct2)
    atomic_write_bytes(tmp / CARD, card.encode("utf-8"))
    written = [p for p in sorted(tmp.rglob("*")) if p.is_file()]
    manifest = {
        "format": FORMAT,
        "arch": trained.cfg.model.arch,
        "step": trained.step,
        "joint_vocab": toks.joint,
        "parameters": trained.model.num_parameters(),
        "source_checkpoint": source_name(ckpt),
        "source_sha256": sha256_file(ckpt),
        "files": {p.relative_to(tmp).as_posix(): sha256_file(p) for p in written},
        "ctranslate2": ct2,
        "torch_weights": not ctranslate2_only,
        **package_languages(trained.cfg),
    }
    atomic_write_bytes(tmp / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"))


# ---------------------------------------------------------------------------------- command


def make_parser() -> argparse.ArgumentParser:
    """``nmt-export``'s command line."""
    p = argparse.ArgumentParser(
        prog="nmt-export",
        description="Write a trained model as a self-contained package (safetensors weights, "
        "config, sentencepiece models, model card; optionally a CTranslate2 model), or with "
        "--format hf as a Hugging Face transformers model folder.",
    )
    p.add_argument(
        "run",
        nargs="?",
        default="outputs/latest",
        help="run directory (or, with --format hf, a package)",
    )
    p.add_argument(
        "--ckpt", help="checkpoint file or name (best, last, averaged); default: as nmt-eval"
    )
    p.add_argument("--out", required=True, help="the package folder to write")
    p.add_argument("--format", default="torch", choices=FORMATS, dest="fmt")
    p.add_argument(
        "--quantize",
        choices=QUANTIZATIONS,
        help="CTranslate2 weight type (default float32); --format ctranslate2 only",
    )
    p.add_argument(
        "--ctranslate2-only",
        action="store_true",
        help="leave out the PyTorch weights (only engine=ctranslate2 decodes the package)",
    )
    p.add_argument("--data-licence", help="the licence of the training data, for the model card")
    p.add_argument("--force", action="store_true", help="replace an existing package at --out")
    return p


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = make_parser().parse_args(argv)
    with exit_on_error(log):
        if is_package(args.run) and not args.ckpt:
            if args.fmt != "hf":
                raise ConfigError(f"{args.run} is a package already: only --format hf reads one")
            ckpt = Path(args.run)
        else:
            ckpt = checkpoint_path(resolve_run_dir(args.run), args.ckpt)
        out = export_package(
            ckpt,
            Path(args.out),
            fmt=args.fmt,
            quantize=args.quantize,
            licence=args.data_licence,
            force=args.force,
            ctranslate2_only=args.ctranslate2_only,
        )
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"package {out} ({size / 2**20:.1f} MiB) from {ckpt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
