"""Code that ``torch.compile`` leaves out of its graphs, without loading the compiler early.

``@torch.compiler.disable`` imports the compiler (``torch._dynamo``, seconds of CPU) where it
decorates, so every process that imports a model would pay for it, also one that only decodes
and never compiles. :func:`compile_excluded` marks a function or method the same way, but asks
for the compiler's exclusion only where the compiler is loaded: a process without it cannot be
compiling anything, and there the function runs as it is. Where it is loaded (a training
process: PyTorch's optimizers load it), every call goes through ``torch.compiler.disable`` of
the function, as under the decorator: traced, the call is a graph break and the function runs
eagerly, never in a graph.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def compile_excluded(fn: F) -> F:
    """``fn`` (a function or a method) left out of ``torch.compile``'s graphs, as
    ``torch.compiler.disable`` leaves it, once the compiler is loaded; see the module doc."""
    disabled: list[Callable[..., Any]] = []  # torch.compiler.disable(fn), made at first need

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:  # no compiler loaded: nothing is compiling
            return fn(*args, **kwargs)
        if not disabled:
            disabled.append(torch.compiler.disable(fn))
        return disabled[0](*args, **kwargs)

    return call  # type: ignore[return-value]
