"""What may run: the operator's allowlist and the import of job functions.

A job names `module:function`. By default a module may run only if its file lies inside
the app directory; `--allow PATTERN` (fnmatch on the module name, e.g. `queickd.attendance.*`)
admits more. Checking never executes code outside the app directory: the top-level
package is located with importlib.util.find_spec before anything is imported. check()
also refuses, where it can tell without running code, a function the module does not
define (not_found: run/definitions.py). Safe from any thread; verdicts are cached per name.

The app directory goes last on sys.path, so a module there named like one of the standard
library or an installed package (an app `csv.py`) never hides the real one from this
process, queickd included; a job naming it is refused at enqueue (the daemon logs them once).

`reload()` (the daemon's SIGHUP) imports every module imported from the app directory
afresh into a new module object, which replaces the old one only once its code has run
without error: a module that fails leaves the old one serving. Jobs already running keep
the function they started with. Modules admitted by --allow outside the app directory are
not reloaded.
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
import sysconfig
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.protocol import Code, QueueError
from ..tasks import Task
from . import definitions

log = logging.getLogger("queickd.loader")


@dataclass
class Reloaded:
    """What reload() did: modules imported afresh, and those that failed (name -> why)."""

    modules: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


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


def shadowed(app_dir: str) -> dict[str, str]:
    """Each module of `app_dir` that shares a name with a standard-library or an installed
    top-level module, and what that one is; empty when none does."""
    app_dir = os.path.realpath(app_dir)
    elsewhere = [p for p in sys.path if os.path.realpath(p or ".") != app_dir]
    found = {}
    for name in _top_level_names(app_dir):
        if name in sys.stdlib_module_names:
            found[name] = f"the standard library's {name}"
            continue
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        where = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
        if where and not any(os.path.commonpath([app_dir, os.path.realpath(p)]) == app_dir for p in where):
            if _under(where[0], "stdlib") and not _under(where[0], "purelib", "platlib"):
                found[name] = f"the standard library's {name}"  # one left out of stdlib_module_names (test)
            else:
                found[name] = f"the installed {name} ({where[0]})"
    return found


def _under(path: str, *kinds: str) -> bool:
    """Whether `path` lies in one of the interpreter's directories of these sysconfig kinds."""
    real, paths = os.path.realpath(path), sysconfig.get_paths()
    return any(os.path.commonpath([d, real]) == d for d in (os.path.realpath(paths[k]) for k in kinds))


