"""Markdown rows of the results table from finished, evaluated runs.

Each run directory holds ``metrics.jsonl`` (written by training; its summary gives the updates,
training time, hardware and command-line overrides: :func:`benchmarks.report.run_summary`),
``config.yaml`` and the ``eval/scores.*.json`` written by ``make eval``. Runs whose overrides
train the same configuration with another ``trainer.seed`` form one row, with the mean and
standard deviation over seeds, whether they name it by a preset or by the overrides it is made
of (the row shows the shortest of their commands)::

    python scripts/results_table.py outputs/runs/*cpu_quick* outputs/runs/*gru*   # the wrapper
    python scripts/results_table.py --json results.json outputs/runs/*

The score of a run is the one of its own decoding (``decode`` in its config: checkpoint, beam,
length penalty), the way ``make eval`` scores it without options; runs not evaluated that way
are listed as skipped. The column "papers' BLEU" is the Multi30k papers' lowercased,
Moses-tokenized BLEU (``bleu_paper`` in the report; "–" for runs evaluated before it was
reported). BLEU, chrF2 and the papers' BLEU carry the 95% bootstrap confidence interval
``make eval`` wrote beside them, in brackets: ``41.9 [40.7, 43.1]`` for one run; for several
seeds the mean ± the standard deviation over seeds, then each run's interval in seed order. The
decoding column says how each run decodes and who chose it: its config (a preset or an override), or
``make tune-decode ARGS="--apply"`` (which then also appears in the command), either by the
paired significance test (a significant winner, or the default kept) or, for reports written
before that test, by the highest validation BLEU.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import run_summary
from nmt.config import to_container
from nmt.decode.options import DecodeOptions
from nmt.evaluate.scoring import options_tag
from nmt.store.gate import load_run_config
from nmt.store.paths import chosen_checkpoint, run_decode_defaults

TEST_SET = "test_2016_flickr"


@dataclass
class RunResult:
    run: Path
    model: str
    direction: str
    overrides: list[str]
    seed: int
    # the configuration with the seed and bookkeeping left out (RECIPE_SKIPPED), as JSON: runs
    # with equal recipes are seeds of one experiment
    recipe: str
    steps: int
    train_minutes: float
    hardware: str
    scores: dict[str, float]  # BLEU, chrF2, BLEU-lc, PAPER
    tuned: bool = False  # decoding chosen on validation by tune-decode --apply
    # how tune-decode --apply chose it (TUNED_BY), "" when it did not
    tuned_by: str = ""
    decoding: str = ""  # "beam 5, alpha 1" or "greedy"
    # 95% bootstrap confidence interval [low, high] of BLEU, chrF2 and PAPER, where eval wrote it
    intervals: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Row:
    model: str
    direction: str
    command: str
    runs: list[RunResult] = field(default_factory=list)

    def stat(self, key: str) -> str:
        """One run: its score; several: mean ± standard deviation over seeds. Then the 95%
        interval of each run, in seed order, where every run has one."""
        runs = sorted(self.runs, key=lambda r: r.seed)
        values = [r.scores[key] for r in runs]
        if len(values) == 1:
            text = f"{values[0]:.1f}"
        else:
            text = f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"
        if all(key in r.intervals for r in runs):
            cis = ", ".join(f"[{r.intervals[key][0]:.1f}, {r.intervals[key][1]:.1f}]" for r in runs)
            text += f" {cis}" if len(runs) == 1 else f" ({cis})"
        return text

    def decoding(self) -> str:
        """Each run's decoding and who chose it, in seed order, once per distinct text."""
        runs = sorted(self.runs, key=lambda r: r.seed)
        texts = [f"{r.decoding} ({TUNED_BY[r.tuned_by]})" for r in runs]
        return "; ".join(dict.fromkeys(texts))


PAPER = "papers' BLEU"  # the key and column of a report's bleu_paper (lowercased, Moses-tokenized)


# who chose a run's decoding, by what decode_applied finds in its tune-decode reports
TUNED_BY = {
    "": "run config",
    "significant": "tune-decode: significantly better than the default",
    "kept": "tune-decode: default kept, nothing significantly better",
    "highest": "tune-decode: highest validation BLEU, no significance test",
}


