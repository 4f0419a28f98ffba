"""The config file (`--config queickd.toml`): every daemon flag, plus the webhook table.

A top-level key is a flag's name with dashes or underscores (`max-queued = 50` or
`max_queued = 50`); `[hooks.NAME]` tables declare webhooks (see hooks.py),
`[functions."module:func"]` tables a function's job defaults (core/policy/resources.py
checks them) and its isolation, limits and credentials (core/sandbox.py checks those),
`[budgets.pools]` / `[budgets.groups]` the cost budgets, `[fair_shares]` the fair keys'
weights (fair key = weight), `[workflows.NAME]` workflow definitions (steps, budget) started
by name, and `[upstream]` the daemon a device forwards jobs to (services/forwarder/settings.py).
The file is a layer of defaults: an environment variable beats it, and a command-line flag
beats both.
Reads TOML with the standard library's tomllib; does no other I/O.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from typing import Any

TABLES = ("hooks", "functions", "budgets", "workflows", "upstream", "fair_shares")  # tables, passed on as read
SECTIONS = ("upstream", "fair_shares")  # ... of them, those of values rather than of tables


class ConfigFileError(ValueError):
    """The file cannot be read, is not TOML, or names an unknown setting."""


def load(path: str, known: Iterable[str]) -> dict[str, Any]:
    """Read the file → {setting name (underscores): value}; the tables (TABLES) under their name.

    `known` is the set of setting names (flag destinations) the file may hold."""
    known = set(known)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigFileError(f"cannot read config file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(f"config file {path} is not valid TOML: {e}") from None
    out: dict[str, Any] = {}
    for raw, value in data.items():
        name = raw.replace("-", "_")
        if name in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigFileError(f"{path}: {name} must be a table, [{name}]")
        elif name in TABLES:
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigFileError(f"{path}: {name} must be tables, [{name}.NAME]")
        elif name not in known or name in ("config", "help"):
            raise ConfigFileError(f"{path}: unknown setting {raw!r} (settings are the daemon's flags, "
                                  "e.g. port = 9999, max-queued = 1000, or [hooks.NAME] tables)")
        elif isinstance(value, dict):
            raise ConfigFileError(f"{path}: {raw} must be a value, not a table")
        out[name] = value
    return out
