"""What a job module defines, for the enqueue check: from the imported module where this
process has imported it, else read from its source file without running it.

The enqueue check must be cheap (the loader caches each verdict) and must never run a
module's code: the daemon may never import a module whose jobs run in processes. So a
module not imported here is located on disk (the app directory's packages are walked with
PathFinder, which imports nothing) and its source read. A source can bind a name in ways
no reading follows (`globals()[...]`, `setattr`, a star import, a module `__getattr__`), so
a name is called missing only when it appears nowhere in the source, not even in a string
or a comment, and the source has no star import nor __getattr__; else the run decides.
Pure apart from reading the file; safe from any thread.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
from enum import Enum


class Defined(Enum):
    FUNCTION = "function"  # there (a plain function or an async def: both run)
    MISSING = "missing"  # the module does not define it
    UNKNOWN = "unknown"  # the module cannot be read, or binds names in ways a parse cannot follow


class Source:
    """A module's source as read once: the text, searched per name."""

    def __init__(self, text: bytes, path: str, stamp: tuple[int, int] = (0, 0)) -> None:
        self.text = text
        self.path = path
        self.stamp = stamp  # the file's (mtime_ns, size) when read: a changed file is read again
        # Names bound out of sight of the text: a star import, a module __getattr__.
        self.opaque = _OPAQUE.search(text) is not None

    def mentions(self, name: str) -> bool:
        """Whether `name` occurs in the source at all: as a word, in a string, a comment."""
        word = name.encode("utf-8")
        if not word.isascii():  # \b of a bytes pattern knows ASCII letters only
            return word in self.text
        return re.search(rb"\b" + re.escape(word) + rb"\b", self.text) is not None

    def changed(self) -> bool:
        """Whether the file on disk is no longer the one read (a process job's zygote
        imports the newer one)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_mtime_ns, st.st_size) != self.stamp


_OPAQUE = re.compile(rb"import\s*\*|\b__getattr__\b")


def in_module(module: object, name: str) -> Defined:
    """What `name` is in an imported module (its __getattr__, if it has one, runs)."""
    try:
        getattr(module, name)
    except AttributeError:
        return Defined.MISSING
    except Exception:  # a module __getattr__ that fails some other way: the run will say
        return Defined.UNKNOWN
    return Defined.FUNCTION


def source_file(module: str, app_dir: str) -> str | None:
    """The .py file of `module` in `app_dir`, found without importing anything; None if
    it is not a plain source file there."""
    path = [app_dir]
    spec = None
    for part in module.split("."):
        if not path:  # the module before was no package
            return None
        try:
            spec = importlib.machinery.PathFinder.find_spec(part, path)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or [])
    origin = spec.origin if spec is not None else None
    return origin if origin and origin.endswith(".py") else None


def read(path: str) -> Source | None:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            return Source(f.read(), path, (st.st_mtime_ns, st.st_size))
    except OSError:
        return None


def in_source(source: Source | None, name: str) -> Defined:
    if source is not None and not source.opaque and not source.mentions(name):
        return Defined.MISSING
    return Defined.UNKNOWN