def decoding_text(decode: dict[str, Any]) -> str:
    beam = int(decode.get("beam", 1))
    if beam == 1:
        return "greedy"
    return f"beam {beam}, alpha {float(decode.get('length_penalty', 1.0)):g}"


def decode_tag(decode: dict[str, Any]) -> str:
    """The file tag ``make eval`` gives the run's own decoding
    (:func:`nmt.evaluate.scoring.options_tag`)."""
    opts = DecodeOptions(
        beam=int(decode.get("beam", 1)), length_penalty=float(decode.get("length_penalty", 1.0))
    )
    return options_tag(Path(f"{decode.get('checkpoint', 'best')}.pt"), opts)


def model_name(cfg: dict[str, Any]) -> str:
    arch = cfg["model"]["arch"]
    return {"gru_bahdanau": "GRU + Bahdanau", "transformer": "Transformer"}.get(arch, arch)


def hardware_text(hw: dict[str, Any] | None) -> str:
    if not hw:
        return "?"
    if hw.get("device_type") == "cuda":
        return f"{hw['world_size']} x {hw['device']}, {hw['precision']}"
    return f"{hw['device']}, {hw['threads']} threads, {hw['precision']}"


def load_run(run: Path, checkpoint: str | None = None) -> RunResult | str:
    """The run's result, or why it cannot be tabulated; ``checkpoint`` overrides the run's
    ``decode.checkpoint`` (``auto`` resolves by validation BLEU, as eval does)."""
    summary, config_file = run_summary(run), run / "config.yaml"
    if summary is None or not config_file.is_file():
        return "no metrics.jsonl/config.yaml (unfinished?)"
    cfg = to_container(load_run_config(run))
    decode = dict(run_decode_defaults(run))
    decode["checkpoint"] = chosen_checkpoint(run, checkpoint or decode["checkpoint"])
    tag = decode_tag(decode)
    scores_file = run / "eval" / f"scores.{tag}.json"
    if not scores_file.is_file():
        return f"not evaluated with its own decoding: no {scores_file.name} (run make eval)"
    sets = json.loads(scores_file.read_text())["sets"]
    if TEST_SET not in sets:
        return f"{scores_file.name} has no {TEST_SET}"
    raw = dict(sets[TEST_SET]["scores"])
    if "bleu_paper" in sets[TEST_SET]:
        raw[PAPER] = sets[TEST_SET]["bleu_paper"]
    scores = {k: raw[k]["score"] for k in ("BLEU", "chrF2", "BLEU-lc", PAPER) if k in raw}
    intervals = {
        k: [raw[k]["ci"]["low"], raw[k]["ci"]["high"]]
        for k in ("BLEU", "chrF2", PAPER)
        if k in raw and raw[k].get("ci")
    }
    tuned_by = decode_applied(run)
    data = cfg["data"]
    return RunResult(
        run=run,
        model=model_name(cfg),
        direction=f"{data['src_lang']}→{data['tgt_lang']}",
        overrides=[o for o in summary.get("overrides", []) if not o.startswith(SKIPPED)],
        seed=int(cfg["trainer"]["seed"]),
        recipe=recipe(cfg),
        steps=int(summary["step"]),
        train_minutes=float(summary["train_time"]) / 60,
        hardware=hardware_text(summary.get("hardware")),
        scores=scores,
        tuned=bool(tuned_by),
        tuned_by=tuned_by,
        decoding=decoding_text(decode),
        intervals=intervals,
    )


def decode_applied(run: Path) -> str:
    """How ``nmt-tune-decode --apply`` settled the run's decoding, from its reports (a key of
    TUNED_BY): "significant" (it wrote a significant winner), "kept" (it tested and kept the
    default), "highest" (a report from before the test: it wrote the highest BLEU), "" (not
    run with --apply)."""
    found = ""
    for report_file in sorted((run / "eval").glob("tune_decode.*.json")):
        try:
            report = json.loads(report_file.read_text())
        except (OSError, ValueError) as err:
            print(f"warning: {report_file}: unreadable ({err})", file=sys.stderr)
            continue
        tested = "test" in report  # written with the paired significance test
        if report.get("applied"):
            return "significant" if tested else "highest"
        if tested and report.get("apply"):
            found = "kept"
    return found


