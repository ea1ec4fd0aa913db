"""The generated parts of the documentation site, read from the code so that they cannot drift.

mkdocs loads this file as a hook (``hooks:`` in mkdocs.yml):

* ``<!-- nmt:NAME -->`` on a line of its own in a page is replaced by the section NAME of
  :data:`SECTIONS`: every config key with its type, default and comment (from the dataclasses
  of nmt/config.py, their comments read with tokenize), every command of pyproject.toml's
  [project.scripts] with its config or its argparse options, the make targets, the events of
  metrics.jsonl, summary.json, package.json, the environment variables and the source of the
  functions the concept pages explain;
* the figures of :func:`figures` are drawn with matplotlib from the data of record (docs/,
  configs/, the code) and added to the site as generated files;
* ``$$ ... $$`` blocks and ``\\( ... \\)`` spans become MathML, which browsers draw without
  any script.

``python scripts/docs_reference.py [NAME ...]`` prints sections (all of them by default).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import importlib.util
import io
import json
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from nmt.config import MODEL_SCHEMAS, TrainConfig, register_configs

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- nmt:([a-z-]+) -->$", re.MULTILINE)

# ------------------------------------------------------------------------------ source reading


def _comments(path: Path) -> dict[int, tuple[str, bool]]:
    """Line -> (comment text without '#', whether code precedes it on that line)."""
    found = {}
    with path.open("rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type == tokenize.COMMENT:
                trailing = bool(tok.line[: tok.start[1]].strip())
                found[tok.start[0]] = (tok.string.lstrip("#").strip(), trailing)
    return found


def _source_file(obj: Any) -> Path:
    return Path(sys.modules[obj.__module__].__file__).resolve()


def _class_node(cls: type) -> ast.ClassDef:
    tree = ast.parse(_source_file(cls).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node
    raise LookupError(f"{cls.__name__}: no class statement in {_source_file(cls)}")


def field_comment(cls: type, name: str) -> str:
    """The comment of field ``name`` where the class (or the base) that declares it does:
    the comment lines right above the field, then its trailing comment."""
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        for node in _class_node(klass).body:
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
                comments = _comments(_source_file(klass))
                above, line = [], node.lineno - 1
                while line in comments and not comments[line][1]:
                    above.insert(0, comments[line][0])
                    line -= 1
                trailing = [
                    comments[n][0]
                    for n in range(node.lineno, node.end_lineno + 1)
                    if n in comments and comments[n][1]
                ]
                return " — ".join(p for p in (" ".join(above), " ".join(trailing)) if p)
    raise LookupError(f"{cls.__name__}.{name}: no field statement in its classes")


def rst_to_md(text: str) -> str:
    """Docstring markup as markdown: ``x`` and :role:`x` become `x`; ``<`` outside code escaped."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return md_text(text.replace("``", "`"))


def md_text(text: str) -> str:
    """Plain text for a table cell: ``<`` and ``>`` outside code spans escaped, ``|`` too."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return "".join(parts)


def type_name(tp: Any) -> str:
    """A field's type in words: choices of an Enum listed, ``X | None`` as "X or null"."""
    if tp is Any:
        return "any"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        key, value = typing.get_args(tp)
        return f"map of {type_name(key)} to {type_name(value)}"
    return getattr(tp, "__name__", str(tp))


def yaml_value(value: Any) -> str:
    """A default as it would be written on the command line."""
    if value == "???":
        return "required"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(value)}`" if not dataclasses.is_dataclass(value) else ""


class Field(typing.NamedTuple):
    key: str  # full dotted key
    type: str
    default: str
    comment: str


def fields_of(instance: Any, prefix: str = "") -> list[Field]:
    """The fields of a dataclass instance (its values are the defaults), nested ones included."""
    cls = type(instance)
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            found += fields_of(value, f"{prefix}{f.name}.")
            continue
        comment = md_text(field_comment(cls, f.name))
        found.append(Field(prefix + f.name, type_name(hints[f.name]), yaml_value(value), comment))
    return found


def key_table(fields: list[Field]) -> str:
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    rows += [f"| `{f.key}` | {f.type} | {f.default} | {f.comment} |" for f in fields]
    return "\n".join(rows)


def class_doc(cls: type) -> str:
    doc = ast.get_docstring(_class_node(cls))
    return rst_to_md(doc) + "\n\n" if doc else ""


# ------------------------------------------------------------------------------ configuration


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


