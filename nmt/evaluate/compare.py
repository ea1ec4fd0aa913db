"""``nmt-compare``: two models' ``nmt-eval`` reports, test set by test set and direction by
direction, by sacreBLEU's paired bootstrap test (:func:`~nmt.evaluate.metrics.paired_bootstrap`).

The baselines are one or more reports (a bilingual run's covers its one direction); the system
is one report (a multilingual run's covers its directions). Each baseline set is compared with
the system's set of the same name and direction, on the hypotheses and references the two
evaluations wrote, which must be the same references line for line::

    nmt-compare outputs/runs/de-en/eval/scores.averaged.beam5.lp1.json \\
        outputs/runs/en-de/eval/scores.best.beam5.lp1.json \\
        --system outputs/runs/multi/eval/scores.averaged.beam5.lp1.json --json compare.json

A row per compared set: both BLEU scores with their bootstrap intervals, the difference and
sacreBLEU's p-value of it; with several rows, a last one tests the mean difference over them
(:mod:`nmt.evaluate.pooled`). ``--directions`` and ``--sets`` keep only the named directions
and test sets. ``--metric paper`` runs the same test on the papers' metric
(:data:`~nmt.evaluate.metrics.PAPER_NAME`: both sides and the references lowercased and
Moses-tokenized in the direction's target language), the figure to set beside the Multi30k
literature's; sacreBLEU's cased BLEU is the default. A zero-shot direction's report entry
already carries its own paired test against pivoting (:mod:`nmt.evaluate.multilingual`);
``--pivot`` compares the system with the baselines' translations through their pivot language
instead (another model's, or the system's own report given as its baseline), in the directions
where they have one::

    nmt-compare outputs/runs/english-centred/eval/scores.best.beam5.lp1.json --pivot \
        --system outputs/runs/all-directions/eval/scores.best.beam5.lp1.json

A report's files are read from the report's own folder, where ``nmt-eval`` writes them, by the
file names the report gives; only where a file is not there is the path the report wrote
used. So an evaluation folder can be moved, copied into a repository or handed to someone else
whole, and its reports still compare.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nmt.atomic import atomic_write_bytes
from nmt.cli import UserError, exit_on_error, setup_logging
from nmt.config import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, ConfigError
from nmt.config_checks import parse_directions
from nmt.data.corpus import read_lines
from nmt.evaluate.metrics import PAPER_NAME, SIGNIFICANCE, check_bootstrap, paired_bootstrap
from nmt.evaluate.pooled import SetPair, mean_difference

log = logging.getLogger(__name__)

METRICS = {"bleu": "BLEU", "paper": PAPER_NAME}  # --metric: its name in the table and JSON


class CompareError(UserError):
    """A report that cannot be compared: missing, malformed, or without a counterpart."""


@dataclass(frozen=True)
class ScoredSet:
    """One test set in one direction of an ``nmt-eval`` report."""

    report: Path
    name: str  # the test set's name, without the direction
    direction: str
    hypotheses: Path
    references: Path
    via: str | None = None  # the pivot language the hypotheses went through, if any


def _field(entry: dict[str, Any], key: str, where: str) -> Any:
    if not isinstance(entry, dict) or key not in entry:
        raise CompareError(f"{where}: no '{key}' (written by an older nmt-eval? evaluate again)")
    return entry[key]


def _entries(report: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    """The report's ``sets`` or ``directions``: a JSON object of entries by name."""
    entries = _field(report, key, str(path))
    if not isinstance(entries, dict):
        raise CompareError(
            f"{path}: '{key}' is a JSON {_json_type(entries)}, not an object of entries by name "
            "(not an nmt-eval report?)"
        )
    return entries


