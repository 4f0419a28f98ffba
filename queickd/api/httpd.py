"""The optional HTTP listener (`--http HOST:PORT`): webhooks, /metrics, /healthz, /jobs/ID, /.

Stdlib http.server, a thread per connection, at most MAX_CONNECTIONS at once and fair
shares per source (_Server); a request has one deadline for its line, headers and body,
however slowly its bytes come. A webhook delivery is acknowledged only once its job is
committed (the TCP path's group commit): 202 a new job, 200 a repeated delivery, 429 +
Retry-After when the hook's key or the queue is full, 401 a bad or missing signature, 404
an unknown hook, 411 no Content-Length, 413 a body over the hook's limit (before reading
it), 400 a body the hook cannot parse. Framing is strict, so that no proxy in front can be
made to see another request than this server does (_Handler.parse_request). With a read
token (`--http-token-file`), `/`, `/metrics` and `/jobs/ID` want `Authorization: Bearer
TOKEN` (401 without); `/healthz` and the hooks (signed) stay open.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
import re
import resource
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..core.policy.admission import Refusal
from ..core.protocol import MAX_ID, Code, QueueError
from ..settings import DEFAULT_HTTP_PORT
from ..ui import statuspage
from ..ui.metrics import Metrics
from . import hooks as hooks_mod
from . import preauth
from .replies import NotCommittedError, answer_reply, refused
from .service import QueueService

log = logging.getLogger("queickd.http")

_COMMIT_TIMEOUT = 60.0  # seconds a delivery waits for its commit before answering 503
_JOB_PATH = re.compile(r"^/jobs/(\d{1,19})$")
_HOOK_PATH = re.compile(r"^/hooks/([^/]+)$")
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII only: int() would also take '0_7', '+5', ' 5', '٣'
_OPEN_PATHS = ("/healthz",)  # never behind the read token: probes carry no credentials
_HEADER_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a token (RFC 9110): no whitespace
# Connections served at once, each a thread and a file descriptor. Far more than webhooks,
# scrapes and a status page need, and half the FD_RESERVE descriptors the TCP port leaves
# free (api/server.py) with the usual limits; a small RLIMIT_NOFILE lowers it to an eighth.
MAX_CONNECTIONS = 64
_REQUEST_TIME = 10.0  # seconds for a request line and headers (with a keep-alive's wait for it)
_BODY_RATE = 64 * 1024  # bytes a second a body adds to that: 1 MiB (the default max_body) gets 16 s
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 5\r\nRetry-After: 1\r\nConnection: close\r\n\r\nbusy\n")


def connection_cap(nofile: int) -> int:
    """The HTTP connections served at once under a soft RLIMIT_NOFILE of `nofile`."""
    if nofile == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, nofile // 8))


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or 'PORT' (loopback), '[::1]:PORT' → (host, port)."""
    t = text.strip()
    host, sep, port = t.rpartition(":")
    if not sep:
        host, port = "", t
    host = host.strip("[]") or "127.0.0.1"
    try:
        n = int(port)
    except ValueError:
        raise ValueError(f"--http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:{DEFAULT_HTTP_PORT}") from None
    if not 0 <= n <= 65535:
        raise ValueError(f"--http {text!r}: port must be 0-65535")
    return host, n


