"""Decoding tuned on the validation split: ``nmt-tune-decode`` / ``make tune-decode``.

Decodes the run's validation split with each beam size and GNMT length penalty asked for and
scores each with sacreBLEU. The run keeps its default setting unless another one is better on
validation by a paired significance test, so that a difference within the noise of one
validation set does not change how the test set is decoded:

- the default is the run's ``decode`` section when it is a beam search, else beam 5 with
  alpha 1 (the section of a run without a preset is greedy search);
- every other setting is compared with the default by sacreBLEU's paired bootstrap
  resampling of BLEU (``--bootstrap`` resamples, ``--bootstrap-seed``);
- a setting wins when its BLEU is higher and its p-value is below ``--level`` (0.05) divided
  by the number of settings compared with the default (Bonferroni: the chance that any of them
  wins by luck alone stays below 0.05); of several winners the highest BLEU is chosen.

Each setting's BLEU is printed with its 95% bootstrap confidence interval, its p-value
against the default and its hypothesis/reference length ratio, then why the setting was kept
or changed. ``--apply`` writes a significant winner into the run's ``decode`` section (its
``config.yaml``), which ``make eval`` and ``make translate`` then use by default, so the test
set is decoded once, with settings chosen without it; without a winner it writes nothing::

    nmt-tune-decode outputs/latest --beams 1,5,10 --alphas 0.6,1,1.5,2 --apply
    make tune-decode RUN=outputs/latest ARGS="--apply"
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from nmt.atomic import atomic_write_bytes
from nmt.cli import exit_on_error, setup_logging
from nmt.config import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, ConfigError
from nmt.data.datasets import load_valid_set
from nmt.data.multilingual import directions_of
from nmt.decode.options import DecodeOptions
from nmt.decode.search import translate_dataset
from nmt.environment import multi30k_source
from nmt.evaluate.metrics import bleu, check_bootstrap, chrf, paired_bootstrap
from nmt.evaluate.tune_directions import direction_report, direction_scores, direction_sets, pooled
from nmt.runtime.device import setup_device
from nmt.store.gate import CheckpointError, load_run_config
from nmt.store.loading import decode_defaults, load_trained
from nmt.store.paths import checkpoint_path, checkpoint_run_dir, resolve_run_dir

log = logging.getLogger(__name__)

LEVEL = 0.05  # family-wise significance level of the comparisons with the default
FALLBACK_BEAM, FALLBACK_ALPHA = 5, 1.0  # the default of a run that decodes greedily
RUN_DECODE = "the run's decode section"


@dataclass(frozen=True)
class Setting:
    """One decoding setting; greedy search (beam 1) has no length penalty (None)."""

    beam: int
    length_penalty: float | None

    @classmethod
    def of(cls, beam: int, alpha: float) -> Setting:
        return cls(beam, float(alpha) if beam > 1 else None)

    def options(self) -> DecodeOptions:
        alpha = 1.0 if self.length_penalty is None else self.length_penalty
        return DecodeOptions(beam=self.beam, length_penalty=alpha)  # checked when built

    def label(self) -> str:
        return "greedy" if self.beam == 1 else f"beam {self.beam} alpha {self.length_penalty:g}"

    def as_dict(self) -> dict[str, Any]:
        return {"beam": self.beam, "length_penalty": self.length_penalty}


def parse_numbers(text: str, kind: type, option: str) -> list[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{option}={text!r}: expected comma-separated numbers") from None
    if not values:
        raise ConfigError(f"{option} is empty")
    return values


def default_setting(run_decode: Any) -> tuple[Setting, str]:
    """The setting a run keeps unless another is significantly better, and where it comes
    from: the run's ``decode`` section when it is a beam search, else beam 5 alpha 1."""
    if run_decode is not None and int(run_decode.get("beam") or 1) > 1:
        alpha = run_decode.get("length_penalty")
        setting = Setting.of(int(run_decode.beam), 1.0 if alpha is None else float(alpha))
        return setting, RUN_DECODE
    why = "decodes greedily" if run_decode is not None else "has no decode section"
    return Setting.of(FALLBACK_BEAM, FALLBACK_ALPHA), f"the fallback for a run that {why}"