def _json_type(value: Any) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _file(report: Path, entry: dict[str, Any], key: str, where: str) -> Path:
    """A file a report names: beside the report by its name if it is there (a moved or copied
    evaluation folder), else where the report says."""
    value = _field(entry, key, where)
    if not isinstance(value, str) or not value:
        raise CompareError(f"{where}: {key!r} is not a file path")
    written = Path(value)
    beside = Path(report).parent / written.name
    return beside if beside.is_file() else written


def scored_sets(path: Path, pivot: bool = False) -> list[ScoredSet]:
    """The sets of a report: a multilingual report's directions, or a bilingual one's sets in
    its direction; with ``pivot``, the directions that were also translated through a pivot
    language, with those translations."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise CompareError(f"{path}: cannot read the report ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CompareError(f"{path}: not an nmt-eval report ({err})") from None
    if not isinstance(report, dict):
        raise CompareError(f"{path}: not an nmt-eval report (a JSON object expected)")
    sets = []
    if pivot and "directions" not in report:
        raise CompareError(
            f"{path}: --pivot needs a multilingual report (a bilingual one has no "
            "translations through a pivot language)"
        )
    if "directions" in report:
        for key, entry in _entries(report, "directions", path).items():
            where = f"{path}: directions.{key}"
            through = entry.get("pivot") if isinstance(entry, dict) else None
            if pivot and not isinstance(through, dict):
                continue
            side, at = (through, f"{where}.pivot") if pivot else (entry, where)
            sets.append(ScoredSet(
                path, _field(entry, "set", where), _field(entry, "direction", where),
                _file(path, side, "hypotheses", at), _file(path, entry, "references", where),
                str(_field(side, "via", at)) if pivot else None,
            ))  # fmt: skip
        if pivot and not sets:
            raise CompareError(
                f"{path}: no direction was translated through a pivot language "
                "(nmt-eval pivot_trained=true or zero_shot=[...] writes them)"
            )
        return sets
    direction = _field(report, "direction", str(path))
    for key, entry in _entries(report, "sets", path).items():
        where = f"{path}: sets.{key}"
        sets.append(ScoredSet(path, key, direction, _file(path, entry, "hypotheses", where),
                              _file(path, entry, "references", where)))  # fmt: skip
    return sets


def _lines(path: Path, report: Path) -> list[str]:
    if not path.is_file():
        raise CompareError(f"{report}: its file {path} is missing")
    return read_lines(path)


def target_language(direction: str, report: Path) -> str:
    """The target language of a ``src-tgt`` direction, whose Moses rules the papers' metric
    tokenizes with."""
    try:
        (parsed,) = parse_directions([direction], "direction")
    except ConfigError:
        raise CompareError(
            f"{report}: direction {direction!r} is not 'source-target' (e.g. 'en-de'), so the "
            "papers' metric has no target language to tokenize in"
        ) from None
    return parsed.tgt


def compare_sets(
    base: ScoredSet, system: ScoredSet, resamples: int, seed: int, metric: str = "bleu"
) -> dict[str, Any]:
    """One row: the paired bootstrap test of ``system`` against ``base`` on ``metric``
    (:data:`METRICS`)."""
    return _row(base, system, _set_pair(base, system, metric), resamples, seed)


def _row(
    base: ScoredSet, system: ScoredSet, pair: SetPair, resamples: int, seed: int
) -> dict[str, Any]:
    """The row of one set read as ``pair``."""
    b, (s,) = paired_bootstrap(
        pair.baseline, [pair.system], pair.references, resamples, seed, paper_lang=pair.paper_lang
    )
    assert s.p_value is not None
    return {
        "set": base.name,
        "direction": base.direction,
        "sentences": len(pair.references),
        "baseline": {
            "report": str(base.report),
            "bleu": b.score,
            "ci": asdict(b.ci),
            **({"via": base.via} if base.via else {}),
        },  # fmt: skip
        "system": {"report": str(system.report), "bleu": s.score, "ci": asdict(s.ci)},
        "difference": s.score - b.score,
        "p_value": s.p_value,
        "significant": s.p_value < SIGNIFICANCE,
    }


def _set_pair(base: ScoredSet, system: ScoredSet, metric: str) -> SetPair:
    """Both sides' hypotheses of one set and its references, checked line for line."""
    refs = _lines(base.references, base.report)
    if not refs:
        raise CompareError(f"{base.references}: no references, so {base.name} has no score")
    if _lines(system.references, system.report) != refs:
        raise CompareError(
            f"{base.name} {base.direction}: the references of {base.report} "
            f"({base.references}) and {system.report} ({system.references}) differ"
        )
    hyps = []
    for s in (base, system):
        hyps.append(_lines(s.hypotheses, s.report))
        if len(hyps[-1]) != len(refs):
            raise CompareError(
                f"{s.hypotheses}: {len(hyps[-1])} hypotheses for {len(refs)} references"
            )
    lang = target_language(base.direction, base.report) if metric == "paper" else None
    return SetPair(hyps[0], hyps[1], refs, lang)


