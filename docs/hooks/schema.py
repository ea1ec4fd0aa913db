"""The typed schema as tables: a dataclass's fields, nested ones included, with their type in
words, their default and the comment written beside them in the source (read with tokenize)."""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import sys
import tokenize
import types
import typing
from pathlib import Path
from typing import Any

from docs.hooks.markdown import md_text, rst_to_md


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
