"""The Commands page: every command of pyproject.toml's [project.scripts] with its config or
its argparse options, and the make targets."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
from pathlib import Path

import yaml

from docs.hooks.markdown import md_text, rst_to_md, yaml_head
from docs.hooks.schema import class_doc, fields_of, key_table
from nmt.config import register_configs


def project_scripts(repo: Path) -> dict[str, str]:
    """[project.scripts] of pyproject.toml: command -> "module:function"."""
    text = (repo / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the section's plain `name = "value"` lines
        section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
        return dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]+)"', section, re.MULTILINE))
    return tomllib.loads(text)["project"]["scripts"]


def config_names(tree: ast.Module) -> tuple[str | None, str | None, bool]:
    """(config of @hydra.main, config composed by hand, whether model=DIR is rewritten)."""
    hydra_main = composed = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            for kw in node.keywords:
                if kw.arg == "config_name" and isinstance(kw.value, ast.Constant):
                    if name == "hydra.main":
                        hydra_main = kw.value.value
                    else:
                        composed = kw.value.value
    package_dir = any(isinstance(n, ast.Name) and n.id == "model_argument" for n in ast.walk(tree))
    return hydra_main, composed, package_dir


def argparse_parser(module_name: str) -> argparse.ArgumentParser:
    """The parser of an argparse command: its module's ``make_parser()``."""
    module = importlib.import_module(module_name)
    if not hasattr(module, "make_parser"):
        raise LookupError(f"{module_name} has no make_parser(): the reference cannot list it")
    parser = module.make_parser()
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=96)
    return parser


def option_table(parser: argparse.ArgumentParser) -> str:
    """A table of the options and arguments of a parser (``--help`` left out)."""
    rows = ["| option | value | default | what it does |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
        if action.nargs == 0:
            value = ""
        elif action.choices:
            value = "one of " + ", ".join(f"`{c}`" for c in action.choices)
        else:
            value = f"`{action.metavar or action.dest.upper()}`"
            value += " ..." if action.nargs in ("+", "*") else ""
        if action.required and action.nargs not in ("*", "?"):
            default = "required"
        elif action.nargs == 0:
            default = "off"
        elif action.default in (None, argparse.SUPPRESS):
            default = ""
        else:
            default = f"`{action.default}`"
        help_text = md_text(action.help or "")
        rows.append(f"| {names} | {value} | {default} | {help_text} |")
    return "\n".join(rows)


def hydra_schema(repo: Path, config_name: str) -> type:
    """The dataclass a Hydra config extends: the ``*_schema`` entry of its defaults list."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    body = yaml.safe_load((repo / "configs" / f"{config_name}.yaml").read_text(encoding="utf-8"))
    schema = next(d for d in body["defaults"] if isinstance(d, str) and d.endswith("_schema"))
    register_configs()
    return OmegaConf.get_type(ConfigStore.instance().load(f"{schema}.yaml").node)


def commands(repo: Path) -> str:
    """Each command: its docstring, entry point, usage and its config keys or options."""
    out = []
    for command, target in project_scripts(repo).items():
        module_name = target.split(":")[0]
        spec = importlib.util.find_spec(module_name)
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        hydra_main, composed, package_dir = config_names(tree)
        doc = (ast.get_docstring(tree) or "").split("\n\n")[0]
        out.append(f"## `{command}`\n\n{rst_to_md(doc)}\n\nEntry point: `{target}`.\n")
        if hydra_main:
            head = " ".join(x.strip() for x in yaml_head(repo / f"configs/{hydra_main}.yaml"))
            head = md_text(head)
            out.append(
                f"```\n{command} [KEY=VALUE ...]\n```\n\n`configs/{hydra_main}.yaml`: {head}\n"
            )
            if package_dir:
                out.append(
                    "`model=DIR` on the command line names a model package: it is read as "
                    "`model_dir=DIR`, since Hydra keeps `model=` for the model group.\n"
                )
            if hydra_main == "train":
                out.append(
                    "Its keys are those of the training config: every one, with the config "
                    "groups and presets, is in [Configuration](configuration.md). Hydra's "
                    "own flags work too: `-m` runs a sweep, `--cfg job` prints the "
                    "composed config.\n"
                )
                continue
            schema = hydra_schema(repo, hydra_main)
            out.append(f"Its keys (`{schema.__name__}` in `nmt/config.py`):\n")
            out.append(class_doc(schema) + key_table(fields_of(schema())) + "\n")
        else:
            parser = argparse_parser(module_name)
            usage = parser.format_usage().removeprefix("usage: ").rstrip()
            usage = "\n".join(line.removeprefix(" " * 7) for line in usage.splitlines())
            out.append(f"```\n{usage}\n```\n")
            out.append(md_text(parser.description or "") + "\n\n" + option_table(parser) + "\n")
            if composed:
                out.append(
                    f"Its overrides are those of `configs/{composed}.yaml`, as for "
                    "`nmt-train`: see [Configuration](configuration.md).\n"
                )
    return "\n".join(out)


def make_targets(repo: Path) -> str:
    """The targets of the Makefile that have a ``## what it does`` comment."""
    text = (repo / "Makefile").read_text(encoding="utf-8")
    rows = ["| target | what it does |", "|---|---|"]
    for name, what in re.findall(r"^([a-zA-Z_-]+):.*?## (.*)$", text, re.MULTILINE):
        rows.append(f"| `make {name}` | {md_text(what)} |")
    return "\n".join(rows)