# overrides left out of a row's command: the seed (a row pools seeds) and bookkeeping
SKIPPED = ("trainer.seed=", "trainer.progress=", "trainer.threads=", "outputs=", "hydra.")
# config keys left out of a run's recipe, which decides its row: the same, and decode, which eval
# (or tune-decode) may change after training; the decoding column lists each run's
RECIPE_SKIPPED = {
    ("trainer", "seed"),
    ("trainer", "progress"),
    ("trainer", "threads"),
    ("trainer", "resume"),
    ("outputs",),
    ("decode",),
}


def recipe(cfg: dict[str, Any]) -> str:
    """What a run trained, as canonical JSON: its configuration less RECIPE_SKIPPED."""

    def strip(tree: dict[str, Any], prefix: tuple[str, ...]) -> dict[str, Any]:
        return {
            key: strip(value, (*prefix, key)) if isinstance(value, dict) else value
            for key, value in tree.items()
            if (*prefix, key) not in RECIPE_SKIPPED
        }

    return json.dumps(strip(cfg, ()), sort_keys=True, default=str)


def command(overrides: list[str], tuned: bool = False) -> str:
    args = " ".join(overrides)
    train = f'make train ARGS="{args}"' if args else "make train"
    tune = ' && make tune-decode ARGS="--apply"' if tuned else ""
    return f"{train}{tune} && make eval"


def group(results: list[RunResult]) -> list[Row]:
    """Runs of one recipe (decoded as chosen the same way) form one row, under the shortest of
    their commands: a preset's name rather than the overrides it stands for."""
    rows: dict[tuple[str | bool, ...], Row] = {}
    for r in results:
        row = rows.setdefault(
            (r.model, r.direction, r.tuned, r.recipe), Row(r.model, r.direction, "")
        )
        row.runs.append(r)
    for row in rows.values():
        row.command = min(
            (command(r.overrides, r.tuned) for r in row.runs), key=lambda c: (len(c), c)
        )
    return list(rows.values())


def markdown(rows: list[Row]) -> str:
    lines = [
        f"| model | direction | BLEU | chrF2 | BLEU-lc | {PAPER} | seeds | updates | "
        "training time | hardware | decoding | command |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        minutes = statistics.mean(r.train_minutes for r in row.runs)
        steps = statistics.mean(r.steps for r in row.runs)
        hardware = "; ".join(sorted({r.hardware for r in row.runs}))
        lc, paper = (
            row.stat(key) if all(key in r.scores for r in row.runs) else "–"
            for key in ("BLEU-lc", PAPER)
        )
        lines.append(
            f"| {row.model} | {row.direction} | {row.stat('BLEU')} | {row.stat('chrF2')} | "
            f"{lc} | {paper} | {len(row.runs)} | {steps:.0f} | {minutes:.0f} min | {hardware} | "
            f"{row.decoding()} | `{row.command}` |"
        )
    return "\n".join(lines)


def collect(runs: list[Path], checkpoint: str | None = None) -> tuple[list[Row], dict[Path, str]]:
    """The table's rows from ``runs``, and why each run left out was left out."""
    results: list[RunResult] = []
    skipped: dict[Path, str] = {}
    for run in runs:
        loaded = load_run(run, checkpoint)
        if isinstance(loaded, str):
            skipped[run] = loaded
        else:
            results.append(loaded)
    return group(results), skipped


def rows_json(rows: list[Row]) -> list[dict[str, Any]]:
    """The rows and their runs (in seed order) as JSON-ready dicts."""
    return [
        {
            "model": row.model,
            "direction": row.direction,
            "command": row.command,
            "runs": [
                {**r.__dict__, "run": str(r.run)} for r in sorted(row.runs, key=lambda r: r.seed)
            ],
        }
        for row in rows
    ]
