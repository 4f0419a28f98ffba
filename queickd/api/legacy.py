"""Queick 1.2.1 clients on the TCP port (`--accept-queick-clients`, off by default).

Queick's JobQueue sends one pickled dict and reads one pickled reply, `{"success": bool,
"error": str or None}`; its first byte, the pickle protocol's 0x80, starts no JSON request.
Only plain data loads (find_class refuses every global) and the pickle is bounded before
and after it loads (api/picklebounds.py), so neither code nor a bomb gets in. The dict
becomes a protocol v1 request, admitted like any other. Scanning and unpickling run on one
decoding thread (DecodePool), never the loop, bounded three ways: MAX_DECODES at once, a
scan resumed only when bytes come that may end it (a request dripped in pieces costs no
more than one sent whole), and DECODE_BUDGET seconds per connection. A daemon with a token
refuses these clients (startcheck.validate): they cannot present it.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..core.policy.admission import Refusal
from ..core.protocol import Code, QueueError
from .picklebounds import PickleBoundsError, PickleScan, check_expanded
from .replies import refused

if TYPE_CHECKING:
    from .service import QueueService

log = logging.getLogger("queickd.legacy")

MAX_REQUEST = 64 * 1024  # bytes; Queick's own server read at most 1024
# A request followed by the client's EOF is still answered up to this size (Queick's own
# read): a larger one is dropped with its connection, so clients that send big requests
# and hang up cannot keep their bytes and decodes in the daemon.
MAX_HALF_CLOSED = 1024
MAX_DECODES = 4  # Queick requests queued or being decoded at once, over all connections
DECODE_BUDGET = 0.5  # seconds of the decoding thread one connection may use
DECODE_CALL_COST = 0.001  # the least a decode is charged: each is a hop to that thread and back
DECODE_STEP = 4096  # bytes that must come before a request's scan is resumed (see _worth_decoding)


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global (a class or function): never loaded."""


class PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise RefusedGlobal(f"{module}.{name}")


def _decode(scan: PickleScan, data: bytes, max_expanded: int) -> tuple[str, Any, float]:
    """For the decoding thread: the bytes that came since the scan's last call → ("more",
    how many bytes the scan needs before it can go on), ("refused", (reply, log line)) or
    ("request", protocol v1 request), and the CPU seconds it took (thread time: waiting for
    the GIL is not counted). Never raises. What a request expands to is bounded as a JSON
    line is (`max_expanded`)."""
    start = time.thread_time()
    try:
        if not scan.feed(data):
            return "more", scan.wanted, time.thread_time() - start
        payload = PlainDataUnpickler(io.BytesIO(scan.data)).load()
        check_expanded(payload, max_expanded)
        kind, value = "request", to_request(payload)
    except PickleBoundsError as e:
        kind, value = "refused", (f"{Code.BAD_REQUEST}: pickle refused: {e}", f"over a bound: {e}")
    except RefusedGlobal as e:
        kind, value = "refused", (f"{Code.BAD_REQUEST}: pickles naming globals ({e}) are refused",
                                  f"its pickle names the global {e}; only plain data is accepted")
    except QueueError as e:
        kind, value = "refused", (refused(e).legacy(), str(e))
    except Exception as e:
        if isinstance(e, EOFError) or (isinstance(e, pickle.UnpicklingError) and "truncated" in str(e)):
            kind, value = "more", len(scan.data) + 1
        else:
            kind, value = "refused", (f"{Code.BAD_REQUEST}: not a readable pickle", f"not a readable pickle ({e})")
    return kind, value, time.thread_time() - start


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


class DecodePool(ThreadPoolExecutor):
    """The one thread Queick requests are decoded on, with at most `limit` decodes queued or
    running at once: connections that send a request and hang up cannot pile up work (and
    copies of their bytes) behind it, however many come and go."""

    def __init__(self, limit: int = MAX_DECODES) -> None:
        super().__init__(1, thread_name_prefix="queickd-unpickle")
        self.limit = limit
        self._slots_lock = threading.Lock()  # taken on the loop, given back on either thread
        self._queued = 0

    def try_submit(self, fn: Callable[..., Any], *args: Any) -> Future | None:
        """fn(*args) on the decoding thread, or None when `limit` decodes are queued or running."""
        with self._slots_lock:
            if self._queued >= self.limit:
                return None
            self._queued += 1
        try:
            fut = self.submit(fn, *args)
        except RuntimeError:  # shut down
            self._give_back(None)
            return None
        fut.add_done_callback(self._give_back)  # when it ends, or at once if cancelled while queued
        return fut

    def _give_back(self, _: Future | None) -> None:
        with self._slots_lock:
            self._queued -= 1


