"""The Configuration page: every key of the training config, by section, and the config groups
of configs/ with what each option sets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from docs.hooks.markdown import comment_md, yaml_head
from docs.hooks.schema import class_doc, fields_of, key_table
from nmt.config import MODEL_SCHEMAS, TrainConfig


def config_train() -> str:
    """Every key of the training config, by section, with its type, default and comment."""
    root = TrainConfig()
    out = []
    for f in dataclasses.fields(TrainConfig):
        value = getattr(root, f.name)
        if f.name == "model":
            for arch, schema in MODEL_SCHEMAS.items():
                out.append(f"## `model` ({arch})\n\n{class_doc(schema)}")
                out.append(f"`model.arch={arch}`: `{schema.__name__}` in `nmt/config.py`.\n")
                out.append(key_table(fields_of(schema(), "model.")) + "\n")
        elif dataclasses.is_dataclass(value):
            out.append(f"## `{f.name}`\n\n{class_doc(type(value))}")
            out.append(f"`{type(value).__name__}` in `nmt/config.py`.\n")
            out.append(key_table(fields_of(value, f"{f.name}.")) + "\n")
    top = [x for x in fields_of(root) if "." not in x.key and x.key != "model"]
    out.append("## Top-level keys\n\n" + key_table(top) + "\n")
    return "\n".join(out)


def _flatten(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _flatten(v, f"{prefix}{k}.")]
    if node == "???":
        return [f"`{prefix[:-1]}` (required)"]
    return [f"`{prefix[:-1]}={json.dumps(node) if not isinstance(node, str) else node}`"]


def config_groups(repo: Path) -> str:
    """The config groups of the checkout's configs/ and what each option sets."""
    configs = repo / "configs"
    train = yaml.safe_load((configs / "train.yaml").read_text(encoding="utf-8"))
    defaults = {}
    for entry in train["defaults"]:
        if isinstance(entry, dict):
            for group, choice in entry.items():
                defaults[group.split()[-1]] = choice
    out = []
    groups = sorted(p for p in configs.rglob("*") if p.is_dir() and any(p.glob("*.yaml")))
    for folder in groups:
        group = folder.relative_to(configs).as_posix()
        default = defaults.get(group)
        out.append(f"### The `{group}` group\n")
        out.append(f"Default: `{default}`.\n" if default else "No default: chosen when asked.\n")
        for path in sorted(folder.glob("*.yaml")):
            body = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            sets = _flatten({k: v for k, v in body.items() if k != "defaults"})
            bases = []
            for entry in body.get("defaults", []):
                if isinstance(entry, dict):
                    bases += [
                        f"`{k.replace('override ', '').lstrip('/')}={v}`" for k, v in entry.items()
                    ]
                elif entry != "_self_" and not entry.endswith("_schema"):
                    bases.append(f"`{entry}`")
            out.append(f"#### `{group}={path.stem}`\n\n{comment_md(yaml_head(path))}\n")
            if bases:
                out.append("Builds on: " + ", ".join(bases) + ".\n")
            out.append(("Sets: " + ", ".join(sets) + ".\n") if sets else "Sets no value.\n")
    return "\n".join(out)