def candidates(beams: Sequence[int], alphas: Sequence[float], default: Setting) -> list[Setting]:
    """The default, then every beam with every alpha; greedy search (beam 1) once, as alpha
    plays no part."""
    out = [default]
    for beam in dict.fromkeys(beams):
        for alpha in dict.fromkeys(alphas) if beam > 1 else [1.0]:
            setting = Setting.of(beam, alpha)
            setting.options()  # raises ConfigError on a bad beam or alpha
            if setting not in out:
                out.append(setting)
    return out


def check_test(resamples: int, seed: int, level: float, comparisons: int) -> float:
    """The p-value a setting must beat (``level`` over ``comparisons``, Bonferroni); raises
    :class:`ConfigError` when the options cannot test that."""
    check_bootstrap(resamples, seed, "--bootstrap", "--bootstrap-seed")
    if not 0 < level < 1:
        raise ConfigError(f"--level={level} must be in (0, 1)")
    if resamples == 0:
        raise ConfigError("--bootstrap=0: the paired test needs resamples")
    threshold = level / max(comparisons, 1)
    if threshold <= 1 / (resamples + 1):  # the smallest p-value the resamples can give
        raise ConfigError(
            f"--bootstrap={resamples} cannot give a p-value below {threshold:.2g} ({level:g} "
            f"over {comparisons} comparisons): use at least {int(1 / threshold) + 1} resamples"
        )
    return threshold