def compare(
    baselines: Sequence[Path],
    system: Path,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    metric: str = "bleu",
    directions: Sequence[str] | None = None,
    sets: Sequence[str] | None = None,
    pivot: bool = False,
) -> dict[str, Any]:
    """Every set of every baseline report (in ``directions`` and ``sets`` only, if given; a
    set by its name without the direction, ``test_2016_flickr``) against the system
    report's same set and direction, on ``metric`` (``bleu``: sacreBLEU's; ``paper``: the
    papers' metric); with more than one such set, also the test of the mean difference over
    them (:mod:`nmt.evaluate.pooled`). ``pivot``: the baselines' translations through their
    pivot language, in the directions that have them."""
    if metric not in METRICS:
        raise CompareError(f"--metric {metric}: one of {', '.join(METRICS)} expected")
    check_bootstrap(resamples, seed, "--resamples", "--seed")
    if resamples == 0:
        raise CompareError("--resamples 0: the paired test needs resamples (at least 100)")
    wanted = _wanted(directions)
    theirs = {(s.name, s.direction): s for s in scored_sets(system)}
    rows, pairs = [], []
    for path in baselines:
        for base in scored_sets(path, pivot):
            if wanted is not None and base.direction not in wanted:
                continue
            if sets is not None and base.name not in sets:
                continue
            other = theirs.get((base.name, base.direction))
            if other is None:
                have = ", ".join(f"{n} {d}" for n, d in sorted(theirs)) or "none"
                raise CompareError(
                    f"{system}: no {base.name} in {base.direction} to compare with {path} "
                    f"(it has: {have})"
                )
            pairs.append(_set_pair(base, other, metric))
            rows.append(_row(base, other, pairs[-1], resamples, seed))
    if not rows:
        asked = [f"--{k} {','.join(v)}" for k, v in (("directions", sorted(wanted or ())),
                                                      ("sets", list(sets or ()))) if v]  # fmt: skip
        raise CompareError(
            f"{' '.join(asked)}: no set of {', '.join(map(str, baselines))} is among them"
        )
    result = {
        "metric": METRICS[metric],
        "resamples": resamples,
        "seed": seed,
        "significance": SIGNIFICANCE,
        "baseline": "through the pivot language" if pivot else "direct",
        "rows": rows,
    }
    if len(rows) > 1:
        mean = mean_difference(pairs, resamples, seed)
        result["mean"] = {
            "sets": mean.sets,
            "baseline": sum(r["baseline"]["bleu"] for r in rows) / len(rows),
            "system": sum(r["system"]["bleu"] for r in rows) / len(rows),
            "difference": mean.difference,
            "ci": {"low": mean.low, "high": mean.high},
            "p_value": mean.p_value,
            "significant": mean.p_value < SIGNIFICANCE,
        }
    return result


