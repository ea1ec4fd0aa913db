"""The figures of the Results and concept pages, drawn with matplotlib from the data of record:
the validation BLEU of docs/results.md, the benchmark runs of docs/bench/, the schedules of
configs/optim/. Drawn as SVG, deterministically (no date, a fixed hash salt)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import yaml

from docs.hooks.pooling import pooling


def _figure(width: float, height: float, columns: int = 1) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, columns, squeeze=False)[0]


def _svg(fig: Any) -> bytes:
    from matplotlib import rc_context

    buffer = io.BytesIO()
    with rc_context({"svg.hashsalt": "nmt-docs", "svg.fonttype": "path"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def learning_curves(repo: Path) -> dict[str, list[tuple[float, float]]]:
    """Validation BLEU by update of each run in docs/results.md's "Per run" table."""
    text = (repo / "docs/results.md").read_text(encoding="utf-8")
    table = text.split("### Per run", 1)[1].split("\n#", 1)[0]
    curves = {}
    for row in re.findall(r"^\| (.+) \|$", table, re.MULTILINE):
        cells = row.split(" | ")
        if len(cells) < 3:
            continue
        found = re.fullmatch(r"([\d. /]+) at ([\d,]+) … ([\d,]+), ([\d,]+)", cells[2].strip())
        if not found:
            continue
        bleu = [float(b) for b in found.group(1).split(" / ")]
        first, last, final = (_number(found.group(i)) for i in (2, 3, 4))
        steps = [first * i for i in range(1, round(last / first) + 1)] + [final]
        if len(steps) != len(bleu):
            raise ValueError(f"docs/results.md, Per run: {len(bleu)} scores at {len(steps)} steps")
        curves[cells[0].split(" (`")[0]] = list(zip(steps, bleu, strict=True))
    if not curves:
        raise LookupError("docs/results.md: no validation BLEU in the Per run table")
    return curves


def learning_curves_svg(repo: Path) -> bytes:
    fig, axes = _figure(10, 4, columns=2)
    for ax, model in zip(axes, ("Transformer", "GRU + Bahdanau"), strict=True):
        for name, points in learning_curves(repo).items():
            if name.startswith(model):
                steps, bleu = zip(*points, strict=True)
                ax.plot(steps, bleu, marker="o", ms=3, label=name.removeprefix(model).strip())
        ax.set(title=model, xlabel="update", ylabel="validation BLEU (greedy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    return _svg(fig)


def _joeynmt_files(repo: Path, kind: str) -> list[dict]:
    files = sorted((repo / "docs/bench").glob("joeynmt-vs-nmt-*.json"))
    found = [json.loads(p.read_text(encoding="utf-8")) | {"file": p.name} for p in files]
    return sorted((d for d in found if kind in d), key=lambda d: d["created"])


def _bars(ax: Any, groups: list[str], series: dict[str, list[float]], base: str) -> None:
    """Grouped bars; each bar but the ``base`` series' is labelled with its ratio to it."""
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name)
        if name != base:
            ratios = [f"{v / b:.2f}x" for v, b in zip(values, series[base], strict=True)]
            ax.bar_label(bars, ratios, fontsize=8)
    ax.set_xticks(range(len(groups)), groups)
    ax.grid(axis="y", alpha=0.3)


def joeynmt_training_svg(repo: Path) -> bytes:
    runs = _joeynmt_files(repo, "train")
    fig, axes = _figure(5 * len(runs), 4, columns=len(runs))
    for ax, run in zip(axes, runs, strict=True):
        models = list(run["train"])
        series = {"JoeyNMT 2.3": [run["train"][m]["joeynmt"]["tgt_tokens_per_s"] for m in models]}
        for precision, label in (("32", "nmt fp32"), ("bf16", "nmt bf16")):
            series[label] = [run["train"][m]["nmt"][precision]["tgt_tokens_per_s"] for m in models]
        _bars(ax, models, series, "JoeyNMT 2.3")
        ax.set(
            ylabel="training target tokens/s", title=f"{run['file']}\n{run['machine']['cpu_model']}"
        )
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8, loc="upper right")
    return _svg(fig)


def joeynmt_decoding_svg(repo: Path) -> bytes:
    run = _joeynmt_files(repo, "decode")[-1]
    fig, (ax,) = _figure(6, 4)
    groups, joey, ours = [], [], []
    for model, sides in run["decode"].items():
        for search in sides["nmt"]["runs"]:
            groups.append(f"{model}\n{search}")
            joey.append(sides["joeynmt"]["runs"][search]["sentences_per_s"])
            ours.append(sides["nmt"]["runs"][search]["sentences_per_s"])
    _bars(ax, groups, {"JoeyNMT 2.3": joey, "nmt": ours}, "JoeyNMT 2.3")
    steps = run["settings"]["max_output_length"]
    ax.set(ylabel="sentences/s", title=f"{run['file']}: every output {steps} decoder steps")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    return _svg(fig)


def soak_svg(repo: Path) -> bytes:
    path = sorted((repo / "docs/bench").glob("bench-soak-*.json"))[-1]
    run = json.loads(path.read_text(encoding="utf-8"))
    fig, (ax,) = _figure(8, 3.6)
    minutes = [t / 60 for t, _ in run["samples"]]
    ax.plot(minutes, [rss / 2**30 for _, rss in run["samples"]], lw=1.2, label="resident set")
    for i, (start, end) in enumerate(run["validations"]):
        ax.axvspan(
            start / 60, end / 60, color="grey", alpha=0.25, label="validation" if not i else None
        )
    title = f"{path.name}: {run['summary']['step']} updates of experiment=cpu_quick"
    ax.set(xlabel="minutes since start", ylabel="resident memory, GiB", title=title)
    ax.title.set_fontsize(8)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _svg(fig)


def schedules_svg(repo: Path, max_steps: int = 4000) -> bytes:
    from omegaconf import OmegaConf

    from nmt.config import OptimConfig
    from nmt.train.optim import schedule_fn

    fig, (ax,) = _figure(8, 3.8)
    styles = ("-", "--", "-.", ":")
    for i, path in enumerate(sorted((repo / "configs/optim").glob("*.yaml"))):
        body = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        cfg = OmegaConf.merge(
            OmegaConf.structured(OptimConfig), {k: v for k, v in body.items() if k != "defaults"}
        )
        fn = schedule_fn(cfg, max_steps)
        steps = range(0, max_steps, 10)
        label = f"optim={path.stem} ({cfg.schedule}, warmup {cfg.warmup_steps})"
        ax.plot(steps, [cfg.lr * fn(s) for s in steps], styles[i % 4], lw=1.8, label=label)
    ax.set(
        xlabel="update",
        ylabel="learning rate",
        title=f"the presets of configs/optim/, trainer.max_steps={max_steps}",
    )
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig)


def figures(repo: Path) -> dict[str, bytes]:
    """The generated figures, by their path in the site."""
    drawn = {
        "figures/learning-curves.svg": learning_curves_svg(repo),
        "figures/joeynmt-training.svg": joeynmt_training_svg(repo),
        "figures/joeynmt-decoding.svg": joeynmt_decoding_svg(repo),
        "figures/soak-memory.svg": soak_svg(repo),
        "figures/schedules.svg": schedules_svg(repo),
    }
    for name, png in pooling(repo)["png"].items():
        drawn[f"figures/{name.replace('_', '-')}"] = png
    return drawn
