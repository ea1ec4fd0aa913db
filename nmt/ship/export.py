"""Writing model packages: ``nmt-export`` / ``make export``, and the model card.

The layout and the torch-free reading of a package are in :mod:`nmt.store.package`, loading
its PyTorch model in :mod:`nmt.store.loading`.
"""

from __future__ import annotations

import argparse
import json
import logging
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


def model_card(
    trained: Trained, decode: dict[str, Any], licence: str | None, ct2: dict | None
) -> str:
    """The package's README.md."""
    d = trained.cfg.data
    if licence is None:
        licence = (
            MULTI30K_LICENCE
            if d.corpus == "multi30k"
            else "not recorded: the model was trained on the user's own corpus "
            "(nmt-export --data-licence states it)"
        )
    lines = [
        *_card_model(trained, decode, ct2),
        "",
        "## Data",
        "",
        f"- corpus: {d.corpus} ({d.src_lang}->{d.tgt_lang}), train `{d.train}`, "
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
        "## Use",
        "",
        "```",
        "nmt-translate model=<this folder> input=FILE output=FILE",
        "nmt-eval model=<this folder> 'test=[src.txt:ref.txt]'",
        "nmt-serve model=<this folder> port=8080",
        "```",
        "",
    ]
    return "\n".join(lines)


def _card_model(trained: Trained, decode: dict[str, Any], ct2: dict | None) -> list[str]:
    """The model card's "Model" section."""
    m, d = trained.cfg.model, trained.cfg.data
    sizes = ", ".join(f"{k}={v}" for k, v in m.items() if k != "arch")
    opts = DecodeOptions.of_run(decode)
    lines = [
        f"# {m.arch} {d.src_lang}->{d.tgt_lang} (nmt model package)",
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
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


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
    if out.exists() and not (force and is_package(out)):
        why = "use --force to replace it" if is_package(out) else "and is not a package"
        raise ConfigError(f"--out {out} already exists ({why})")


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
    }
    atomic_write_bytes(tmp / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"))


# ---------------------------------------------------------------------------------- command


def make_parser() -> argparse.ArgumentParser:
    """``nmt-export``'s command line."""
    p = argparse.ArgumentParser(
        prog="nmt-export",
        description="Write a trained model as a self-contained package (safetensors weights, "
        "config, sentencepiece models, model card; optionally a CTranslate2 model).",
    )
    p.add_argument("run", nargs="?", default="outputs/latest", help="run directory")
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
