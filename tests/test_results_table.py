"""The results table (benchmarks.results_table, scripts/results_table.py): rows from run
directories, seeds pooled into mean ± std."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from benchmarks import results_table
from nmt.train.runlog import RunLog

from .helpers import compose_config

REPO = Path(__file__).resolve().parents[1]


class Table:
    """The table as scripts/results_table.py prints it: ``main`` returns its exit status and
    prints the rows (stdout) and the runs left out (stderr)."""

    def __init__(self) -> None:
        self.decode_tag = results_table.decode_tag

    @staticmethod
    def main(argv: list[str]) -> int:
        args = [a for a in argv if not a.startswith("--json")]
        out_json = None
        if "--json" in argv:
            out_json = Path(argv[argv.index("--json") + 1])
            args.remove(str(out_json))
        rows, skipped = results_table.collect([Path(a) for a in args])
        for run, why in skipped.items():
            print(f"skipped {run}: {why}", file=sys.stderr)
        print(results_table.markdown(rows))
        if out_json:
            out_json.write_text(json.dumps(results_table.rows_json(rows), ensure_ascii=False))
        return 0 if rows else 1


@pytest.fixture(scope="module")
def table() -> Table:
    return Table()


def fake_run(
    root: Path,
    name: str,
    seed: int,
    bleu: float,
    evaluated: bool = True,
    ci: float = 0.0,
    alpha: float = 1.0,
    paper: bool = True,
    command: list[str] | None = None,
    config: tuple[str, ...] = (),
) -> Path:
    """A finished run as training and `make eval` leave it (only the files the table reads);
    ``ci`` > 0: eval's 95% intervals of BLEU, chrF2 and the papers' BLEU, score ± ci;
    ``paper=False``: a report written before nmt-eval gave the papers' BLEU; ``command``: the
    overrides the run was started with (default: experiment=cpu_quick); ``config``: overrides of
    the configuration it trained."""
    run = root / name
    (run / "eval").mkdir(parents=True)
    overrides = [*(command or ["experiment=cpu_quick"]), "trainer.progress=false"]
    if seed != 1234:
        overrides.append(f"trainer.seed={seed}")
    log = RunLog(run)
    hardware = {"device": "Some CPU", "device_type": "cpu", "world_size": 1, "threads": 2}
    log.write("start", 0, **hardware, precision="bf16", parameters=1000, overrides=overrides)
    log.write("validation", 1600, loss=2.0, ppl=7.4, bleu=bleu, chrf=60.0, seconds=9.0, best=True)
    end = {"best_bleu": bleu, "best_step": 1600, "stop_reason": "reached the time limit"}
    log.write("end", 1600, epoch=55, train_time=1800.0, **end)
    cfg = compose_config(
        "train",
        [f"trainer.seed={seed}", "trainer.average_last=5", "decode.beam=5"]
        + [f"decode.length_penalty={alpha}", "decode.checkpoint=averaged", *config],
    )
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    if evaluated:
        scores = {k: {"score": bleu + d} for k, d in (("BLEU", 0), ("chrF2", 20), ("BLEU-lc", 1))}
        entry: dict = {"scores": scores}
        if paper:
            entry["bleu_paper"] = {
                "name": "BLEU (lowercased, Moses-tokenized)",
                "score": bleu + 0.5,
            }
        for score in [scores["BLEU"], scores["chrF2"], entry.get("bleu_paper")] if ci else ():
            if score is not None:
                low, high = score["score"] - ci, score["score"] + ci
                score["ci"] = {"low": low, "high": high, "half_width": ci}
        report = {"sets": {"test_2016_flickr": entry}}
        (run / "eval" / f"scores.averaged.beam5.lp{alpha:g}.json").write_text(json.dumps(report))
    return run


def test_seeds_form_one_row_with_mean_and_std(table, tmp_path: Path, capsys) -> None:
    runs = [
        fake_run(tmp_path, "a", 1234, 40.0),
        fake_run(tmp_path, "b", 7, 42.0),
        fake_run(tmp_path, "c", 8, 0.0, evaluated=False),
    ]
    out_json = tmp_path / "rows.json"
    assert table.main([*map(str, runs), "--json", str(out_json)]) == 0
    captured = capsys.readouterr()
    (row,) = [line for line in captured.out.splitlines() if line.startswith("| Transformer")]
    assert (
        "| de→en | 41.0 ± 1.4 | 61.0 ± 1.4 | 42.0 ± 1.4 | 41.5 ± 1.4 | 2 | 1600 | 30 min |" in row
    )
    assert "Some CPU, 2 threads, bf16 | beam 5, alpha 1 (run config) |" in row
    assert '`make train ARGS="experiment=cpu_quick" && make eval`' in row
    assert "skipped" in captured.err and "scores.averaged.beam5.lp1.json" in captured.err
    saved = json.loads(out_json.read_text())
    assert [r["seed"] for r in saved[0]["runs"]] == [7, 1234]


def test_seeds_pool_by_the_configuration_whichever_command_named_it(
    table, tmp_path: Path, capsys
) -> None:
    """A run started with a preset's overrides spelt out and a seed started with the preset's
    name trained the same configuration: one row, under the preset's shorter command. A run
    with one value changed is a row of its own, whatever its command says."""
    spelt = ["experiment=cpu_long", "model.dropout=0.3", "trainer.val_every=200"]
    runs = [
        fake_run(tmp_path, "a", 1234, 40.0, command=spelt, config=("model.dropout=0.3",)),
        fake_run(tmp_path, "b", 2, 42.0, command=["experiment=cpu_long_tuned", "trainer.threads=2"],
                 config=("model.dropout=0.3",)),
        fake_run(tmp_path, "c", 3, 30.0, command=["experiment=cpu_long_tuned"],
                 config=("model.dropout=0.2",)),
    ]  # fmt: skip
    assert table.main([str(r) for r in runs]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| Trans")]
    assert len(rows) == 2
    pooled = next(row for row in rows if "| 2 |" in row)
    assert "| 41.0 ± 1.4 |" in pooled
    assert '`make train ARGS="experiment=cpu_long_tuned" && make eval`' in pooled
    alone = next(row for row in rows if "| 1 |" in row)
    assert "| 30.0 |" in alone


def test_decode_tag_matches_eval_file_names(table) -> None:
    assert table.decode_tag({"beam": 1, "checkpoint": "best"}) == "best.beam1"
    assert table.decode_tag({"beam": 5, "length_penalty": 0.6}) == "best.beam5.lp0.6"


def test_command_names_tune_decode_when_it_chose_the_decoding(
    table, tmp_path: Path, capsys
) -> None:
    tuned = fake_run(tmp_path, "tuned", 1234, 40.0)
    report = {"applied": True, "best": {"beam": 5, "length_penalty": 1.0}}
    (tuned / "eval" / "tune_decode.averaged.json").write_text(json.dumps(report))
    listed = fake_run(tmp_path, "listed", 7, 42.0)  # tuned without --apply: not in the command
    report = {"applied": False, "best": {"beam": 5, "length_penalty": 1.0}}
    (listed / "eval" / "tune_decode.averaged.json").write_text(json.dumps(report))
    assert table.main([str(tuned), str(listed)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| Trans")]
    assert len(rows) == 2  # a tuned run does not pool with an untuned one
    commands = {row.split("`")[1] for row in rows}
    assert commands == {
        'make train ARGS="experiment=cpu_quick" && make tune-decode ARGS="--apply" && make eval',
        'make train ARGS="experiment=cpu_quick" && make eval',
    }


def test_intervals_beside_the_scores(table, tmp_path: Path, capsys) -> None:
    """One run: its interval after the score; several seeds: mean ± std, then each run's
    interval in seed order; runs evaluated before intervals existed: the score alone."""
    one = fake_run(tmp_path / "one", "a", 1234, 41.9, ci=1.2)
    assert table.main([str(one)]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "| Trans" in line]
    assert "| de→en | 41.9 [40.7, 43.1] | 61.9 [60.7, 63.1] | 42.9 | 42.4 [41.2, 43.6] | 1 |" in row
    seeds = [fake_run(tmp_path / "two", n, s, b, ci=c) for n, s, b, c in
             (("a", 1234, 42.0, 1.0), ("b", 7, 40.0, 1.5))]  # fmt: skip
    out_json = tmp_path / "rows.json"
    assert table.main([*map(str, seeds), "--json", str(out_json)]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "| Trans" in line]
    assert "| 41.0 ± 1.4 ([38.5, 41.5], [41.0, 43.0]) | 61.0 ± 1.4 (" in row
    runs = json.loads(out_json.read_text())[0]["runs"]
    assert runs[0]["intervals"]["BLEU"] == [38.5, 41.5]
    mixed = [seeds[0], fake_run(tmp_path / "three", "c", 8, 40.0)]  # one without an interval
    assert table.main(list(map(str, mixed))) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "| Trans" in line]
    assert "| de→en | 41.0 ± 1.4 | 61.0 ± 1.4 |" in row and "[" not in row.split("|")[3]


def test_the_papers_bleu_has_its_own_column(table, tmp_path: Path, capsys) -> None:
    """The report's bleu_paper under "papers' BLEU", after BLEU-lc; a run evaluated before it
    was reported leaves the row's cell empty ("–") rather than pooling fewer seeds."""
    assert table.main([str(fake_run(tmp_path / "one", "a", 1234, 40.0))]) == 0
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    columns = [c.strip() for c in header.split("|")]
    assert columns[3:7] == ["BLEU", "chrF2", "BLEU-lc", "papers' BLEU"]
    assert [c.strip() for c in row.split("|")][3:7] == ["40.0", "60.0", "41.0", "40.5"]
    mixed = [fake_run(tmp_path / "two", "a", 1234, 40.0),
             fake_run(tmp_path / "two", "b", 7, 42.0, paper=False)]  # fmt: skip
    assert table.main(list(map(str, mixed))) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "| Trans" in line]
    assert "| 42.0 ± 1.4 | – | 2 |" in row


