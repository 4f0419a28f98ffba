"""Queick 1.2.1 clients on the TCP port (`--accept-queick-clients`, off by default).

Queick's JobQueue opens a connection, sends one pickled dict and reads one pickled reply,
`{"success": bool, "error": str or None}`. Such a connection starts with the pickle
protocol byte 0x80, which no JSON request can start with. The bytes are loaded by an
unpickler whose find_class refuses every global, so only plain data (dicts, lists, tuples,
strings, numbers) can load and nothing can be called; the request is size-limited, and
its pickle and what it loads to are bounded (api/picklebounds.py: declared lengths, memo
indices, expanded size, nesting) so a bomb cannot take the daemon's memory or time. The
dict is translated into a protocol v1 request and validated and admitted like any other
(allowlist, caps, group commit before the reply). Framing runs in the server's event loop;
checking, unpickling and translating run on the server's one decoding thread, so a slow
pickle never holds up other clients. A daemon with a token refuses to accept these
clients at all (daemon.validate): they have no way to present it.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import pickle
from typing import TYPE_CHECKING, Any

from ..core.policy.admission import Refusal
from ..core.protocol import MAX_LINE, Code, QueueError
from .picklebounds import PickleBoundsError, check_expanded, scan
from .replies import refused

if TYPE_CHECKING:
    from .service import QueueService

log = logging.getLogger("queickd.legacy")

MAX_REQUEST = 64 * 1024  # bytes; Queick's own server read at most 1024


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global (a class or function): never loaded."""


class PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise RefusedGlobal(f"{module}.{name}")


def loads_plain(data: bytes) -> Any:
    """Load a pickle that holds plain data only. RefusedGlobal if it names any global;
    EOFError or UnpicklingError('...truncated') if more bytes are needed."""
    return PlainDataUnpickler(io.BytesIO(data)).load()


def decode(data: bytes, max_request: int, max_expanded: int = MAX_LINE) -> tuple[str, Any]:
    """A Queick request's bytes → ("more", None) when incomplete, ("refused", (reply, log
    line)) when refused, ("request", protocol v1 request). Never raises; for the decoding
    thread. What a request expands to is bounded as a JSON line is (`max_expanded`)."""
    try:
        if not scan(data, max_request):
            return "more", None
        payload = loads_plain(data)
        check_expanded(payload, max_expanded)
        return "request", to_request(payload)
    except PickleBoundsError as e:
        return "refused", (f"{Code.BAD_REQUEST}: pickle refused: {e}", f"over a bound: {e}")
    except RefusedGlobal as e:
        return "refused", (f"{Code.BAD_REQUEST}: pickles naming globals ({e}) are refused",
                           f"its pickle names the global {e}; only plain data is accepted")
    except QueueError as e:
        return "refused", (refused(e).legacy(), str(e))
    except Exception as e:
        if _truncated(e):
            return "more", None
        return "refused", (f"{Code.BAD_REQUEST}: not a readable pickle", f"not a readable pickle ({e})")


def _truncated(e: Exception) -> bool:
    return isinstance(e, EOFError) or (isinstance(e, pickle.UnpicklingError) and "truncated" in str(e))


def to_request(d: Any) -> dict[str, Any]:
    """Queick's payload → a protocol v1 `enqueue` or `cron` request. QueueError if unusable.

    Queick's `priority` and `max_workers` have no meaning here and are ignored; a retry
    follows queickd's attempt limit (retry.DEFAULT_MAX_ATTEMPTS) where Queick had none."""
    if not isinstance(d, dict) or not isinstance(d.get("func_name"), str):
        raise QueueError(Code.BAD_REQUEST, "a Queick request is a dict with a func_name string")
    args = d.get("args")
    if args is None:
        args = []
    elif isinstance(args, tuple | list):
        args = list(args)
    else:
        args = [args]  # Queick passed a lone argument through as it came
    try:  # pickles carry bytes, sets, NaN...: only what JSON can hold may be stored
        json.dumps(args, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise QueueError(Code.BAD_REQUEST, f"args must be JSON data (strings, numbers, lists, dicts): {e}") from None
    req: dict[str, Any] = {"func": d["func_name"], "args": args,
                           "retry_on_network": bool(d.get("retry_on_network_available", False))}
    if d.get("retry"):
        spec = {"policy": d.get("retry_type") or "exponential", "interval": d.get("retry_interval"),
                "max_interval": d.get("max_retry_interval")}
        req["retry"] = {k: v for k, v in spec.items() if v is not None}
    start_at, interval = d.get("start_at"), d.get("interval")
    if interval:
        req.update(op="cron", every=interval)
        if start_at:
            req["start_at"] = start_at
    else:
        req["op"] = "enqueue"
        if start_at:
            req["run_at"] = start_at
    return req


def _reply(error: str | None) -> bytes:
    return pickle.dumps({"success": error is None, "error": error}, protocol=2)


class LegacyConnection:
    """One Queick client's connection, from the first byte on."""

    def __init__(self, service: QueueService, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 io_pool: Any, max_request: int = MAX_REQUEST, decoder: Any = None,
                 max_expanded: int = MAX_LINE) -> None:
        self.svc = service
        self.transport = transport
        self.loop = loop
        self.io = io_pool
        self.decoder = decoder if decoder is not None else io_pool  # the thread that unpickles
        self.max_request = max_request
        self.max_expanded = max_expanded
        self.buf = bytearray()
        self.done = False
        self._decoding = 0  # bytes of buf handed to the decoding thread (0: none in flight)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    def data_received(self, data: bytes) -> None:
        if self.done:
            return
        self.buf += data
        if len(self.buf) > self.max_request:
            log.warning("refused a Queick request from %s: over %d bytes", self.peer, self.max_request)
            return self._finish(f"{Code.BAD_REQUEST}: request over {self.max_request} bytes")
        if not self._decoding:
            self._decode()

    def _decode(self) -> None:
        self._decoding = len(self.buf)
        fut = self.loop.run_in_executor(self.decoder, decode, bytes(self.buf), self.max_request, self.max_expanded)
        fut.add_done_callback(self._decoded)

    def _decoded(self, fut: asyncio.Future) -> None:
        seen, self._decoding = self._decoding, 0
        if self.done or fut.cancelled():
            return
        kind, value = fut.result()
        if kind == "more":
            if len(self.buf) > seen:
                self._decode()  # bytes came while this was decoding
            return
        if kind == "refused":
            reply, why = value
            log.warning("refused a Queick request from %s: %s", self.peer, why)
            return self._finish(reply)
        try:
            if value["op"] == "cron":
                self.done = True
                cron = self.loop.run_in_executor(self.io, self.svc.call, value)
                cron.add_done_callback(self._after_cron)
            else:
                jobs = self.svc.prepare_jobs(value)
                self.done = True
                self.svc.enqueue([jobs], self._after_commit)
        except QueueError as e:
            log.info("refused a Queick request from %s: %s", self.peer, e)
            self._finish(refused(e).legacy())
        self.done = True

    def _after_cron(self, fut: asyncio.Future) -> None:
        exc = fut.exception()
        self._finish(None if exc is None else refused(exc).legacy())

    def _after_commit(self, result: Any) -> None:  # committer thread
        why = result if isinstance(result, BaseException) else result[0]
        error = refused(why).legacy() if isinstance(why, BaseException | Refusal) else None
        self.loop.call_soon_threadsafe(self._finish, error)

    def _finish(self, error: str | None) -> None:
        self.done = True
        if not self.transport.is_closing():
            self.transport.write(_reply(error))
            self.transport.close()
