"""What the client sends and what a reply tells it, apart from the connection (client.py):
the job function's wire name, automatic idempotency keys, the errors of a refused reply and
whether an outcome is unknown (resend only with the same keys), the token from the
environment, the TLS context."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import tokenfile
from .core import protocol
from .core.protocol import QueueError

if TYPE_CHECKING:
    import ssl

__all__ = ["RequestLostError", "func_name"]


class RequestLostError(ConnectionError):
    """The connection broke after the request was sent: it may or may not have been applied."""


_key_lock = threading.Lock()
_key_last_us = 0  # the time part of this process's last automatic key


def reset_after_fork() -> None:
    """In a child made by os.fork(): the key lock anew (another thread may have held it)."""
    global _key_lock
    _key_lock = threading.Lock()


def _auto_key() -> str:
    """A key no other enqueue anywhere makes: the time in microseconds (strictly increasing
    within this process), then 80 random bits. Keys made one after the other sort one after
    the other, so the store's unique index takes each new key at its right edge; a uuid4
    would write into a random page of it for every job."""
    global _key_last_us
    with _key_lock:
        _key_last_us = max(time.time_ns() // 1000, _key_last_us + 1)
        us = _key_last_us
    return f"auto:{us:013x}{os.urandom(10).hex()}"


def _unknown_outcome(e: Exception) -> bool:
    return isinstance(e, RequestLostError) or (isinstance(e, QueueError) and e.maybe_committed)


def func_name(func: Callable[..., Any] | str) -> str:
    """'module:function' for a function defined at the top level of an importable module."""
    if isinstance(func, str):
        return protocol.normalize_func(func)
    try:
        return _named(func)
    except TypeError:  # unhashable: not a function, which _name_of says
        return _name_of(func)


def _name_of(func: Callable[..., Any]) -> str:
    module = getattr(func, "__module__", None)
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if not module or not name or "<" in name or "." in name:
        raise ValueError(f"{func!r} is not a top-level function of a module")
    if module == "__main__":
        raise ValueError(
            f"{name} is defined in the script being run (__main__); the daemon cannot import "
            "it. Put job functions in a module of their own, as Queick required."
        )
    return f"{module}:{name}"


# Looked up once per function: a program enqueues a handful of functions, many times.
# Errors are not kept: each call raises again.
_named = functools.lru_cache(maxsize=1024)(_name_of)


def endpoint(host: str | None, port: int | None, token: str | None,
             tls: bool | str | ssl.SSLContext | None) -> tuple[str, int, str | None, ssl.SSLContext | None]:
    """A client's (host, port, token, TLS context): as given, else from the environment
    (QUEICKD_HOST, QUEICKD_PORT, QUEICKD_TOKEN or QUEICKD_TOKEN_FILE, QUEICKD_TLS_CA)."""
    return (host or os.environ.get("QUEICKD_HOST", "127.0.0.1"),
            int(port or os.environ.get("QUEICKD_PORT", protocol.DEFAULT_PORT)),
            token if token is not None else _token_from_env(), tls_context(tls))


def _token_from_env() -> str | None:
    token = os.environ.get("QUEICKD_TOKEN")
    path = os.environ.get("QUEICKD_TOKEN_FILE")
    if token is None and path:
        token = tokenfile.first_token(path)
    return token


def tls_context(tls: bool | str | ssl.SSLContext | None) -> ssl.SSLContext | None:
    """The client's TLS context: None (plaintext; QUEICKD_TLS_CA names a CA file to use TLS
    with), True (TLS, trusting the system's CAs), a CA file's path, or a context of one's
    own (a client certificate for mutual TLS: ctx.load_cert_chain)."""
    if tls is None:
        tls = os.environ.get("QUEICKD_TLS_CA") or None
    if tls is None or tls is False:
        return None
    import ssl  # only for TLS: a client command starts without it

    if isinstance(tls, ssl.SSLContext):
        return tls
    return ssl.create_default_context(cafile=None if tls is True else tls)