def choose(
    hyps: Mapping[Setting, Sequence[str]],
    refs: Sequence[str],
    default: Setting,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> dict[str, Any]:
    """Pick the decoding from each setting's hypotheses of the same references.

    The default is kept unless another setting has a higher BLEU with a paired bootstrap
    p-value below ``level`` / (number of settings compared with the default); among such
    winners the highest BLEU wins (ties: the smaller beam, then the setting listed first).
    Returns the test's parameters, one row per setting (the default first, then the others
    in the order given: BLEU, its 95% interval, p-value against the default, length ratio,
    whether it won), the chosen setting and the reason in words.
    """
    if default not in hyps:
        raise ValueError(f"the default setting ({default.label()}) was not decoded")
    others = [s for s in hyps if s != default]
    threshold = check_test(resamples, seed, level, len(others))
    base, paired = paired_bootstrap(hyps[default], [hyps[s] for s in others], refs, resamples, seed)
    results = {default: base, **dict(zip(others, paired, strict=True))}
    rows = []
    for setting in [default, *others]:
        r = results[setting]
        better = setting != default and r.score > base.score
        rows.append({
            **setting.as_dict(),
            "default": setting == default,
            "BLEU": r.score,
            "ci": asdict(r.ci),
            "p_value": r.p_value,
            "length_ratio": bleu(hyps[setting], refs).length_ratio,
            "significant": bool(better and r.p_value is not None and r.p_value < threshold),
        })  # fmt: skip
    winners = [r for r in rows if r["significant"]]
    # ties go to the cheaper search: smaller beam first, then the setting listed first
    chosen = max(winners, key=lambda r: (round(r["BLEU"], 2), -r["beam"]), default=rows[0])
    return {
        "test": {
            "method": "paired bootstrap resampling of BLEU (sacreBLEU)",
            "resamples": resamples,
            "seed": seed,
            "level": level,
            "correction": "Bonferroni",
            "comparisons": len(others),
            "threshold": threshold,
        },
        "rows": rows,
        "chosen": {"beam": chosen["beam"], "length_penalty": chosen["length_penalty"]},
        "changed": chosen is not rows[0],
        "reason": reason(rows, chosen, threshold, level),
    }


def _name(row: dict[str, Any]) -> str:
    return Setting(row["beam"], row["length_penalty"]).label()


def reason(
    rows: list[dict[str, Any]], chosen: dict[str, Any], threshold: float, level: float
) -> str:
    """Why the setting was kept or changed, in words (``rows[0]`` is the default)."""
    base = rows[0]
    rule = f"p < {level:g}/{len(rows) - 1} = {threshold:.4g}, Bonferroni"
    if chosen is not base:
        return (
            f"changed to {_name(chosen)}: {chosen['BLEU']:.2f} BLEU against {base['BLEU']:.2f} "
            f"for the default ({_name(base)}), {chosen['BLEU'] - base['BLEU']:+.2f} with "
            f"p = {chosen['p_value']:.4g} ({rule})"
        )
    if len(rows) == 1:
        return f"kept the default ({_name(base)}): no other setting was decoded"
    higher = [r for r in rows[1:] if r["BLEU"] > base["BLEU"]]
    if not higher:
        return (
            f"kept the default ({_name(base)}, {base['BLEU']:.2f} BLEU): no other setting "
            "scored higher"
        )
    top = max(higher, key=lambda r: r["BLEU"])
    return (
        f"kept the default ({_name(base)}, {base['BLEU']:.2f} BLEU): the highest, "
        f"{_name(top)} ({top['BLEU']:.2f}, {top['BLEU'] - base['BLEU']:+.2f}, "
        f"p = {top['p_value']:.4g}), is not significantly better (needs {rule})"
    )


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
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
    directions: Sequence[str] = (),
    tf32: bool = True,
) -> dict[str, Any]:
    """Decode and score the validation split for each setting, choose by :func:`choose` and
    (``apply``) write a significant winner into the run; returns the JSON report. A
    multilingual run: each direction's validation split (or those of ``directions``), pooled
    (:mod:`nmt.evaluate.tune_directions`). ``tf32``: as ``tf32`` of ``nmt-eval``."""
    device = setup_device(device_name, tf32)
    path = checkpoint_path(run, ckpt)
    run_dir = checkpoint_run_dir(path) or resolve_run_dir(run)
    trained = load_trained(path, device)
    default, default_source = default_setting(decode_defaults(trained))
    settings = candidates(beams, alphas, default)
    check_test(resamples, seed, level, len(settings) - 1)
    sets = direction_sets(trained, directions) if directions_of(trained.cfg.data) else []
    if directions and not sets:
        raise ConfigError("--directions applies to a multilingual run; this model is bilingual")
    if sets:
        valid_name, refs = pooled(sets)
        parts = [s.data for s in sets]
    else:
        valid = load_valid_set(trained.cfg.data, trained.tokenizers, multi30k_source())
        valid_name, refs, parts = valid.name, valid.ref_text, [valid.data]
    hyps, extra, per_direction = {}, {}, {}
    for setting in settings:
        start = time.perf_counter()
        outputs = [
            translate_dataset(
                trained.model, part, trained.tokenizers.tgt, setting.options(), device
            )
            for part in parts
        ]
        out = [h for o in outputs for h in o]
        seconds = time.perf_counter() - start
        b = bleu(out, refs)
        hyps[setting] = out
        extra[setting] = {
            "chrF2": chrf(out, refs).score,
            "detail": b.detail,
            "seconds": seconds,
            "signature": b.signature,
        }
        if sets:
            per_direction[setting] = direction_scores(sets, outputs)
            scores = [v["BLEU"] for v in per_direction[setting].values()]
            extra[setting]["mean_BLEU"] = sum(scores) / len(scores)
        log.info("%s: BLEU %.2f", setting.label(), b.score)
    selection = choose(hyps, refs, default, resamples, seed, level)
    for row in selection["rows"]:
        setting = Setting(row["beam"], row["length_penalty"])
        row.update({k: v for k, v in extra[setting].items() if k != "signature"})
    report = {
        "checkpoint": str(path),
        "step": trained.step,
        "valid_set": valid_name,
        "sentences": len(refs),
        "signature": extra[default]["signature"],
        "default": {**default.as_dict(), "source": default_source},
        **selection,
        "rows": sorted(selection["rows"], key=lambda r: r["BLEU"], reverse=True),
        "apply": apply,
        "applied": False,
    }
    if sets:
        report["directions"] = direction_report(sets, per_direction)
    if apply and report["changed"]:
        chosen = report["chosen"]
        alpha = chosen["length_penalty"]
        apply_to_run(run_dir, chosen["beam"], 1.0 if alpha is None else alpha)
        report["applied"] = True
    out_file = run_dir / "eval" / f"tune_decode.{path.stem}.json"
    atomic_write_bytes(out_file, json.dumps(report, indent=2).encode("utf-8"))
    report["written"] = str(out_file)
    return report


