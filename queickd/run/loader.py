"""What may run: the operator's allowlist and the import of job functions.

A job names `module:function`. By default a module may run only if its file lies inside
the app directory; `--allow PATTERN` (fnmatch on the module name, e.g. `queickd.attendance.*`)
admits more. Checking never executes code outside the app directory: the top-level
package is located with importlib.util.find_spec before anything is imported.
Safe from any thread; results are cached per function name.

The app directory goes first on sys.path, so a module there named like one of the standard
library or an installed package (an app `csv.py`) would be imported in its place by the
whole process, queickd included: the loader refuses to start with one (ShadowingError).

Code is picked up when a module is first imported, and again on `reload()` (the daemon's
SIGHUP): every module imported from the app directory is imported afresh into a new
module object, which replaces the old one only once its code has run without error; a
module that fails leaves the old one serving. Jobs already running keep the function
they started with. Modules admitted by --allow outside the app directory are not reloaded.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.protocol import Code, QueueError

log = logging.getLogger("queickd.loader")


@dataclass
class Reloaded:
    """What reload() did: modules imported afresh, and those that failed (name -> why)."""

    modules: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


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
        self._reload_lock = threading.Lock()  # one reload at a time
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

    def _app_modules(self) -> list[str]:
        """Names of the imported modules whose file lies in the app directory, parents first."""
        out = []
        for name, m in list(sys.modules.items()):
            path = getattr(m, "__file__", None)
            if name == "__main__" or name == "queickd" or name.startswith("queickd."):
                continue  # the daemon's own code (an app directory holding a checkout) stays
            if path and os.path.commonpath([self.app_dir, os.path.realpath(path)]) == self.app_dir:
                out.append(name)
        return sorted(out, key=lambda n: (n.count("."), n))

    def reload(self) -> Reloaded:
        """Import every app-directory module afresh (see the module docstring) and forget
        what was cached, so new functions and new modules are found. Logs each failure with
        its traceback; never raises for a module's error."""
        done = Reloaded()
        with self._reload_lock:
            importlib.invalidate_caches()
            for name in self._app_modules():
                old = sys.modules.get(name)
                spec = getattr(old, "__spec__", None)
                if old is None or spec is None or spec.origin is None:
                    continue
                new_spec = importlib.util.spec_from_file_location(
                    name, spec.origin, submodule_search_locations=spec.submodule_search_locations)
                if new_spec is None or new_spec.loader is None:
                    continue
                new = importlib.util.module_from_spec(new_spec)
                sys.modules[name] = new  # as an import does: the module may import itself
                try:
                    new_spec.loader.exec_module(new)
                except BaseException as e:  # a syntax error, an exception at import, a SystemExit
                    sys.modules[name] = old
                    done.failed[name] = f"{type(e).__name__}: {e}"
                    log.error("reload: %s failed to import, the old code keeps serving: %s: %s\n%s", name,
                              type(e).__name__, e, "".join(traceback.format_exception(e)).rstrip())
                    continue
                parent, _, child = name.rpartition(".")
                if parent and parent in sys.modules:
                    setattr(sys.modules[parent], child, new)
                done.modules.append(name)
            # Functions resolve again from the new modules; a failed one's old functions are
            # found again through its old module, still in sys.modules.
            self._funcs = {}
            self._checked = {}
        log.info("reload: %d module(s) imported afresh%s", len(done.modules),
                 f", {len(done.failed)} failed (old code kept): {', '.join(done.failed)}" if done.failed else "")
        return done

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