class FunctionLoader:
    def __init__(self, app_dir: str, allow: Sequence[str] = (), *, announce: bool = True) -> None:
        """`announce`: log the app modules named like standard or installed ones (a
        zygote, whose daemon has said so, does not)."""
        self.app_dir = os.path.realpath(app_dir)
        self.allow = tuple(allow)
        # App modules named like standard or installed ones (found once: the directory is
        # listed at start): jobs naming them are refused.
        self.shadowing = shadowed(self.app_dir)
        if self.shadowing and announce:
            log.warning("the app directory %s holds module(s) named like standard or installed ones, which "
                        "cannot run as jobs (jobs naming them are refused; rename them to use them): %s",
                        self.app_dir, "; ".join(f"{k}: {v}" for k, v in self.shadowing.items()))
        self._checked: dict[str, QueueError | None] = {}
        self._funcs: dict[str, Callable[..., Any]] = {}
        self._sources: dict[str, definitions.Source | None] = {}  # app modules not imported, read
        self._reload_lock = threading.Lock()  # one reload at a time
        # Last, and once: after the standard library and the installed packages (an entry for
        # the directory already there, `python -m`'s cwd, would put it first).
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != self.app_dir] + [self.app_dir]

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
        """Raise QueueError unless `func` ('module:function') may run: not_allowed outside
        the app directory and --allow, or for an app module named like a standard or installed
        one; not_found for a function its module does not define, where that can be told
        without running code (see the module docstring). Cached per name until reload(); a
        not_found from a module not imported here is looked at again once its file changed,
        as the zygote then imports the new one."""
        cached = self._checked.get(func, False)
        if isinstance(cached, QueueError) and cached.code == Code.NOT_FOUND and self._source_changed(func):
            cached = False  # a refusal only: one stat on a path that refuses anyway
        if cached is False:
            cached = self._verdict(func)
            if len(self._checked) > 10_000:  # names are few; a flood of made-up ones is not kept
                self._checked.clear()
            self._checked[func] = cached
        if cached is not None:
            raise cached

    def _verdict(self, func: str) -> QueueError | None:
        refusal = self._allowance(func)
        if refusal is not None:
            return refusal
        module, _, name = func.partition(":")
        found = self._defined(module, name)
        if found is definitions.Defined.MISSING and self._source_changed(func):
            found = self._defined(module, name)
        if found is definitions.Defined.MISSING:
            return QueueError(Code.NOT_FOUND, _missing(module, name))
        return None

    def _allowance(self, func: str) -> QueueError | None:
        """The refusal of a function its module's place does not allow, or None."""
        module = func.partition(":")[0]
        top = module.split(".", 1)[0]
        if top in self.shadowing:
            return QueueError(Code.NOT_ALLOWED, f"{func} cannot run: the app directory's {top} is named like "
                              f"{self.shadowing[top]}, which is what importing {top} gets; rename the module")
        ok = any(fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(func, p) for p in self.allow)
        if not ok and not self._in_app_dir(module):
            return QueueError(Code.NOT_ALLOWED, f"{func} is not allowed: its module is not in the app directory "
                              f"{self.app_dir} and no --allow pattern names it")
        return None

    def _source_changed(self, func: str) -> bool:
        """Whether the not-imported module `func` names was read from a file changed since:
        then it is read again (the zygote imports a changed file without a SIGHUP)."""
        module = func.partition(":")[0]
        source = self._sources.get(module)
        if source is None or module in sys.modules or not source.changed():
            return False
        del self._sources[module]
        return True

    def _defined(self, module: str, name: str) -> definitions.Defined:
        imported = sys.modules.get(module)
        # A module a worker thread is importing right now is in sys.modules before its body
        # has run: what it defines is read from its source until it is done.
        if imported is not None and not getattr(getattr(imported, "__spec__", None), "_initializing", False):
            return definitions.in_module(imported, name)
        if module not in self._sources:
            path = definitions.source_file(module, self.app_dir)
            if len(self._sources) > 1000:
                self._sources.clear()
            self._sources[module] = definitions.read(path) if path is not None else None
        return definitions.in_source(self._sources[module], name)

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
            self._sources = {}
        log.info("reload: %d module(s) imported afresh%s", len(done.modules),
                 f", {len(done.failed)} failed (old code kept): {', '.join(done.failed)}" if done.failed else "")
        return done

    def resolve(self, func: str) -> Callable[..., Any]:
        """Import and return the function. Raises QueueError (not_allowed, not_found: the
        module defines no such function), ImportError or another error of the module's
        import (the caller records those as the job's error)."""
        fn = self._funcs.get(func)
        if fn is None:
            refusal = self._allowance(func)
            if refusal is not None:
                raise refusal
            module, _, name = func.partition(":")
            mod = importlib.import_module(module)
            try:
                fn = getattr(mod, name)
            except AttributeError:  # a module __getattr__ that says so too
                raise QueueError(Code.NOT_FOUND, _missing(module, name)) from None
            if not callable(fn):
                raise TypeError(f"{func} is not callable")
            if getattr(fn, "__module__", None) != module:
                # `from subprocess import run` in an allowed module must not make it runnable
                raise QueueError(Code.NOT_ALLOWED, f"{func} is not defined in {module} "
                                 f"(it comes from {getattr(fn, '__module__', '?')})")
            if isinstance(fn, Task):  # calling a task calls its function: the runners take that,
                fn = fn.func          # and tell an async def's (which a task object is not) from it
            self._funcs[func] = fn
        return fn

    def cached(self, func: str) -> Callable[..., Any] | None:
        """The function as resolve() returned it last (until reload()), or None: no import,
        no check. For a look at what a function is where an import must not happen."""
        return self._funcs.get(func)


def _missing(module: str, name: str) -> str:
    return (f"{module}:{name}: module {module} defines no function {name!r} (one added since the daemon "
            "loaded the module is found after a reload, SIGHUP)")