def format_report(report: dict[str, Any]) -> str:
    test = report["test"]
    lines = [
        f"{report['valid_set']} ({report['sentences']} sentences), checkpoint "
        f"{report['checkpoint']} (step {report['step']})",
        f"sacreBLEU {report['signature']}",
        f"default: {_name(report['default'])} ({report['default']['source']})",
        f"paired bootstrap against the default: {test['resamples']} resamples, seed "
        f"{test['seed']}; a setting wins with higher BLEU and p < {test['level']:g}/"
        f"{test['comparisons']} = {test['threshold']:.4g} (Bonferroni)",
        f"{'':2}{'beam':>4}  {'alpha':>5}  {'BLEU':>6}  {'95% CI':>15}  {'p':>6}  "
        f"{'len ratio':>9}  {'chrF2':>6}  {'seconds':>7}",
    ]
    for r in report["rows"]:
        alpha = "-" if r["length_penalty"] is None else f"{r['length_penalty']:g}"
        mark = "*" if r["default"] else ("+" if r["significant"] else "")
        p = "-" if r["p_value"] is None else f"{r['p_value']:.3f}"
        ci = f"[{r['ci']['low']:.2f}, {r['ci']['high']:.2f}]"
        lines.append(
            f"{mark:2}{r['beam']:4d}  {alpha:>5}  {r['BLEU']:6.2f}  {ci:>15}  {p:>6}  "
            f"{r['length_ratio']:9.3f}  {r['chrF2']:6.2f}  {r['seconds']:7.1f}"
        )
    lines.append("(* the default; + significantly better than the default)")
    for name, entry in report.get("directions", {}).items():
        scores = ", ".join(f"{_name(r)} {r['BLEU']:.2f}" for r in entry["rows"])
        lines.append(
            f"{name} ({entry['sentences']} sentences): {scores}; best {_name(entry['best'])}"
        )
    lines.append(report["reason"])
    chosen = _name(report["chosen"])
    if report["applied"]:
        lines.append(f"--apply: {chosen} written to the run's decode section")
    elif report["apply"]:
        lines.append("--apply: nothing applied (no significant winner); config.yaml unchanged")
    elif report["changed"]:
        lines.append(f"(--apply to make {chosen} the run's decoding)")
    if not report["changed"] and report["default"]["source"] != RUN_DECODE:
        c = report["chosen"]
        lines.append(
            f"the run's decode section still decodes greedily; {chosen} is "
            f'make eval ARGS="beam={c["beam"]} length_penalty={c["length_penalty"]:g}"'
        )
    lines.append(f"report: {report['written']}")
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    """``nmt-tune-decode``'s command line."""
    p = argparse.ArgumentParser(
        prog="nmt-tune-decode",
        description="Choose beam size and length penalty on a run's validation split: the "
        "default is kept unless another setting is significantly better (paired bootstrap).",
    )
    p.add_argument("run", nargs="?", default="outputs/latest", help="run directory")
    p.add_argument("--ckpt", default=None, help="checkpoint name or file (default: as nmt-eval)")
    p.add_argument("--beams", default="1,5", help="comma-separated beam sizes (default 1,5)")
    p.add_argument(
        "--alphas", default="0.6,1,1.5,2", help="GNMT length penalties (default 0.6,1,1.5,2)"
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument(
        "--no-tf32",
        dest="tf32",
        action="store_false",
        help="on a GPU, fp32 matrix products in full fp32, not TF32 (nmt-eval's tf32=false)",
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        default=BOOTSTRAP_RESAMPLES,
        help=f"resamples of the paired bootstrap test (default {BOOTSTRAP_RESAMPLES})",
    )
    p.add_argument(
        "--bootstrap-seed",
        type=int,
        default=BOOTSTRAP_SEED,
        help=f"seed of the resampling (default {BOOTSTRAP_SEED}, sacreBLEU's)",
    )
    p.add_argument(
        "--level",
        type=float,
        default=LEVEL,
        help=f"significance level over all comparisons, Bonferroni-corrected (default {LEVEL})",
    )
    p.add_argument(
        "--apply", action="store_true", help="make a significant winner the run's default"
    )
    p.add_argument(
        "--directions",
        default="",
        help="a multilingual run: comma-separated directions to tune on (default: every trained "
        "one), their validation splits pooled",
    )
    return p


def main(argv: Sequence[str] | None = None) -> None:
    """``nmt-tune-decode [RUN] [--beams 1,5] [--alphas 0.6,1,1.5,2] [--apply]``."""
    setup_logging()
    args = make_parser().parse_args(argv)
    with exit_on_error(log):
        report = tune(
            resolve_run_dir(args.run),
            args.ckpt,
            parse_numbers(args.beams, int, "--beams"),
            parse_numbers(args.alphas, float, "--alphas"),
            args.device,
            args.apply,
            args.bootstrap,
            args.bootstrap_seed,
            args.level,
            [d for d in args.directions.split(",") if d.strip()],
            args.tf32,
        )
    print(format_report(report))


if __name__ == "__main__":
    main()