def _yaml_head(path: Path) -> list[str]:
    """The leading comment lines of a YAML file (``# @package`` left out)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line[1:])
    return lines


def _flatten(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _flatten(v, f"{prefix}{k}.")]
    if node == "???":
        return [f"`{prefix[:-1]}` (required)"]
    return [f"`{prefix[:-1]}={json.dumps(node) if not isinstance(node, str) else node}`"]


def _comment_md(lines: list[str]) -> str:
    """Comment lines as markdown: indented lines (commands) as a code block, the rest as text."""
    out, code = [], []
    for line in [*lines, ""]:
        if line.startswith("   "):
            code.append(line[1:])
            continue
        if code:
            out.append("\n```\n" + textwrap.dedent("\n".join(code)) + "\n```\n")
            code = []
        out.append(md_text(line.strip()))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def config_groups() -> str:
    """The config groups of configs/ and what each option sets."""
    train = yaml.safe_load((REPO / "configs/train.yaml").read_text(encoding="utf-8"))
    defaults = {}
    for entry in train["defaults"]:
        if isinstance(entry, dict):
            for group, choice in entry.items():
                defaults[group.split()[-1]] = choice
    out = []
    groups = sorted(
        p for p in (REPO / "configs").rglob("*") if p.is_dir() and any(p.glob("*.yaml"))
    )
    for folder in groups:
        group = folder.relative_to(REPO / "configs").as_posix()
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
            out.append(f"#### `{group}={path.stem}`\n\n{_comment_md(_yaml_head(path))}\n")
            if bases:
                out.append("Builds on: " + ", ".join(bases) + ".\n")
            out.append(("Sets: " + ", ".join(sets) + ".\n") if sets else "Sets no value.\n")
    return "\n".join(out)


# ------------------------------------------------------------------------------ commands


def project_scripts() -> dict[str, str]:
    """[project.scripts] of pyproject.toml: command -> "module:function"."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the section's plain `name = "value"` lines
        section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
        return dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]+)"', section, re.MULTILINE))
    return tomllib.loads(text)["project"]["scripts"]


def _config_names(tree: ast.Module) -> tuple[str | None, str | None, bool]:
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