class LegacyConnection:
    """One Queick client's connection, from the first byte on."""

    def __init__(self, service: QueueService, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 io_pool: Any, *, decoder: DecodePool, max_expanded: int, on_request: Callable[[], None]) -> None:
        self.svc = service
        self.on_request: Callable[[], None] | None = on_request  # on the loop, once a whole request is decoded
        self.transport = transport
        self.loop = loop
        self.io = io_pool
        self.decoder = decoder  # the thread that unpickles
        self.max_expanded = max_expanded
        self.buf = bytearray()  # bytes received and not yet handed to the decoding thread
        self.received = 0
        self.done = False
        self.scan = PickleScan(MAX_REQUEST)  # the decoding thread's while a decode is in flight
        self.wanted = 1  # bytes the scan needs before it can go on
        self.eof = False  # the client sent all it will
        self.decodes = 0  # decodes this request has had
        self.spent = 0.0  # seconds of the decoding thread they were charged
        self._decoding: Future | None = None  # the decode in flight
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    def data_received(self, data: bytes) -> None:
        if self.done:
            return
        self.buf += data
        self.received += len(data)
        if self.received > MAX_REQUEST:
            log.warning("refused a Queick request from %s: over %d bytes", self.peer, MAX_REQUEST)
            return self._finish(f"{Code.BAD_REQUEST}: request over {MAX_REQUEST} bytes")
        if self._decoding is None and self._worth_decoding():
            self._decode()

    def eof_received(self) -> bool:
        """The client shut its sending side, and may still read (`shutdown(SHUT_WR)`): the
        request is all here. True when it is answered (decoded now; one still incomplete
        is refused); False for a request past MAX_HALF_CLOSED, dropped with the connection."""
        if self.received > MAX_HALF_CLOSED and not self.done:
            return False
        self.eof = True
        if not self.done and self._decoding is None:
            self._decode()
        return True

    def close(self) -> None:
        """The connection is gone: its decode, if still queued, never runs."""
        self.done = True
        self.on_request = None  # the connection's method: no cycle keeps either alive
        self.buf.clear()
        if self._decoding is not None:
            self._decoding.cancel()

    def _worth_decoding(self) -> bool:
        """Whether to resume the scan now: the bytes the opcode it stopped in needs are here,
        and these are the first bytes (a bomb is refused at once), or may end the pickle (a
        STOP is its last byte), or DECODE_STEP more. So a request sent a byte at a time
        costs a few decodes, not one a byte."""
        return self.received >= self.wanted and (
            self.decodes == 0 or self.buf.endswith(b".") or len(self.buf) >= DECODE_STEP)

    def _decode(self) -> None:
        if self.done or self.transport.is_closing():
            return
        if self.spent >= DECODE_BUDGET:
            log.warning("refused a Queick request from %s: over %.1f s of decoding", self.peer, DECODE_BUDGET)
            return self._finish(f"{Code.BAD_REQUEST}: pickle refused: over {DECODE_BUDGET:g} s of decoding")
        fut = self.decoder.try_submit(_decode, self.scan, bytes(self.buf), self.max_expanded)
        if fut is None:
            log.warning("refused a Queick request from %s: %d are queued or being decoded already", self.peer,
                        self.decoder.limit)
            return self._finish(f"{Code.QUEUE_FULL}: too many Queick requests at once; try again later")
        self.buf.clear()
        self.decodes += 1
        self._decoding = fut
        asyncio.wrap_future(fut, loop=self.loop).add_done_callback(self._decoded)

    def _decoded(self, fut: asyncio.Future) -> None:
        self._decoding = None
        if self.done or fut.cancelled():
            return
        kind, value, seconds = fut.result()
        self.spent += max(seconds, DECODE_CALL_COST)
        if kind == "more":
            self.wanted = value
            if self.eof and not self.buf:
                log.warning("refused a Queick request from %s: it ended incomplete", self.peer)
                return self._finish(f"{Code.BAD_REQUEST}: incomplete pickle: the request ended before its end")
            if self.eof or self._worth_decoding():
                self._decode()  # bytes came while this was decoding
            return
        if kind == "refused":
            reply, why = value
            log.warning("refused a Queick request from %s: %s", self.peer, why)
            return self._finish(reply)
        if self.on_request is not None:
            self.on_request()
        self.done = True
        try:
            if value["op"] == "cron":
                cron = self.loop.run_in_executor(self.io, self.svc.call, value)
                cron.add_done_callback(self._after_cron)
            else:
                jobs = self.svc.prepare_jobs(value)
                self.svc.enqueue_warnings(jobs)  # logged: a Queick reply has no room for them
                self.svc.enqueue([jobs], self._after_commit)
        except QueueError as e:
            log.info("refused a Queick request from %s: %s", self.peer, e)
            self._finish(refused(e).legacy())

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
            self.transport.write(pickle.dumps({"success": error is None, "error": error}, protocol=2))
            self.transport.close()
