"""The building blocks of `queick`'s flags: defaults from QUEICKD_* variables, durations,
JSON arguments and repeatable flags. Owns how a flag reads the environment; never parses a
whole command line nor talks to a daemon."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from typing import Any

from ..settings import Config

EX_CONFIG = 78
DEFAULTS = Config()
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> float:
    """'90', '90s', '15m', '12h', '7d', '2w' → seconds."""
    t = text.strip().lower()
    try:
        seconds = float(t[:-1]) * _UNITS[t[-1]] if t and t[-1] in _UNITS else float(t)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):  # 'nan', 'inf': no wait or retention means them
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90, 15m, 12h or 7d")
    if seconds < 0:  # no wait, timeout or age is negative ('--older-than -1d' would mean all)
        raise argparse.ArgumentTypeError(f"{text!r} is negative: a duration is 0 or more, like 90, 15m or 7d")
    return seconds


def number(text: str) -> float:
    """A finite number of seconds, MB or units: 'nan' and 'inf' are refused, as JSON and every
    setting refuse them."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    return v


def fmt_duration(seconds: float) -> str:
    """Seconds as the README writes them: 604800 -> '7d', 86400 -> '24h', 300 -> '5m', 90 -> '90s'."""
    s = float(seconds)
    for unit, size, least in (("d", 86400, 2), ("h", 3600, 1), ("m", 60, 1)):
        if s >= size * least and s % size == 0:
            return f"{s / size:.0f}{unit}"
    return f"{s:g}s"


def env_name(flag: str) -> str:
    """QUEICKD_<FLAG>, the variable that gives `--flag` its default."""
    return "QUEICKD_" + flag.lstrip("-").upper().replace("-", "_")


def env(flag: str) -> str | None:
    """The value of QUEICKD_<FLAG> for `--flag`, or None."""
    return os.environ.get(env_name(flag))


class BadEnvironmentError(Exception):
    """A QUEICKD_* variable that its flag cannot parse. For the commands that start a process
    (run, worker) it is a configuration error (78: an EnvironmentFile does not get better by
    restarting); for the others a usage error (2), reported by `parser`, as argparse would."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class Repeatable(argparse.Action):
    """A repeatable flag (--pool a --pool b). Values given on the command line replace the
    default from the environment or the config file, as any other flag's do, instead of
    being added to it (argparse's own append would add them)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        items = getattr(namespace, self.dest, None)
        items = [] if items is None or items is self.default else items
        setattr(namespace, self.dest, [*items, values])


class Switch(argparse.Action):
    """An on/off flag: `--flag` alone turns it on (no value, no metavar); QUEICKD_FLAG and
    the config file give true or false, read by its `type` (truthy)."""

    def __init__(self, option_strings: list[str], dest: str, type: Callable[[str], Any] | None = None,
                 **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, type=type, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True)


def opt(p: argparse.ArgumentParser, flag: str, help: str, default: Any = None,
        type: Callable[[str], Any] = str, **kw: Any) -> None:
    """Add a flag whose default comes from QUEICKD_<FLAG> first, then `default`."""
    envname = env_name(flag)
    action = kw.get("action")
    value = default
    value_env = os.environ.get(envname)
    if value_env is not None:
        try:
            value = value_env.split(",") if action == "append" else type(value_env)
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise BadEnvironmentError(p, f"{envname}={value_env!r}: {e}") from None
    shown = fmt_duration(default) if type is duration and default is not None else default
    shown = "" if default in (None, [], "") or action == "switch" else f" (default: {shown})"
    if action in ("switch", "append"):
        kw["action"] = Switch if action == "switch" else Repeatable
    p.add_argument(flag, default=value, type=type, help=f"{help}{shown} [env {envname}]", **kw)


def truthy(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def json_arg(kind: type) -> Callable[[str], Any]:
    """An argument type accepting a JSON value of `kind` (list or dict)."""
    def parse(text: str) -> Any:
        try:
            v = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
        if not isinstance(v, kind):
            raise argparse.ArgumentTypeError(f"must be a JSON {'array' if kind is list else 'object'}")
        return v
    return parse
