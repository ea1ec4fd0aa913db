"""Decoding tuned on the validation split: ``nmt-tune-decode`` / ``make tune-decode``.

Decodes the run's validation split with each beam size and GNMT length penalty asked for,
scores each with sacreBLEU and prints them best first. ``--apply`` writes the winner into the
run's ``decode`` section (its ``config.yaml``), which ``make eval`` and ``make translate`` then
use by default, so the test set is decoded once, with settings chosen without it::

    nmt-tune-decode outputs/latest --beams 1,5,10 --alphas 0.6,1,1.5,2 --apply
    make tune-decode RUN=outputs/latest ARGS="--apply"
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from nmt.checkpoint import CheckpointError, atomic_write_bytes
from nmt.config import ConfigError
from nmt.data.corpus import DataError
from nmt.data.prepare import load_valid_set
from nmt.inference import checkpoint_path, checkpoint_run_dir, load_run_config, load_trained
from nmt.metrics import bleu, chrf
from nmt.runtime import pick_device, resolve_run_dir, setup_logging
from nmt.search import DecodeOptions, translate_dataset

log = logging.getLogger("nmt.tune")


def parse_numbers(text: str, kind: type, option: str) -> list[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{option}={text!r}: expected comma-separated numbers") from None
    if not values:
        raise ConfigError(f"{option} is empty")
    return values


def candidates(beams: Sequence[int], alphas: Sequence[float]) -> list[DecodeOptions]:
    """Every beam with every alpha; greedy search (beam 1) once, as alpha plays no part."""
    out = []
    for beam in dict.fromkeys(beams):
        for alpha in dict.fromkeys(alphas) if beam > 1 else [1.0]:
            opts = DecodeOptions(beam=beam, length_penalty=alpha)
            opts.validate()
            out.append(opts)
    return out


def apply_to_run(run_dir: Path, beam: int, alpha: float) -> Path:
    """Write ``decode.beam`` / ``decode.length_penalty`` into the run's config.yaml."""
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise CheckpointError(f"{config_file} not found: --apply needs the run's saved config")
    load_run_config(run_dir)  # refused here unless it passes the typed schema
    cfg = OmegaConf.load(config_file)
    decode = cfg.get("decode") or OmegaConf.create({})
    decode.beam, decode.length_penalty = beam, alpha
    cfg.decode = decode
    atomic_write_bytes(config_file, OmegaConf.to_yaml(cfg).encode("utf-8"))
    return config_file


def tune(
    run: str | Path,
    ckpt: str | None,
    beams: Sequence[int],
    alphas: Sequence[float],
    device_name: str = "auto",
    apply: bool = False,
) -> dict[str, Any]:
    """Decode and score the validation split for each setting; returns the JSON report."""
    device = pick_device(device_name)
    path = checkpoint_path(run, ckpt)
    run_dir = checkpoint_run_dir(path) or resolve_run_dir(run)
    trained = load_trained(path, device)
    valid = load_valid_set(trained.cfg.data, trained.tokenizers)
    rows, signature = [], ""
    for opts in candidates(beams, alphas):
        start = time.perf_counter()
        hyps = translate_dataset(trained.model, valid.data, trained.tokenizers.tgt, opts, device)
        b = bleu(hyps, valid.ref_text)
        signature = b.signature
        rows.append({
            "beam": opts.beam,
            "length_penalty": opts.length_penalty if opts.beam > 1 else None,
            "BLEU": b.score,
            "chrF2": chrf(hyps, valid.ref_text).score,
            "detail": b.detail,
            "seconds": time.perf_counter() - start,
        })  # fmt: skip
        log.info("beam %d alpha %s: BLEU %.2f", opts.beam, rows[-1]["length_penalty"], b.score)
    # ties go to the cheaper search: smaller beam first, then the alpha listed first
    best = max(rows, key=lambda r: (round(r["BLEU"], 2), -r["beam"]))
    report = {
        "checkpoint": str(path),
        "step": trained.step,
        "valid_set": valid.name,
        "sentences": len(valid),
        "signature": signature,
        "rows": sorted(rows, key=lambda r: r["BLEU"], reverse=True),
        "best": {
            "beam": best["beam"],
            "length_penalty": 1.0 if best["length_penalty"] is None else best["length_penalty"],
        },
        "applied": False,
    }
    if apply:
        apply_to_run(run_dir, report["best"]["beam"], report["best"]["length_penalty"])
        report["applied"] = True
    out = run_dir / "eval" / f"tune_decode.{path.stem}.json"
    atomic_write_bytes(out, json.dumps(report, indent=2).encode("utf-8"))
    report["written"] = str(out)
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"{report['valid_set']} ({report['sentences']} sentences), checkpoint "
        f"{report['checkpoint']} (step {report['step']})",
        f"{'beam':>4}  {'alpha':>5}  {'BLEU':>6}  {'chrF2':>6}  {'seconds':>7}  sacreBLEU",
    ]
    for r in report["rows"]:
        alpha = "-" if r["length_penalty"] is None else f"{r['length_penalty']:g}"
        lines.append(
            f"{r['beam']:4d}  {alpha:>5}  {r['BLEU']:6.2f}  {r['chrF2']:6.2f}  "
            f"{r['seconds']:7.1f}  {r['detail']}"
        )
    best = report["best"]
    verb = "written to the run's decode section" if report["applied"] else "(--apply to use it)"
    lines.append(f"best on validation: beam {best['beam']} alpha {best['length_penalty']:g} {verb}")
    lines.append(f"report: {report['written']}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="nmt-tune-decode",
        description="Choose beam size and length penalty on a run's validation split.",
    )
    p.add_argument("run", nargs="?", default="outputs/latest", help="run directory")
    p.add_argument("--ckpt", default=None, help="checkpoint name or file (default: as nmt-eval)")
    p.add_argument("--beams", default="1,5", help="comma-separated beam sizes (default 1,5)")
    p.add_argument(
        "--alphas", default="0.6,1,1.5,2", help="GNMT length penalties (default 0.6,1,1.5,2)"
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--apply", action="store_true", help="make the best the run's default")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """``nmt-tune-decode [RUN] [--beams 1,5] [--alphas 0.6,1,1.5,2] [--apply]``."""
    setup_logging()
    args = parse_args(argv)
    try:
        report = tune(
            resolve_run_dir(args.run),
            args.ckpt,
            parse_numbers(args.beams, int, "--beams"),
            parse_numbers(args.alphas, float, "--alphas"),
            args.device,
            args.apply,
        )
    except (ConfigError, DataError, CheckpointError) as e:
        log.error("%s", e)
        raise SystemExit(2) from None
    print(format_report(report))


if __name__ == "__main__":
    main()
