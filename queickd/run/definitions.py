"""What a job module defines, for the enqueue check: from the imported module where this
process has imported it, else read from its source file without running it.

The enqueue check must be cheap (the loader caches each verdict) and must never run a
module's code: the daemon may never import a module whose jobs run in processes. So a
module not imported here is located on disk (the app directory's packages are walked with
PathFinder, which imports nothing) and its source parsed with `ast`. A source can bind a
name in ways no parse sees (`globals()[...]`, `setattr`, a star import, a module
`__getattr__`): the answer is then "cannot tell", and the run decides. A name is called
missing only when it appears nowhere in the source, not even in a string.
Pure apart from reading the file; safe from any thread.
"""

from __future__ import annotations

import ast
import importlib.machinery
import inspect
from dataclasses import dataclass
from enum import Enum


class Defined(Enum):
    FUNCTION = "function"  # there, and not a coroutine function as far as can be told
    COROUTINE = "coroutine"  # an `async def`: its call returns a coroutine
    MISSING = "missing"  # the module does not define it
    UNKNOWN = "unknown"  # the module cannot be read, or binds names in ways a parse cannot follow


@dataclass(frozen=True, slots=True)
class Source:
    """What a parse of a module's source found."""

    words: frozenset[str]  # every identifier and string the source holds
    plain_async: frozenset[str]  # undecorated top-level `async def`s bound nowhere else


def in_module(module: object, name: str) -> Defined:
    """What `name` is in an imported module (its __getattr__, if it has one, runs)."""
    try:
        fn = getattr(module, name)
    except AttributeError:
        return Defined.MISSING
    except Exception:  # a module __getattr__ that fails some other way: the run will say
        return Defined.UNKNOWN
    return Defined.COROUTINE if inspect.iscoroutinefunction(fn) else Defined.FUNCTION


def source_file(module: str, app_dir: str) -> str | None:
    """The .py file of `module` in `app_dir`, found without importing anything; None if
    it is not a plain source file there."""
    path = [app_dir]
    parts = module.split(".")
    spec = None
    for i, part in enumerate(parts):
        try:
            spec = importlib.machinery.PathFinder.find_spec(part, path)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        if i < len(parts) - 1:
            path = list(spec.submodule_search_locations or [])
            if not path:
                return None
    origin = spec.origin if spec is not None else None
    return origin if origin and origin.endswith(".py") else None


def parse(path: str) -> Source | None:
    """The names of a module's source; None when it cannot be read or parsed, or binds
    names out of a parse's sight (a star import, a module-level __getattr__)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    words: set[str] = set()
    bound: dict[str, int] = {}  # name -> places that bind it (defs, assignments, imports, globals)

    def bind(name: str) -> None:
        words.add(name)
        bound[name] = bound.get(name, 0) + 1

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bind(node.name)
        elif isinstance(node, ast.Name):
            (bind if isinstance(node.ctx, ast.Store | ast.Del) else words.add)(node.id)
        elif isinstance(node, ast.alias):
            bind((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for n in node.names:
                bind(n)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.arg):
            words.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            words.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words.add(node.value)
    top = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if any(n.name == "__getattr__" for n in top):
        return None
    plain_async = {n.name for n in top if isinstance(n, ast.AsyncFunctionDef) and not n.decorator_list
                   and bound.get(n.name) == 1}
    return Source(frozenset(words), frozenset(plain_async))


def in_source(source: Source | None, name: str) -> Defined:
    if source is None:
        return Defined.UNKNOWN
    if name not in source.words:
        return Defined.MISSING
    return Defined.COROUTINE if name in source.plain_async else Defined.UNKNOWN