def test_decoding_column_says_how_tune_decode_settled_it(table, tmp_path: Path, capsys) -> None:
    reports = {
        "old": {"applied": True, "best": {"beam": 5, "length_penalty": 1.0}},
        "won": {"test": {"resamples": 1000}, "apply": True, "applied": True},
        "kept": {"test": {"resamples": 1000}, "apply": True, "applied": False},
        "looked": {"test": {"resamples": 1000}, "apply": False, "applied": False},
    }
    expected = {
        "old": "tune-decode: highest validation BLEU, no significance test",
        "won": "tune-decode: significantly better than the default",
        "kept": "tune-decode: default kept, nothing significantly better",
        "looked": "run config",
    }
    for name, report in reports.items():
        run = fake_run(tmp_path, name, 1234, 40.0)
        (run / "eval" / "tune_decode.averaged.json").write_text(json.dumps(report))
        assert table.main([str(run)]) == 0
        (row,) = [line for line in capsys.readouterr().out.splitlines() if "| Trans" in line]
        assert f"| beam 5, alpha 1 ({expected[name]}) |" in row
        assert ("make tune-decode" in row) == (name != "looked")


def test_seeds_decoded_differently_list_each_decoding(table, tmp_path: Path, capsys) -> None:
    old = {"applied": True, "best": {"beam": 5, "length_penalty": 1.0}}
    runs = [fake_run(tmp_path, "a", 1234, 40.0), fake_run(tmp_path, "b", 2, 40.0, alpha=0.6)]
    for run in runs:
        (run / "eval" / "tune_decode.averaged.json").write_text(json.dumps(old))
    assert table.main([str(r) for r in runs]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "| Trans" in line]
    how = "tune-decode: highest validation BLEU, no significance test"
    assert f"| beam 5, alpha 0.6 ({how}); beam 5, alpha 1 ({how}) |" in row


