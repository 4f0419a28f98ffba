"""What may run: the operator's allowlist and the import of job functions.

A job names `module:function`. By default a module may run only if its file lies inside
the app directory; `--allow PATTERN` (fnmatch on the module name, e.g. `queickd.attendance.*`)
admits more. Checking never executes code outside the app directory: the top-level
package is located with importlib.util.find_spec before anything is imported.
Safe from any thread; results are cached per function name.

The app directory goes first on sys.path, so a module there named like one of the standard
library or an installed package (an app `csv.py`) would be imported in its place by the
whole process, queickd included: the loader refuses to start with one (ShadowingError).
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..core.protocol import Code, QueueError


class ShadowingError(ValueError):
    """The app directory holds a module that would hide a standard or installed one
    (a configuration error: the daemon exits 78)."""


def _top_level_names(app_dir: str) -> list[str]:
    """The modules and regular packages at the top of `app_dir`. A directory without
    __init__ is left out: a namespace portion never wins over a module found later."""
    names = set()
    for entry in os.listdir(app_dir):
        path = os.path.join(app_dir, entry)
        if os.path.isdir(path):
            init = any(os.path.exists(os.path.join(path, "__init__" + s))
                       for s in importlib.machinery.all_suffixes())
            name = entry if init else None
        else:
            name = inspect.getmodulename(entry)
        if name and name.isidentifier() and name != "__init__":
            names.add(name)
    return sorted(names)


def shadowed(app_dir: str) -> list[str]:
    """What each module of `app_dir` that shares a name with a standard-library or an
    installed top-level module would hide, one line each; empty when none does."""
    app_dir = os.path.realpath(app_dir)
    elsewhere = [p for p in sys.path if os.path.realpath(p or ".") != app_dir]
    found = []
    for name in _top_level_names(app_dir):
        if name in sys.stdlib_module_names:
            found.append(f"{name}: the standard library's {name}")
            continue
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        where = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
        if where and not any(os.path.commonpath([app_dir, os.path.realpath(p)]) == app_dir for p in where):
            found.append(f"{name}: the installed {name} ({where[0]})")
    return found


class FunctionLoader:
    def __init__(self, app_dir: str, allow: Sequence[str] = ()) -> None:
        """Raises ShadowingError if a module of `app_dir` would hide a standard or an
        installed one, before the directory is put on sys.path."""
        self.app_dir = os.path.realpath(app_dir)
        self.allow = tuple(allow)
        hidden = shadowed(self.app_dir)
        if hidden:
            raise ShadowingError(
                f"the app directory {self.app_dir} holds module(s) named like standard or installed "
                f"ones, which every import in this process would then get instead: {'; '.join(hidden)}. "
                "Rename them (or move them into a package of the app's own)")
        self._checked: dict[str, QueueError | None] = {}
        self._funcs: dict[str, Callable[..., Any]] = {}
        if self.app_dir not in sys.path:
            sys.path.insert(0, self.app_dir)

    def _in_app_dir(self, module: str) -> bool:
        top = module.split(".", 1)[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        paths = [spec.origin] if spec.origin not in (None, "built-in", "frozen") else []
        paths += list(spec.submodule_search_locations or [])
        return bool(paths) and all(
            os.path.commonpath([self.app_dir, os.path.realpath(p)]) == self.app_dir for p in paths
        )

    def check(self, func: str) -> None:
        """Raise QueueError(not_allowed) unless `func` ('module:function') may run."""
        cached = self._checked.get(func, False)
        if cached is False:
            module = func.partition(":")[0]
            ok = any(fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(func, p) for p in self.allow)
            ok = ok or self._in_app_dir(module)
            cached = None if ok else QueueError(
                Code.NOT_ALLOWED,
                f"{func} is not allowed: its module is not in the app directory {self.app_dir}"
                " and no --allow pattern names it",
            )
            if len(self._checked) > 10_000:  # names are few; a flood of made-up ones is not kept
                self._checked.clear()
            self._checked[func] = cached
        if cached is not None:
            raise cached

    def resolve(self, func: str) -> Callable[..., Any]:
        """Import and return the function. Raises QueueError(not_allowed), ImportError or
        AttributeError (the caller records those as the job's error)."""
        fn = self._funcs.get(func)
        if fn is None:
            self.check(func)
            module, _, name = func.partition(":")
            fn = getattr(importlib.import_module(module), name)
            if not callable(fn):
                raise TypeError(f"{func} is not callable")
            if getattr(fn, "__module__", None) != module:
                # `from subprocess import run` in an allowed module must not make it runnable
                raise QueueError(Code.NOT_ALLOWED, f"{func} is not defined in {module} "
                                 f"(it comes from {getattr(fn, '__module__', '?')})")
            self._funcs[func] = fn
        return fn
