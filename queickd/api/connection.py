"""One connection of the TCP enqueue server (api/server.py): framing, authentication,
ordering and back-pressure.

Replies owed wait in a FIFO, bytes when ready, else a future (a group commit, a store read
on the I/O threads, a `wait`), and leave strictly in request order, so a client may
pipeline freely. All enqueues of one read go to the committer as one submission. Beyond
`max_pending` replies owed the server stops reading the connection (its lines wait in the
socket, not in our memory) until they drain to half.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

from ..core import protocol
from ..core.job import Submitted
from ..core.policy.admission import Refusal
from ..core.protocol import Code, QueueError
from ..services.batcher import Gather
from . import waits
from .inbox import Inbox
from .replies import answer_reply, refused
from .service import QueueService

if TYPE_CHECKING:
    from .legacy import LegacyConnection

log = logging.getLogger("queickd.server")  # one logger for the server and its connections
_QUEICK_FIRST = bytes([protocol.QUEICK_FIRST_BYTE])
_TLS_FIRST = b"\x16"  # a TLS ClientHello's first byte: a client that wants TLS, on a port without it


class Host(Protocol):
    """What a connection uses of the server that accepted it (api/server.py's Server)."""

    service: QueueService
    loop: asyncio.AbstractEventLoop
    connections: set[Connection]
    drained: asyncio.Event | None
    gather: Gather
    inbox: Inbox
    io: Executor
    decoder: Executor
    hello_timeout: float | None
    max_line: int
    max_pending: int
    accept_queick_clients: bool
    read_buffer: memoryview  # what every connection of the loop reads into (see get_buffer)

    def opened(self, c: Connection) -> None: ...  # c is set up: it joins `connections`
    def proven(self, c: Connection) -> None: ...  # c no longer counts as unauthenticated

PREAUTH_MAX_LINE = 4096  # bytes per line before the token is given: a hello is small
MAX_BAD_TOKENS = 3  # wrong tokens on one connection before it is closed
BAD_TOKEN_DELAY = 0.5  # seconds before a wrong token is answered: guessing costs time


def _error_bytes(exc: BaseException) -> bytes:
    if not isinstance(exc, QueueError):
        log.error("internal error serving a request", exc_info=exc)
    return protocol.encode(refused(exc).json())


def _render(fut: asyncio.Future, _: Any = None) -> bytes:
    exc = fut.exception()
    return _error_bytes(exc) if exc is not None else protocol.encode(fut.result())


def _render_enqueues(fut: asyncio.Future, run: list[int]) -> bytes:
    """The replies of a run of consecutive `enqueue` requests of one read, [start, stop)
    of its submission: one pending entry and one render for the run, not one per request."""
    start, stop = run
    exc = fut.exception()
    if exc is not None:
        return _error_bytes(exc) * (stop - start)
    out = []
    for answer in fut.result()[start:stop]:
        if type(answer) is list and len(answer) == 1 and not answer[0].duplicate:
            # The hottest reply, formatted directly: an int and one of the fixed state names.
            out.append(b'{"ok":true,"job_id":%d,"state":"%s"}\n' % (answer[0].job_id, answer[0].state.encode()))
        else:
            out.append(_render_answer(answer, False))
    return b"".join(out)


def _render_enqueue_many(fut: asyncio.Future, index: int) -> bytes:
    exc = fut.exception()
    return _error_bytes(exc) if exc is not None else _render_answer(fut.result()[index], True)


def _render_warned(fut: asyncio.Future, arg: tuple[int, bool, list[str]]) -> bytes:
    """The reply of an enqueue (or enqueue_many) that was accepted with warnings."""
    index, many, warnings = arg
    exc = fut.exception()
    return _error_bytes(exc) if exc is not None else _render_answer(fut.result()[index], many, warnings)


def _render_answer(answer: list[Submitted] | Refusal, many: bool, warnings: list[str] | None = None) -> bytes:
    return protocol.encode(answer_reply(answer, many, warnings))

READ_BUFFER = 65536  # bytes one read takes; shared by the loop's connections


class Connection(asyncio.BufferedProtocol):
    def __init__(self, server: Host, source: str = "") -> None:
        self.server = server
        self.source = source  # the peer's address as api/preauth.py counts it
        self.unproven = True  # counts toward its source's share of unauthenticated connections
        self.svc = server.service
        self.loop = server.loop
        self.buf = bytearray()
        # Replies owed, in request order: bytes when ready, else (future, render, arg) with
        # render(future, arg) -> bytes once the future is done.
        self.pending: deque[bytes | tuple[asyncio.Future, Callable[[asyncio.Future, Any], bytes], Any]] = deque()
        self.authed = server.service.tokens is None
        self.token_name: str | None = None  # the name of the token it authenticated with
        self.transport: asyncio.Transport | None = None
        self.opened = False  # connection_made has run (the server counts it as open)
        self.closing = False
        self._hooked: asyncio.Future | None = None
        self._reading_paused = False
        self._writing_paused = False
        self.fresh = True  # nothing received yet: a Queick 1.2.1 client may show itself
        self.legacy: LegacyConnection | None = None
        self.bad_tokens = 0
        self._stalled = False  # complete lines wait in buf for replies to drain
        self._eof = False
        # Requests take effect in the order sent, as their replies come: a request of another
        # kind than enqueue starts once this connection's enqueues before it are committed
        # (_writes: their groups' futures; two commits may end out of order, one inline and
        # one queued) and the request before it is done (_op, the latest; each waits for the
        # one before); an enqueue group after such a request is submitted once it is done.
        self._writes: list[asyncio.Future] = []
        self._op: asyncio.Future | None = None
        self._hello_timer: asyncio.TimerHandle | None = None
        self._evicted: str | None = None  # closed for another host before it was set up

    # --- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.opened = True
        server = self.server
        server.opened(self)
        if self._evicted is not None:
            self.transport.write(protocol.encode(QueueError(Code.QUEUE_FULL, self._evicted, 1.0).to_reply()))
            self.transport.close()
            return
        if server.hello_timeout:
            self._hello_timer = self.loop.call_later(server.hello_timeout, self._hello_expired)

    def _hello_expired(self) -> None:
        self._hello_timer = None
        if self.transport is None or self.closing or (self.legacy is not None and self.legacy.done):
            return
        what = "authenticate (hello with the token)" if self.svc.tokens is not None else "send a request"
        log.info("closed a connection that did not %s within %.0f s", what, self.server.hello_timeout)
        if self.legacy is None:
            msg = f"no {'hello' if self.svc.tokens is not None else 'request'} within {self.server.hello_timeout:g} s"
            self.transport.write(protocol.encode(QueueError(Code.UNAUTHORIZED if self.svc.tokens is not None
                                                            else Code.BAD_REQUEST, msg).to_reply()))
        self.transport.close()

    def _shown(self) -> None:
        """The peer did what the hello timeout asks of it (or is gone): it no longer applies,
        and the connection no longer counts as unauthenticated."""
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        self._prove()

    def _prove(self) -> None:
        if self.unproven:
            self.unproven = False
            self.server.proven(self)

    def evict(self, message: str) -> None:
        """Close an unauthenticated connection to admit another host's (api/preauth.py,
        which no longer counts it); one not yet set up is closed once it is."""
        self.unproven = False
        self._shown()
        self._evicted = message
        log.info("evicted an unauthenticated connection from %s", self.source)
        if self.transport is not None and not self.closing:
            if self.legacy is None:
                self.transport.write(protocol.encode(QueueError(Code.QUEUE_FULL, message, 1.0).to_reply()))
            self.transport.close()
        self.closing = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._shown()
        if self.legacy is not None:
            self.legacy.close()  # a decode still queued is dropped: no one is left to answer
        self.server.connections.discard(self)
        if not self.server.connections and self.server.drained is not None:
            self.server.drained.set()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._set_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._set_reading()

    def eof_received(self) -> bool | None:
        """The peer shut its sending side (`nc -q1`, `printf ... | nc`): it still reads. Answer
        every request read so far (enqueues once committed), then close; returning True keeps
        our sending side open until `_pump` has written the last reply owed."""
        if self.legacy is not None:  # a Queick request is one shot: its own reply path closes
            return self.legacy.eof_received() or None
        self._eof = True
        del self.buf[self.buf.rfind(b"\n") + 1:]  # a last line without its newline is no request
        self._parse()
        self._pump()
        return self.transport is None or self.transport.get_extra_info("ssl_object") is None  # TLS ends at EOF

    def get_buffer(self, sizehint: int) -> memoryview:
        """One buffer the server keeps for its loop, copied out at once by buffer_updated:
        data_received would cost a fresh 256 KiB mapping (and its unmapping) per read."""
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.server.read_buffer[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        if self.fresh:
            self.fresh = False
            if data[:1] == _TLS_FIRST:
                self.transport.write(protocol.encode(QueueError(Code.BAD_REQUEST, "this port does not speak "  # type: ignore[union-attr]
                                     "TLS: connect without it, or start the daemon with --tls-cert").to_reply()))
                self.closing = True
                self.transport.close()  # type: ignore[union-attr]
                return
            if data[:1] == _QUEICK_FIRST:
                if self.server.accept_queick_clients:
                    from .legacy import LegacyConnection  # pickle and its bounds: only when served

                    # Proven once its whole request is read, as a line is: a first byte alone
                    # must not take it out of its source's share (the hello timeout still bounds it).
                    self.legacy = LegacyConnection(self.svc, self.transport, self.loop, self.server.io,  # type: ignore[arg-type]
                                                   decoder=self.server.decoder, max_expanded=self.server.max_line,
                                                   on_request=self._prove)
                else:
                    log.warning("a Queick 1.2.1 client (pickle) connected; start with "
                                "--accept-queick-clients to serve it")
        if self.legacy is not None:
            self.legacy.data_received(bytes(data))
            return
        if self.closing:
            return
        self.buf += data
        self._parse()

    def _parse(self) -> None:
        """Handle the complete lines buffered, up to the pending-replies cap (the rest stay
        buffered, and reading pauses, until replies drain)."""
        if self.closing or self.transport is None:
            return
        max_pending = self.server.max_pending
        group: list[Any] | None = None  # [requests, future, open run] of this read's enqueues
        start = 0
        buf = self.buf
        max_line = self._max_line()  # again after each line until the token is given
        while len(self.pending) < max_pending:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = buf[start:nl]  # a copy; _handle decodes it, nothing keeps it
            start = nl + 1
            if len(line) > max_line:
                self._refuse_oversized()
                break
            if line.endswith(b"\r"):
                line = line[:-1]
            if line.strip():
                group = self._handle(line, group)
                if self.unproven and self.svc.tokens is None:
                    self._shown()
                if self.closing:
                    break
                if max_line == PREAUTH_MAX_LINE:
                    max_line = self._max_line()
        if not self.closing:
            del self.buf[:start]
            more = self.buf.find(b"\n") >= 0
            self._stalled = more
            if self._eof and not more:
                self.closing = True  # every request read is handled: close once answered
            elif len(self.buf) > self._max_line() and not more:
                self._refuse_oversized()
        if group is not None:
            self._submit(group)
        self._pump()

    def _max_line(self) -> int:
        return self.server.max_line if self.authed or self.svc.tokens is None else PREAUTH_MAX_LINE

    # --- requests ---------------------------------------------------------------------------
    def _refuse_oversized(self) -> None:
        msg = f"request line longer than {self._max_line()} bytes; closing the connection"
        self.pending.append(protocol.encode(QueueError(Code.BAD_REQUEST, msg).to_reply()))
        self.closing = True
        self.buf.clear()

    def _handle(self, line: bytes, group: list[Any] | None) -> list[Any] | None:
        try:
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                raise QueueError(Code.BAD_REQUEST, "request is not UTF-8") from None
            req = protocol.decode_line(text)
            op = req["op"]
            if op == "hello":
                try:
                    reply = self.svc.hello(req)
                except QueueError as e:
                    self._bad_token(e)
                    return group
                self.authed = True
                self._shown()
                if reply.get("token_name", self.token_name) != self.token_name:  # revoking a name closes it
                    self.token_name = reply["token_name"]
                    self.svc.tokens.connected(self.token_name)  # type: ignore[union-attr]
                self.pending.append(protocol.encode(reply))
                return group
            if not self.authed:
                raise QueueError(Code.UNAUTHORIZED, "send hello with the token first")
            if op in ("enqueue", "enqueue_many"):
                jobs = self.svc.prepare_jobs(req)
                warnings = self.svc.enqueue_warnings(jobs)
                if group is None:
                    after = self._op if self._op is not None and not self._op.done() else None
                    group = [[], self.loop.create_future(), None, after]  # requests, future, open run, after
                    if len(self._writes) >= 8:
                        self._writes = [f for f in self._writes if not f.done()]
                    self._writes.append(group[1])
                index = len(group[0])
                group[0].append(jobs)
                run = group[2]
                if warnings:  # rare: a reply of its own, not one of a run's fixed form
                    self.pending.append((group[1], _render_warned, (index, op == "enqueue_many", warnings)))
                elif op == "enqueue_many":
                    self.pending.append((group[1], _render_enqueue_many, index))
                elif run is not None and self.pending[-1] is run:  # extends the run just before
                    run[2][1] = index + 1
                else:
                    group[2] = run = (group[1], _render_enqueues, [index, index + 1])
                    self.pending.append(run)
                return group
            if group is not None:  # the enqueues before it go now; those after it form a group of their own
                self._submit(group)
                group = None
            self._writes = [f for f in self._writes if not f.done()]
            before = self._writes + ([self._op] if self._op is not None and not self._op.done() else [])
            fut = asyncio.ensure_future(self._after(before, op, req)) if before else self._start(op, req)
            self._op = fut
            self.pending.append((fut, _render, None))
        except Exception as e:  # a QueueError, or a bug: it must cost one reply, not the connection
            self.pending.append(_error_bytes(e))
        return group

    def _start(self, op: str, req: dict[str, Any]) -> asyncio.Future:
        if op == "wait":
            return asyncio.ensure_future(waits.for_job(self.svc, self.server.io, req))
        if op == "workflow_wait":
            return asyncio.ensure_future(waits.for_run(self.svc, self.server.io, req))
        return self.loop.run_in_executor(self.server.io, self.svc.call, req)

    async def _after(self, before: list[asyncio.Future], op: str, req: dict[str, Any]) -> Any:
        await asyncio.wait(before)  # their outcomes are their own replies'
        return await self._start(op, req)

    def _bad_token(self, e: QueueError) -> None:
        """A wrong token: answered after BAD_TOKEN_DELAY (the next lines wait behind it), and
        the MAX_BAD_TOKENS-th closes the connection."""
        self.bad_tokens += 1
        fut = self.loop.create_future()
        self.loop.call_later(BAD_TOKEN_DELAY, lambda: fut.done() or fut.set_exception(e))
        self.pending.append((fut, _render, None))
        if self.bad_tokens >= MAX_BAD_TOKENS:
            log.warning("closed a connection after %d wrong tokens", self.bad_tokens)
            self.closing = True
            self.buf.clear()

    def _submit(self, group: list[Any]) -> None:
        jobs, fut, _, after = group
        if after is not None and not after.done():
            after.add_done_callback(lambda _: self._submit(group))
            return
        inbox = self.server.inbox
        here = threading.get_ident()

        def done(result: Any) -> None:  # this thread (inline commit) or the committer's
            if threading.get_ident() == here:
                self._answered(fut, result, jobs)  # the ack leaves now, before the post-commit work (the claim)
            else:
                inbox.call(self._answered, fut, result, jobs)  # a commit's answers share one wake-up of the loop

        # Every connection's enqueues of this loop pass go to the committer together; a pass
        # with one small read (a lone client) commits right here, at no thread hand-off.
        self.server.gather.submit(jobs, done)

    def _answered(self, fut: asyncio.Future, result: Any, jobs: list[Any] | None = None) -> None:
        """On the loop: the answer to this connection's enqueues (an inline commit's, or the
        committer's). The replies leave now, not from a done-callback in the loop's next
        pass (unhooked first: it would cost that pass, with a poll of its own, per commit)."""
        if self._hooked is fut:
            fut.remove_done_callback(self._pump)
            self._hooked = None
        _resolve(fut, result)
        if self.token_name is not None and jobs is not None and type(result) is list:
            self.svc.tokens.enqueued(self.token_name, self.source, [j.func for js in jobs for j in js], result)  # type: ignore[union-attr]
        self._pump()

    # --- replies ----------------------------------------------------------------------------
    def _pump(self, _fut: asyncio.Future | None = None) -> None:
        if _fut is not None and _fut is self._hooked:
            self._hooked = None
        out = []
        pending = self.pending
        while pending:
            head = pending[0]
            if type(head) is bytes:
                out.append(head)
            else:
                fut, render, arg = head
                if not fut.done():
                    if self._hooked is not fut:
                        self._hooked = fut
                        fut.add_done_callback(self._pump)
                    break
                out.append(render(fut, arg))
            pending.popleft()
        if self.transport is None:
            return
        if out:
            self.transport.write(b"".join(out))
        if self.closing and not pending:
            self.transport.close()
            return
        self._set_reading()

    def _set_reading(self) -> None:
        if self.transport is None or self.closing:
            return
        n = len(self.pending)
        cap = self.server.max_pending
        if not self._reading_paused and (n >= cap or self._writing_paused):
            self._reading_paused = True
            self.transport.pause_reading()
        elif self._reading_paused and n <= cap // 2 and not self._writing_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        if self._stalled and not self._reading_paused:
            self._stalled = False
            self.loop.call_soon(self._parse)  # lines that waited for the replies to drain

    def begin_close(self) -> None:
        """Finish the replies already owed, then close (used at shutdown)."""
        self.closing = True
        if self.legacy is not None and self.legacy.done:
            return  # a Queick request being committed: it closes itself after its one reply
        self._pump()

def _resolve(fut: asyncio.Future, result: Any) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
