"""The TCP enqueue server (protocol v1, port 9999): the listener and its limits.

An asyncio loop in its own thread serves every connection (api/connection.py). Before
anyone authenticates: at most `max_connections` at once (lowered to keep FD_RESERVE file
descriptors free; one more is told so and closed), `hello_timeout` seconds to send a
complete first line (with TLS, from the accept: the handshake counts), and fair shares of
the connections per source (api/preauth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import selectors
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..core import protocol
from ..core.protocol import Code, QueueError
from ..services.batcher import Gather
from ..settings import DEFAULT_HELLO_TIMEOUT, DEFAULT_HOST, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_PENDING
from .connection import PREAUTH_MAX_LINE, READ_BUFFER, Connection
from .inbox import Inbox
from .preauth import PreauthLimits, source_of
from .service import QueueService
from .tls import HANDSHAKE_FIRST_BYTE

log = logging.getLogger("queickd.server")

FD_RESERVE = 128  # file descriptors kept for the store, the jobs, the HTTP listener, logs
_ACCEPT_BATCH = 32  # connections accepted per wake-up (asyncio's own loop takes 1024 at once)
_ACCEPT_PAUSE = 1.0  # seconds accepting rests when the process is out of file descriptors
_OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_INLINE_MAX = 8  # jobs in a lone read small enough to commit on the loop thread


class _PassSelector(selectors.DefaultSelector):
    """The loop's selector, counting the I/O events of its last poll: each is one callback
    of the loop's pass. A read that finds the pass had one event is the pass's only read,
    so no other submission can join its flush (Gather's `pass_has_more`)."""

    events = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        self.events = len(ready)
        return ready

    def pass_has_more(self) -> bool:
        return self.events > 1


def connection_cap(max_connections: int, nofile: int) -> int:
    """The connections served at once: `max_connections`, lowered so that FD_RESERVE file
    descriptors (or half of a small limit) stay free under RLIMIT_NOFILE's soft `nofile`."""
    return max(1, min(max_connections, nofile - min(FD_RESERVE, nofile // 2)))

class Server:
    def __init__(
        self,
        service: QueueService,
        host: str = DEFAULT_HOST,
        port: int = protocol.DEFAULT_PORT,
        *,
        max_line: int = protocol.MAX_LINE,
        io_threads: int = 4,
        accept_queick_clients: bool = False,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        hello_timeout: float = DEFAULT_HELLO_TIMEOUT,
        max_pending: int = DEFAULT_MAX_PENDING,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.service = service
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.max_connections = connection_cap(max_connections, nofile if nofile != resource.RLIM_INFINITY
                                              else max_connections + FD_RESERVE)
        if self.max_connections < max_connections:
            log.warning("serving at most %d connections, not %d: the file-descriptor limit is %d and %d "
                        "are kept for the store and jobs (raise LimitNOFILE)", self.max_connections,
                        max_connections, nofile, nofile - self.max_connections)
        self.hello_timeout = hello_timeout
        self.preauth = PreauthLimits(self.max_connections)
        self.max_pending = max_pending
        self.reload_tls: Callable[[], ssl.SSLContext | None] | None = None  # SIGHUP's new context
        self.tls = tls  # replaced whole on SIGHUP (reload_access): new connections take the new one
        self.accept_queick_clients = accept_queick_clients
        self.host = host
        self.port = port
        self.max_line = max_line
        self.io = ThreadPoolExecutor(io_threads, thread_name_prefix="queickd-io")
        # Queick pickles are checked and loaded here, one at a time: never on the loop. With
        # them served, at most a few are queued or running at once (legacy.DecodePool).
        if accept_queick_clients:  # loaded now, not on the loop when the first such client connects
            from .legacy import DecodePool

            self.decoder: ThreadPoolExecutor = DecodePool()
        else:
            self.decoder = ThreadPoolExecutor(1, thread_name_prefix="queickd-unpickle")
        self.connections: set[Connection] = set()
        self.read_buffer = memoryview(bytearray(READ_BUFFER))  # used on the loop's thread only
        self.loop: asyncio.AbstractEventLoop | None = None
        self.gather: Gather  # made with the loop, in _main
        self.inbox: Inbox  # likewise
        self.address: tuple[str, int] | None = None
        self.drained: asyncio.Event | None = None  # set when the last connection closes at shutdown
        self._listeners: list[socket.socket] = []
        # Accepted, not yet in `connections`: they count toward the cap. opened() moves a
        # connection across in one step, so that none is counted twice or not at all.
        self._opening = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        """Bind and start serving; returns once listening. Raises OSError if it cannot bind."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._main, name="queickd-server", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        selector = _PassSelector()
        self.loop = loop = asyncio.SelectorEventLoop(selector)
        self.gather = Gather(self.service.enqueue_all, loop.call_soon, _INLINE_MAX, selector.pass_has_more)
        self.inbox = Inbox(loop)
        try:
            # asyncio resolves and binds (every address of the host); accepting is ours
            # (_accept): asyncio's loop would take up to a backlog of sockets in one go,
            # each holding a descriptor until its transport is made and refused.
            srv = loop.run_until_complete(
                loop.create_server(lambda: Connection(self), self.host, self.port, start_serving=False))
            self._listeners = [socket.socket(fileno=os.dup(s.fileno())) for s in srv.sockets]
            srv.close()
            for s in self._listeners:
                s.listen(1024)
                s.setblocking(False)
                loop.add_reader(s.fileno(), self._accept, s)
        except BaseException as e:
            for s in self._listeners:
                s.close()
            self._error = e
            self._ready.set()
            loop.close()
            return
        self.address = self._listeners[0].getsockname()[:2]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _accept(self, lsock: socket.socket) -> None:
        """Accept a batch of connections; one over the cap is told so and closed at once, so
        a flood never holds more than a batch of descriptors beyond the cap."""
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, peer = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _OUT_OF_FDS:
                    log.error("cannot accept connections: %s; trying again in %.0f s", e.strerror, _ACCEPT_PAUSE)
                    self.loop.remove_reader(lsock.fileno())  # type: ignore[union-attr]
                    self.loop.call_later(_ACCEPT_PAUSE, self._resume_accepting, lsock)  # type: ignore[union-attr]
                else:  # the peer gave up before we accepted (ECONNABORTED): nothing to serve
                    log.debug("accept failed: %s", e)
                return
            protocol_side = Connection(self, source_of(peer))
            refusal = self.preauth.admit(protocol_side.source, protocol_side, len(self.connections) + self._opening)
            if refusal is not None:
                self._refuse(conn, refusal)
                continue
            self._opening += 1
            self.loop.create_task(self._open(conn, protocol_side))  # type: ignore[union-attr]

    def _refuse(self, conn: socket.socket, msg: str) -> None:
        log.warning("refused a connection: %s (--max-connections %d)", msg, self.max_connections)
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.send(protocol.encode(QueueError(Code.QUEUE_FULL, msg, 1.0).to_reply()))
        conn.close()

    async def _open(self, conn: socket.socket, protocol_side: Connection) -> None:
        try:
            conn.setblocking(False)
            tls = self.tls
            if tls is not None and not await self._begins_tls(conn, protocol_side.source):
                return
            await self.loop.connect_accepted_socket(lambda: protocol_side, conn, ssl=tls,  # type: ignore[union-attr]
                                                    ssl_handshake_timeout=self.hello_timeout if tls else None)
        except Exception as e:
            log.debug("could not set up an accepted connection: %s", e)
            conn.close()
        finally:
            if not protocol_side.opened:  # it never joined `connections` (opened())
                self._opening -= 1
                self.preauth.release(protocol_side.source, protocol_side)

    async def _begins_tls(self, conn: socket.socket, source: str) -> bool:
        """Whether the peer's first byte begins a TLS handshake. One that speaks plaintext
        (or nothing, within hello_timeout) is closed; a plaintext one is told why first, so
        that it fails at once with the reason instead of waiting on a handshake."""
        loop = self.loop
        readable = loop.create_future()  # type: ignore[union-attr]
        loop.add_reader(conn.fileno(), lambda: readable.done() or readable.set_result(None))  # type: ignore[union-attr]
        try:
            await asyncio.wait_for(readable, self.hello_timeout)
        finally:
            loop.remove_reader(conn.fileno())  # type: ignore[union-attr]
        first = conn.recv(1, socket.MSG_PEEK)
        if first and first[0] == HANDSHAKE_FIRST_BYTE:
            return True
        if first:
            log.info("closed a plaintext connection to the TLS port from %s", source)
        with contextlib.suppress(OSError):
            conn.recv(PREAUTH_MAX_LINE)  # read, so that the close sends a FIN, not a reset that loses the reply
            conn.send(protocol.encode(QueueError(Code.BAD_REQUEST, "this port speaks TLS: connect with TLS "
                                                 "(JobQueue(tls=...), queick --tls-ca FILE)").to_reply()))
            conn.shutdown(socket.SHUT_WR)
        conn.close()
        return False

    def reload_access(self) -> None:
        """SIGHUP, on the main thread: read the token file and the certificates again. New
        connections take the new ones; the connections of a revoked token are closed (once
        the replies they are owed are sent). A file that fails leaves the old in force."""
        if self.reload_tls is not None:
            try:
                self.tls = self.reload_tls()
                log.info("TLS certificate reloaded")
            except ValueError as e:
                log.error("SIGHUP: TLS not reloaded, the certificate in force stays: %s", e)
        if self.service.tokens is not None:
            try:
                revoked = self.service.tokens.reload()
            except ValueError as e:
                log.error("SIGHUP: the token file was not reloaded, the tokens in force stay: %s", e)
                return
            if revoked and self.loop is not None:
                self.loop.call_soon_threadsafe(self._revoke, revoked)

    def _revoke(self, names: set[str]) -> None:
        for c in list(self.connections):
            if c.token_name in names:
                log.warning("closed a connection of the revoked token %s from %s", c.token_name, c.source)
                c.begin_close()

    def opened(self, c: Connection) -> None:
        """An accepted connection is set up (its connection_made): it is served now, or,
        accepted before a shutdown began and set up after, closed as the others were."""
        self.connections.add(c)
        self._opening -= 1
        if self._closed:
            c.begin_close()

    def proven(self, c: Connection) -> None:
        """`c` authenticated (or, with no token, sent a request), or closed before it did."""
        self.preauth.release(c.source, c)

    def _resume_accepting(self, lsock: socket.socket) -> None:
        if not self._closed:
            self.loop.add_reader(lsock.fileno(), self._accept, lsock)  # type: ignore[union-attr]

    async def _shutdown(self, grace: float) -> None:
        self._closed = True
        for s in self._listeners:
            self.loop.remove_reader(s.fileno())  # type: ignore[union-attr]
            s.close()
        self.drained = asyncio.Event()
        for c in list(self.connections):
            c.begin_close()
        if self.connections:
            try:
                await asyncio.wait_for(self.drained.wait(), grace)
            except TimeoutError:
                log.warning("%d connection(s) still owed replies at shutdown", len(self.connections))
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()

    def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, send the replies owed (up to `grace` s), close. Idempotent."""
        if self._thread is None or self.loop is None or not self._listeners or self.loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(grace), self.loop).result(grace + 5)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5.0)
            self.io.shutdown(wait=False, cancel_futures=True)
            self.decoder.shutdown(wait=False, cancel_futures=True)