def hydra_schema(config_name: str) -> type:
    """The dataclass a Hydra config extends: the ``*_schema`` entry of its defaults list."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    body = yaml.safe_load((REPO / "configs" / f"{config_name}.yaml").read_text(encoding="utf-8"))
    schema = next(d for d in body["defaults"] if isinstance(d, str) and d.endswith("_schema"))
    register_configs()
    return OmegaConf.get_type(ConfigStore.instance().load(f"{schema}.yaml").node)


def commands() -> str:
    out = []
    for command, target in project_scripts().items():
        module_name = target.split(":")[0]
        spec = importlib.util.find_spec(module_name)
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        hydra_main, composed, package_dir = _config_names(tree)
        doc = (ast.get_docstring(tree) or "").split("\n\n")[0]
        out.append(f"## `{command}`\n\n{rst_to_md(doc)}\n\nEntry point: `{target}`.\n")
        if hydra_main:
            head = " ".join(x.strip() for x in _yaml_head(REPO / f"configs/{hydra_main}.yaml"))
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
            schema = hydra_schema(hydra_main)
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


def make_targets() -> str:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    rows = ["| target | what it does |", "|---|---|"]
    for name, what in re.findall(r"^([a-zA-Z_-]+):.*?## (.*)$", text, re.MULTILINE):
        rows.append(f"| `make {name}` | {md_text(what)} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------- run files, environment


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


def environment() -> str:
    from nmt.environment import VARIABLES

    rows = ["| variable | what nmt does with it |", "|---|---|"]
    for names, what in VARIABLES.items():
        listed = ", ".join(f"`{n.strip()}`" for n in names.split(","))
        rows.append(f"| {listed} | {md_text(what)} |")
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------------------ source listings

# The code the concept pages explain: (file, qualified name); each gets the anchor
# <file stem>-<name with '.' as '-'> on reference/code.md.
CODE = [
    ("nmt/models/attention.py", "masked_softmax"),
    ("nmt/models/attention.py", "scaled_dot_product"),
    ("nmt/models/attention.py", "ScoredAttention.forward"),
    ("nmt/models/attention.py", "AdditiveScore"),
    ("nmt/models/attention.py", "DotScore"),
    ("nmt/models/attention.py", "ScaledDotScore"),
    ("nmt/models/attention.py", "GeneralScore"),
    ("nmt/models/attention.py", "make_score"),
    ("nmt/models/attention.py", "attention_mask"),
    ("nmt/models/attention.py", "MultiHeadAttention"),
    ("nmt/models/gru.py", "GRUBahdanau._encode"),
    ("nmt/models/gru.py", "GRUBahdanau._bridge"),
    ("nmt/models/gru.py", "GRUBahdanau._step"),
    ("nmt/models/gru.py", "GRUBahdanau._features"),
    ("nmt/models/transformer.py", "sinusoidal_positions"),
    ("nmt/models/transformer.py", "PositionalEmbedding"),
    ("nmt/models/transformer.py", "Transformer._embed"),
    ("nmt/models/transformer.py", "_Layer.feed_forward"),
    ("nmt/models/transformer.py", "_Layer.residual"),
    ("nmt/models/transformer.py", "EncoderLayer.forward"),
    ("nmt/models/transformer.py", "DecoderLayer.forward"),
    ("nmt/train/optim.py", "_warmup"),
    ("nmt/train/optim.py", "inverse_sqrt"),
    ("nmt/train/optim.py", "noam"),
    ("nmt/train/optim.py", "cosine"),
    ("nmt/train/optim.py", "linear"),
    ("nmt/train/optim.py", "constant"),
    ("nmt/train/optim.py", "schedule_fn"),
    ("nmt/models/loss.py", "reference_cross_entropy"),
    ("nmt/decode/search.py", "length_penalty"),
    ("nmt/decode/search.py", "_cannot_improve"),
    ("nmt/decode/search.py", "beam_search"),
    ("scripts/attention_pooling.py", "average_pooling"),
    ("scripts/attention_pooling.py", "attention_pooling"),
    ("scripts/attention_pooling.py", "fit_w"),
]


def code_anchor(path: str, qualname: str) -> str:
    return f"{Path(path).stem}-{qualname.replace('.', '-')}"


def code_listing(path: str, qualname: str) -> tuple[int, int, str]:
    """(first line, last line, source) of a function or class, decorators included."""
    text = (REPO / path).read_text(encoding="utf-8")
    body: list[ast.stmt] = ast.parse(text).body
    node: ast.AST | None = None
    for name in qualname.split("."):
        defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        node = next((n for n in body if isinstance(n, defs) and n.name == name), None)
        if node is None:
            raise LookupError(f"{path}: no {qualname} (listed in scripts/docs_reference.py CODE)")
        body = node.body
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = text.splitlines()[first - 1 : node.end_lineno]
    return first, node.end_lineno, textwrap.dedent("\n".join(lines))


def concept_links() -> dict[str, list[tuple[str, str]]]:
    """Anchor of reference/code.md -> (title, file) of each concept page that links to it."""
    found: dict[str, list[tuple[str, str]]] = {}
    for page in sorted((REPO / "docs/concepts").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        title = text.splitlines()[0].lstrip("# ").strip()
        for anchor in dict.fromkeys(re.findall(r"code\.md#([\w-]+)", text)):
            found.setdefault(anchor, []).append((title, page.name))
    return found


def code() -> str:
    out, current = [], None
    explained = concept_links()
    for path, qualname in CODE:
        if path != current:
            current = path
            out.append(f"## `{path}`\n")
        first, last, source = code_listing(path, qualname)
        anchor = code_anchor(path, qualname)
        pages = ", ".join(f"[{t}](../concepts/{f})" for t, f in explained.get(anchor, []))
        where = f"; explained in {pages}" if pages else ""
        out.append(f"### `{qualname}` {{#{anchor}}}\n\n`{path}`, lines {first}-{last}{where}:\n")
        out.append(f"```python\n{source}\n```\n")
    return "\n".join(out)


SECTIONS: dict[str, Callable[[], str]] = {
    "config-groups": config_groups,
    "config-train": config_train,
    "commands": commands,
    "make-targets": make_targets,
    "metrics-events": metrics_events,
    "summary-fields": summary_fields,
    "package-files": package_files,
    "environment": environment,
    "code": code,
}


def expand(markdown: str) -> str:
    """A page with each ``<!-- nmt:NAME -->`` line replaced by its section."""

    def section(match: re.Match) -> str:
        name = match.group(1)
        if name not in SECTIONS:
            raise LookupError(f"<!-- nmt:{name} -->: no such section ({', '.join(SECTIONS)})")
        return SECTIONS[name]()

    return MARKER.sub(section, markdown)


# ------------------------------------------------------------------------------ figures


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


def learning_curves() -> dict[str, list[tuple[float, float]]]:
    """Validation BLEU by update of each run in docs/results.md's "Per run" table."""
    text = (REPO / "docs/results.md").read_text(encoding="utf-8")
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


