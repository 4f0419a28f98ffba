"""What may run: the operator's allowlist and the import of job functions.

A job names `module:function`. By default a module may run only if its file lies inside
the app directory; `--allow PATTERN` (fnmatch on the module name, e.g. `queickd.attendance.*`)
admits more. Checking never executes code outside the app directory: the top-level
package is located with importlib.util.find_spec before anything is imported.
Safe from any thread; results are cached per function name.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..core.protocol import Code, QueueError


class FunctionLoader:
    def __init__(self, app_dir: str, allow: Sequence[str] = ()) -> None:
        self.app_dir = os.path.realpath(app_dir)
        self.allow = tuple(allow)
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
