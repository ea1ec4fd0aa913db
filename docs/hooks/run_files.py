"""The Run directory and Model packages pages: the events of metrics.jsonl, the fields of
summary.json, a package's files and the fields of package.json."""

from __future__ import annotations

import re
import textwrap

from docs.hooks.markdown import md_text, rst_to_md
from docs.hooks.schema import class_doc, fields_of, key_table


def metrics_events() -> str:
    """The events of metrics.jsonl, from nmt/train/runlog.py's docstring."""
    from nmt.train import runlog

    doc = rst_to_md(runlog.__doc__ or "")
    paragraphs = doc.split("\n\n")
    intro = " ".join(paragraphs[1].split("\n")[:2]) if len(paragraphs) > 1 else ""
    bullets = re.findall(r"^\* `(\w+)`(.*?)(?=^\* |\Z|\n\n)", doc, re.MULTILINE | re.DOTALL)
    described = {
        name: " ".join(text.split()).lstrip(":").strip().rstrip(";") for name, text in bullets
    }
    missing = [e for e in runlog.EVENTS if e not in described]
    if missing:
        raise LookupError(f"nmt/train/runlog.py's docstring describes no event {missing}")
    rows = ["| event | fields besides `event`, `step` and `time` |", "|---|---|"]
    rows += [f"| `{e}` | {md_text(described[e])} |" for e in runlog.EVENTS]
    closing = " ".join(paragraphs[-1].split())
    return f"{intro.rstrip(':')}.\n\n" + "\n".join(rows) + f"\n\n{closing}\n"


SUMMARY_KEYS = {
    "best_bleu": "the highest validation BLEU of the run (-1.0 before its first validation)",
    "best_step": "the update of that validation",
    "step": "updates done at the last event",
    "epoch": "the epoch of the last event",
    "train_time": "seconds of training at the last event (validations not counted)",
    "stop_reason": "why training stopped, or `unfinished` while it runs (or after a kill)",
    "overrides": "the command-line overrides of the latest session",
    "averaged_bleu": "validation BLEU of `checkpoints/averaged.pt` (`trainer.average_last`)",
    "init_from": "the checkpoint a fine-tuning run started from: file, step and sha256",
    "hardware": "the latest session's device, device type, world size, threads, precision, torch",
}


def summary_fields() -> str:
    """summary.json as :func:`nmt.train.runlog.summarize` derives it, on a made-up history."""
    from nmt.train.runlog import summarize

    start = {"event": "start", "step": 0, "time": 0.0, "device": "CPU", "device_type": "cpu"}
    start |= {"world_size": 1, "threads": 2, "precision": "bf16", "torch": "2.x"}
    start |= {"overrides": ["experiment=cpu_quick"], "init_from": {"file": "best.pt"}}
    events = [
        start,
        {"event": "train", "step": 50, "time": 1.0, "epoch": 1, "train_time": 60.0},
        {"event": "validation", "step": 200, "time": 2.0, "bleu": 30.0},
        {"event": "averaged", "step": 200, "time": 3.0, "bleu": 30.5},
        {"event": "end", "step": 200, "time": 4.0, "epoch": 2, "train_time": 240.0}
        | {"stop_reason": "reached the time limit", "best_bleu": 30.0, "best_step": 200},
    ]
    summary = summarize(events)
    rows = ["| key | what it holds |", "|---|---|"]
    for key in summary:
        what = SUMMARY_KEYS.get(key, "see `summarize` in `nmt/train/runlog.py`")
        rows.append(f"| `{key}` | {what} |")
    return "\n".join(rows) + "\n"


def package_files() -> str:
    """A package's files (nmt/store/package.py's docstring) and package.json's fields."""
    from nmt.store import package

    doc = package.__doc__ or ""
    block = []
    for line in doc.split("::\n", 1)[1].splitlines():
        if line.strip() and not line.startswith("    "):
            break
        block.append(line)
    layout = textwrap.dedent("\n".join(block)).strip("\n")
    manifest = fields_of(package.Manifest())
    nested = fields_of(package.CTranslate2Manifest(), "ctranslate2.")
    return (
        f"```\n{layout.rstrip()}\n```\n\n## `package.json`\n\n{class_doc(package.Manifest)}"
        f"Format `{package.FORMAT}`; `Manifest` in `nmt/store/package.py`:\n\n"
        f"{key_table(manifest)}\n\n`ctranslate2`, when the package holds a CTranslate2 model "
        f"(`CTranslate2Manifest`):\n\n{key_table(nested)}\n"
    )