class HttpServer:
    def __init__(self, service: QueueService, metrics: Metrics, hooks: dict[str, hooks_mod.Hook],
                 host: str = "127.0.0.1", port: int = DEFAULT_HTTP_PORT, *, token: str | None = None) -> None:
        self.service = service
        self.token = token  # the bearer token of the read endpoints, if any
        self.metrics = metrics
        self.hooks = hooks
        self.host = host
        self.port = port
        self.address: tuple[str, int] | None = None
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self) -> None:
        """Bind and serve in a thread; returns once listening. OSError if it cannot bind."""
        if self._httpd is not None:
            return
        owner = self

        class Handler(_Handler):
            server_owner = owner

        server_class = _Server6 if ":" in self.host else _Server
        httpd = server_class((self.host, self.port), Handler,
                             connection_cap(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        httpd.timeout = None  # handle_request blocks until a connection: no polling
        self._httpd = httpd
        self.address = httpd.server_address[:2]  # type: ignore[assignment]
        self._thread = threading.Thread(target=self._serve, args=(httpd,), name="queickd-http", daemon=True)
        self._thread.start()

    def _serve(self, httpd: ThreadingHTTPServer) -> None:
        # serve_forever would wake every poll_interval to look for shutdown(); an idle
        # daemon should not. stop() wakes this loop by connecting to it instead.
        while not self._stopping:
            httpd.handle_request()

    def stop(self) -> None:
        """Stop accepting and close the socket. Idempotent; safe before start()."""
        if self._httpd is None or self._stopping:
            return
        self._stopping = True
        host, port = self.address  # type: ignore[misc]
        wake_host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        with contextlib.suppress(OSError):
            socket.create_connection((wake_host, port), timeout=2).close()
        if self._thread is not None:
            self._thread.join(5.0)
        self._httpd.server_close()

    # --- one webhook delivery (a request thread) -------------------------------------------
    def deliver(self, hook: hooks_mod.Hook, headers: dict[str, str], body: bytes,
                content_type: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        """→ (status, JSON reply, extra headers). The body is already size- and signature-checked."""
        svc = self.service
        try:
            arg = hook.payload(headers, body, content_type)
        except (ValueError, UnicodeDecodeError) as e:
            return 400, _error(Code.BAD_REQUEST, f"the body is not valid JSON: {e}"), {}
        spec: dict[str, Any] = {"func": hook.func, "args": [arg], "key": hook.key, **dict(hook.job)}
        delivery = hook.delivery_id(headers)
        if delivery:
            spec["idempotency_key"] = hooks_mod.idempotency_key(hook, delivery)
        try:
            if hook.workflow is not None:
                reply = svc.start_workflow(None, hook.workflow, {"hook": arg}, spec.get("idempotency_key"))
            else:
                job = svc.prepare_job(spec)
                answer = svc.enqueue_wait([[job]], _COMMIT_TIMEOUT)[0]
                if isinstance(answer, Refusal):
                    return refused(answer).http()
                reply = answer_reply(answer, False, svc.enqueue_warnings([job]))
        except NotCommittedError as e:
            log.warning("webhook %s: not accepted: %s", hook.name, e)
            return refused(e).http()
        except QueueError as e:
            return refused(e).http()
        if reply.get("duplicate"):
            return 200, reply, {}
        self.metrics.on_hook(hook.name)
        return 202, reply, {}


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most `cap` at once; one more is answered 503 and closed
    on the accepting thread, so a flood costs no thread and keeps no descriptor. No HTTP
    connection proves itself before its request, so all are shared by source as the TCP
    port's unauthenticated ones are (api/preauth.py): one host cannot take every
    connection (and with them the webhooks and /healthz) from the others."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], cap: int) -> None:
        self._slots = threading.BoundedSemaphore(cap)
        self.cap = cap
        self.per_source = max(1, cap // preauth.PER_SOURCE_SHARE)
        self.open_to_all = max(1, cap - cap // preauth.PROVEN_RESERVE_SHARE)
        self._held: Counter[str] = Counter()  # connections open, per source
        self._held_lock = threading.Lock()  # the accepting thread adds, connection threads remove
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        source = preauth.source_of(client_address)
        with self._held_lock:
            held = self._held[source]
            fair = held < self.per_source or self._held.total() < self.open_to_all
            if fair:
                self._held[source] += 1
        if not fair:
            log.warning("HTTP: %s holds %d connections of %d, refusing one more while others may want in",
                        source, held, self.cap)
        elif not self._slots.acquire(blocking=False):
            log.warning("HTTP: %d connections open already, refusing one more", self.cap)
            self._let_go(source)
            fair = False
        if not fair:
            _refuse(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread started to release it
            self._let_go(source)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
            self._let_go(preauth.source_of(client_address))

    def _let_go(self, source: str) -> None:
        with self._held_lock:
            self._held[source] -= 1
            if self._held[source] <= 0:
                del self._held[source]


class _Server6(_Server):
    address_family = socket.AF_INET6


def _refuse(request: socket.socket) -> None:
    """503 without blocking the accepting thread (a new socket's send buffer takes it)."""
    with contextlib.suppress(OSError):
        request.setblocking(False)
        request.send(_BUSY)
        # Read what the client sent already: left unread, it makes close() reset the
        # connection, and the client could lose the 503.
        request.recv(65536)


class _DeadlineReader(io.RawIOBase):
    """A connection's reads, each given only what is left of the request's time, so a
    client sending a byte now and then cannot hold its thread past `deadline`."""

    def __init__(self, sock: socket.socket, write_timeout: float | None) -> None:
        self._sock = sock
        self._write_timeout = write_timeout  # restored after each read: replies keep theirs
        self.deadline = time.monotonic() + _REQUEST_TIME

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._write_timeout)


class _HeaderLines:
    """The header lines http.client reads, kept: it drops or folds malformed ones silently."""

    def __init__(self, fp: io.BufferedReader) -> None:
        self.fp = fp
        self.lines: list[bytes] = []

    def readline(self, limit: int = -1) -> bytes:
        line = self.fp.readline(limit)
        self.lines.append(line)
        return line

    def well_formed(self) -> bool:
        """Every line is NAME: VALUE, the name a token right before its colon. A space
        before the colon or a continuation line could carry framing (Content-Length,
        Transfer-Encoding) that a proxy in front reads and this server would not."""
        for line in self.lines:
            if line in (b"\r\n", b"\n", b""):
                break
            name, colon, _ = line.partition(b":")
            if not colon or not _HEADER_NAME.fullmatch(name):
                return False
        return True


def _error(code: str, message: str) -> dict[str, Any]:
    return QueueError(code, message).to_reply()


class _Handler(BaseHTTPRequestHandler):
    server_owner: HttpServer
    server_version = "queickd"
    protocol_version = "HTTP/1.1"  # keep-alive for senders that reuse connections; every reply has a length
    timeout = 30  # seconds a slow client may take per write (reads have the request's deadline)
    _reader: _DeadlineReader
    _head: _HeaderLines | None = None

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # replaced by one whose reads keep to the request's deadline
        self._reader = _DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + _REQUEST_TIME
        super().handle_one_request()

    def _malformed_headers(self) -> bool:
        return bool(self.headers.defects) or self._head is None or not self._head.well_formed()

    def _hook_for(self, path: str) -> hooks_mod.Hook | None:
        m = _HOOK_PATH.fullmatch(path.split("?", 1)[0])
        return self.server_owner.hooks.get(m.group(1)) if m else None

    def parse_request(self) -> bool:
        """The request line and headers, then the framing checks that keep one request from
        being read as two (request smuggling). False (after the error reply) to refuse."""
        rfile = self.rfile
        self.rfile = self._head = _HeaderLines(rfile)  # type: ignore[assignment]
        try:
            if not super().parse_request():
                return False
        finally:
            self.rfile = rfile
        if self._malformed_headers():
            self._close_with(400, "malformed header line (whitespace before the colon, or a continuation line)")
            return False
        te = self.headers.get_all("Transfer-Encoding")
        lengths = self.headers.get_all("Content-Length") or []
        if te:
            if lengths:
                self._close_with(400, "Transfer-Encoding and Content-Length together")
            else:
                self._close_with(501, "Transfer-Encoding is not supported; send Content-Length")
            return False
        if len(lengths) > 1 or (lengths and not _DIGITS.fullmatch(lengths[0])):
            self._close_with(400, "Content-Length is not a number")
            return False
        if lengths and self.command != "POST" and int(lengths[0]) > 0:
            self.close_connection = True  # a body we do not read must never be taken for a request
        return True

    def _authorized(self, path: str) -> bool:
        token = self.server_owner.token
        if token is None or path in _OPEN_PATHS:
            return True
        given = self.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        value = value.strip()
        return (scheme.lower() == "bearer" and value.isascii()
                and hmac.compare_digest(value.encode(), token.encode()))

    def handle_expect_100(self) -> bool:
        # "Expect: 100-continue" (curl sends it for bodies over 1 KiB): invite the body only
        # when it will be read; otherwise do_POST answers at once and the body never comes.
        hook = self._hook_for(self.path)
        length = self.headers.get("Content-Length", "")
        if (self.command == "POST" and hook is not None and _DIGITS.fullmatch(length) and not self.headers.get("Transfer-Encoding")
                and int(length) <= hook.max_body and not self._malformed_headers()):
            return super().handle_expect_100()
        self.close_connection = True
        return True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj, ensure_ascii=False).encode() + b"\n", "application/json", headers)

    def _close_with(self, status: int, message: str, code: str = Code.BAD_REQUEST,
                    headers: dict[str, str] | None = None) -> None:
        """An error reply, then the connection closed: a body left unread is never taken for a request."""
        self.close_connection = True
        self._json(status, _error(code, message), headers)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        owner = self.server_owner
        path = self.path.split("?", 1)[0]
        if not self._authorized(path):
            return self._json(401, _error(Code.UNAUTHORIZED, "bad or missing bearer token"),
                              {"WWW-Authenticate": 'Bearer realm="queickd"'})
        try:
            if path == "/metrics":
                text = owner.metrics.render(owner.service.op_stats({"detail": True}))
                self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/healthz":
                ok, reason = owner.service.health()
                self._send(200 if ok else 503, (reason + "\n").encode(), "text/plain; charset=utf-8")
            elif path in ("/", "/index.html"):
                page = statuspage.render(statuspage.snapshot(owner.service))
                self._send(200, page.encode(), "text/html; charset=utf-8")
            elif m := _JOB_PATH.fullmatch(path):
                job_id = int(m.group(1))
                try:
                    if job_id > MAX_ID:  # no job has it, and the store cannot even look it up
                        raise QueueError(Code.NOT_FOUND, f"no job {job_id}")
                    self._json(200, {"ok": True, "job": owner.service.job(job_id).to_dict()})
                except QueueError as e:  # not found
                    self._json(*refused(e).http())
            else:
                self._json(404, _error(Code.NOT_FOUND, f"nothing at {path}"))
        except Exception as e:  # a bug costs one reply, never the listener
            log.exception("error serving GET %s", path)
            self._json(*refused(e).http())

    do_HEAD = do_GET  # noqa: N815

    def do_POST(self) -> None:  # noqa: N802
        owner = self.server_owner
        path = self.path.split("?", 1)[0]
        m = _HOOK_PATH.fullmatch(path)
        hook = self._hook_for(path)
        if hook is None:
            return self._close_with(404, f"no hook named {m.group(1)!r}" if m else f"nothing at {path}",
                                    Code.NOT_FOUND)
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return self._close_with(411, "Content-Length is required")
        length = int(length_text)  # parse_request let only ASCII digits through
        if length > hook.max_body:
            return self._close_with(413, f"body of {length} bytes is over the hook's limit of {hook.max_body}")
        self._reader.deadline += length / _BODY_RATE  # a big body may take longer, not forever
        body = self.rfile.read(length)
        if len(body) < length:
            return self._close_with(400, "body shorter than Content-Length")
        if not hook.signature_ok(body, self.headers.get(hook.signature_header)):
            log.warning("webhook %s: bad or missing %s from %s", hook.name, hook.signature_header,
                        self.address_string())
            return self._json(401, _error(Code.UNAUTHORIZED, f"bad or missing {hook.signature_header}"))
        headers: dict[str, str] = {}
        for k, v in self.headers.items():  # all of them: the delivery id may be in a dropped one
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        try:
            status, reply, extra = owner.deliver(hook, headers, body,
                                                 self.headers.get("Content-Type", "application/octet-stream"))
        except Exception as e:
            log.exception("error serving webhook %s", hook.name)
            status, reply, extra = refused(e).http()
        self._json(status, reply, extra)

    def _not_allowed(self) -> None:
        self._close_with(405, f"{self.command} is not supported here", headers={"Allow": "GET, POST"})

    do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815 - http.server's naming