def test_script_prints_the_rows_and_fails_without_any(tmp_path: Path) -> None:
    """scripts/results_table.py: the rows on stdout, the runs left out on stderr; exit status 1
    when no run could be tabulated."""
    script = [sys.executable, str(REPO / "scripts" / "results_table.py")]
    done = fake_run(tmp_path, "a", 1234, 40.0)
    never = fake_run(tmp_path, "b", 7, 0.0, evaluated=False)
    out = tmp_path / "rows.json"
    proc = subprocess.run([*script, str(done), str(never), "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "| Transformer | de→en | 40.0 |" in proc.stdout and f"skipped {never}" in proc.stderr
    assert json.loads(out.read_text())[0]["runs"][0]["seed"] == 1234
    proc = subprocess.run([*script, str(never)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "not evaluated" in proc.stderr


def test_a_run_without_metrics_is_skipped_and_an_older_summary_is_read(tmp_path: Path) -> None:
    run = fake_run(tmp_path, "a", 1234, 40.0)
    events = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").unlink()
    rows, skipped = results_table.collect([run])
    assert rows == [] and "no metrics.jsonl" in skipped[run]
    # a run trained before metrics.jsonl existed: its summary.json is read instead
    (run / "summary.json").write_text(json.dumps({"step": 900, "train_time": 600.0}))
    [row] = results_table.collect([run])[0]
    assert row.runs[0].steps == 900 and row.runs[0].train_minutes == 10.0
    (run / "metrics.jsonl").write_text(events)  # events win over an old summary
    [row] = results_table.collect([run])[0]
    assert row.runs[0].steps == 1600