def learning_curves_svg() -> bytes:
    fig, axes = _figure(10, 4, columns=2)
    for ax, model in zip(axes, ("Transformer", "GRU + Bahdanau"), strict=True):
        for name, points in learning_curves().items():
            if name.startswith(model):
                steps, bleu = zip(*points, strict=True)
                ax.plot(steps, bleu, marker="o", ms=3, label=name.removeprefix(model).strip())
        ax.set(title=model, xlabel="update", ylabel="validation BLEU (greedy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    return _svg(fig)


def _joeynmt_files(kind: str) -> list[dict]:
    files = sorted((REPO / "docs/bench").glob("joeynmt-vs-nmt-*.json"))
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


def joeynmt_training_svg() -> bytes:
    runs = _joeynmt_files("train")
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


def joeynmt_decoding_svg() -> bytes:
    run = _joeynmt_files("decode")[-1]
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


def soak_svg() -> bytes:
    path = sorted((REPO / "docs/bench").glob("bench-soak-*.json"))[-1]
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


def schedules_svg(max_steps: int = 4000) -> bytes:
    from omegaconf import OmegaConf

    from nmt.config import OptimConfig
    from nmt.train.optim import schedule_fn

    fig, (ax,) = _figure(8, 3.8)
    styles = ("-", "--", "-.", ":")
    for i, path in enumerate(sorted((REPO / "configs/optim").glob("*.yaml"))):
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


_POOLING: dict[str, Any] = {}


def pooling() -> dict[str, Any]:
    """scripts/attention_pooling.py run once: its test MSEs, learned w and figures (PNG bytes)."""
    if not _POOLING:
        import tempfile

        spec = importlib.util.spec_from_file_location(
            "attention_pooling", REPO / "scripts/attention_pooling.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        with tempfile.TemporaryDirectory() as out:
            result = module.run(Path(out))
            result["png"] = {p.name: p.read_bytes() for p in result.pop("files")}
        _POOLING.update(result)
    return _POOLING


def pooling_table() -> str:
    result = pooling()
    rows = ["| estimate | test MSE |", "|---|---|"]
    rows += [f"| {name} | {mse:.3f} |" for name, mse in result["mse"].items()]
    return "\n".join(rows) + f"\n\nLearned w: {result['w']:.2f}.\n"


SECTIONS["pooling"] = pooling_table


def figures() -> dict[str, bytes]:
    """The generated figures, by their path in the site."""
    drawn = {
        "figures/learning-curves.svg": learning_curves_svg(),
        "figures/joeynmt-training.svg": joeynmt_training_svg(),
        "figures/joeynmt-decoding.svg": joeynmt_decoding_svg(),
        "figures/soak-memory.svg": soak_svg(),
        "figures/schedules.svg": schedules_svg(),
    }
    for name, png in pooling()["png"].items():
        drawn[f"figures/{name.replace('_', '-')}"] = png
    return drawn


# ------------------------------------------------------------------------------ formulas

FENCED = re.compile(r"(^```.*?^```)", re.MULTILINE | re.DOTALL)
MATH_BLOCK = re.compile(r"^\$\$\n(.+?)\n\$\$$", re.MULTILINE | re.DOTALL)
MATH_INLINE = re.compile(r"\\\((.+?)\\\)", re.DOTALL)
MATH_TOKEN = re.compile(r"(<p>)?NMTMATH(\d+)X(</p>)?")


def stash_math(markdown: str) -> tuple[str, list[str]]:
    """Formulas replaced by tokens (outside code blocks) and their MathML, in token order."""
    from latex2mathml.converter import convert

    maths: list[str] = []

    def keep(html: str, block: bool) -> str:
        maths.append(html)
        token = f"NMTMATH{len(maths) - 1}X"
        return f"\n{token}\n" if block else token

    parts = FENCED.split(markdown)
    for i in range(0, len(parts), 2):
        part = MATH_BLOCK.sub(lambda m: keep(convert(m.group(1), display="block"), True), parts[i])
        inline = MATH_INLINE.sub(lambda m: keep(convert(" ".join(m.group(1).split())), False), part)
        parts[i] = inline
    return "".join(parts), maths


def unstash_math(html: str, maths: list[str]) -> str:
    def put(match: re.Match) -> str:
        math = maths[int(match.group(2))]
        if match.group(1) and match.group(3):
            return f'<div class="math">{math}</div>'
        return (match.group(1) or "") + math + (match.group(3) or "")

    return MATH_TOKEN.sub(put, html)


# ------------------------------------------------------------------------------ mkdocs hooks

_PAGE_MATH: dict[str, list[str]] = {}


def on_files(files: Any, config: Any) -> Any:
    """Add the figures to the site as generated files."""
    from mkdocs.structure.files import File

    for path, content in figures().items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown, _PAGE_MATH[page.file.src_uri] = stash_math(expand(markdown))
    return markdown


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return unstash_math(html, _PAGE_MATH.pop(page.file.src_uri, []))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print generated sections of the docs site.")
    parser.add_argument("names", nargs="*", help=f"default: all ({', '.join(SECTIONS)})")
    names = parser.parse_args(argv).names or list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"no section {', '.join(unknown)}")
    for name in names:
        print(SECTIONS[name]())


if __name__ == "__main__":
    main()
