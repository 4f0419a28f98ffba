"""Undo for the memory store's batch(): a Journal of old values, and UndoDict, a dict
that writes its changes' old values to a Journal while one is open.

It owns only that bookkeeping; it never decides when to begin, keep or roll back (the
store's batch() does). Values must be replaced, never changed in place (the memory
store keeps frozen dataclasses and tuples), since only the old value is remembered.
Not thread-safe by itself: the memory store's lock guards it.
"""

from __future__ import annotations

from typing import Any

ABSENT = object()  # in a journal entry: the key had no value before the change


class Journal:
    """The old values of every change made since begin(), in order. Shared by all the
    dicts of one store, so opening and closing a batch is one assignment each."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple[dict, Any, Any]] | None = None  # a list while open

    def begin(self) -> None:
        self.entries = []

    def commit(self) -> None:
        self.entries = None

    def rollback(self) -> None:
        """Put every value back as it was at begin(), newest change first."""
        entries, self.entries = self.entries or [], None
        _undo(entries)

    def mark(self) -> int:
        """Where the open journal is now: rollback_to(mark) undoes what follows (a savepoint)."""
        assert self.entries is not None, "mark() needs an open journal"
        return len(self.entries)

    def rollback_to(self, mark: int) -> None:
        """Undo the changes made since mark(); the journal stays open with those before it."""
        assert self.entries is not None, "rollback_to() needs an open journal"
        later = self.entries[mark:]
        del self.entries[mark:]
        _undo(later)


def _undo(entries: list[tuple[dict, Any, Any]]) -> None:
    for d, key, old in reversed(entries):
        if old is ABSENT:
            dict.pop(d, key, None)
        else:
            dict.__setitem__(d, key, old)


class UndoDict(dict):
    """A dict whose changes go to its journal while the journal is open. Outside a batch
    a write costs one attribute check more than a dict's."""

    __slots__ = ("_journal",)

    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self._journal = journal

    # Every mutator goes through _keep or __setitem__; a new dict method would bypass it.
    def _keep(self, key: Any) -> None:
        entries = self._journal.entries
        if entries is not None:
            entries.append((self, key, dict.get(self, key, ABSENT)))

    def __setitem__(self, key: Any, value: Any) -> None:
        entries = self._journal.entries  # _keep inlined: this is the hot path
        if entries is not None:
            entries.append((self, key, dict.get(self, key, ABSENT)))
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        self._keep(key)
        dict.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        if self._journal.entries is not None and key in self:
            self._keep(key)
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        if not self:
            raise KeyError("popitem(): dictionary is empty")
        key = next(reversed(self))
        return key, self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> UndoDict:
        self.update(other)
        return self

    def clear(self) -> None:
        for key in self:
            self._keep(key)
        dict.clear(self)