def _wanted(directions: Sequence[str] | None) -> set[str] | None:
    """The directions of ``--directions``, checked as ``source-target`` pairs."""
    if directions is None:
        return None
    try:
        return {str(d) for d in parse_directions(list(directions), "--directions")}
    except ConfigError as err:
        raise CompareError(str(err)) from None


def _ci(side: dict[str, Any]) -> str:
    ci = side["ci"]
    return f"{side['bleu']:.2f} [{ci['low']:.2f}, {ci['high']:.2f}]"


def markdown(result: dict[str, Any]) -> str:
    """The rows as a markdown table."""
    name = result.get("metric", "BLEU")
    vias = {r["baseline"].get("via") for r in result["rows"]}
    through = next(iter(vias)) if len(vias) == 1 else None
    baseline = f"baseline through {through}" if through else "baseline"
    lines = [
        f"| test set | direction | {baseline} {name} [95% CI] | system {name} [95% CI] | "
        "difference | p |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        mark = " (significant)" if r["significant"] else ""
        lines.append(
            f"| {r['set']} | {r['direction']} | {_ci(r['baseline'])} | {_ci(r['system'])} | "
            f"{r['difference']:+.2f}{mark} | {r['p_value']:.4f} |"
        )
    mean = result.get("mean")
    if mean is not None:
        mark = " (significant)" if mean["significant"] else ""
        ci = mean["ci"]
        lines.append(
            f"| mean of {mean['sets']} | | {mean['baseline']:.2f} | {mean['system']:.2f} | "
            f"{mean['difference']:+.2f} [{ci['low']:+.2f}, {ci['high']:+.2f}]{mark} | "
            f"{mean['p_value']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def _comma_list(text: str) -> list[str]:
    """A comma-separated option's names (``de-en,en-de``), empty ones dropped."""
    return [name for name in text.split(",") if name]


def make_parser() -> argparse.ArgumentParser:
    """``nmt-compare``'s command line."""
    parser = argparse.ArgumentParser(
        prog="nmt-compare",
        description="Compare nmt-eval reports by the paired bootstrap test, set by set and "
        "direction by direction.",
    )
    parser.add_argument("baselines", nargs="+", type=Path, help="baseline scores.*.json reports")
    parser.add_argument("--system", type=Path, required=True, help="the compared report")
    parser.add_argument(
        "--metric",
        choices=sorted(METRICS),
        default="bleu",
        help="bleu: sacreBLEU (cased, detokenized; the default); paper: BLEU on lowercased, "
        "Moses-tokenized text, the Multi30k papers' metric",
    )
    parser.add_argument(
        "--directions",
        type=_comma_list,
        default=None,
        help="compare only these directions, e.g. de-en,en-de (the trained ones of a report "
        "that also scored zero-shot directions); the default: every set of the baselines",
    )
    parser.add_argument(
        "--sets",
        type=_comma_list,
        default=None,
        help="compare only these test sets, e.g. test_2016_flickr (a report's set names, "
        "without the direction); the default: every set of the baselines",
    )
    parser.add_argument(
        "--pivot",
        action="store_true",
        help="compare with the baselines' translations through their pivot language (the "
        "directions nmt-eval also translated through one), not their direct ones",
    )
    parser.add_argument("--resamples", type=int, default=BOOTSTRAP_RESAMPLES)
    parser.add_argument("--seed", type=int, default=BOOTSTRAP_SEED)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    return parser


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Compare as the command line asks; prints the table, returns the result."""
    args = make_parser().parse_args(argv)
    result = compare(
        args.baselines,
        args.system,
        args.resamples,
        args.seed,
        args.metric,
        args.directions,
        args.sets,
        args.pivot,
    )
    print(markdown(result), end="")
    if args.json is not None:
        atomic_write_bytes(args.json, json.dumps(result, indent=2).encode("utf-8"))
    return result


def main(argv: Sequence[str] | None = None) -> None:
    setup_logging()
    with exit_on_error(log):
        run(argv)


if __name__ == "__main__":
    main()
