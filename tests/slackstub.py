"""A local HTTP server standing in for Slack: the Web API's chat.postMessage under
/api/ (slack-sdk's base_url) and incoming webhooks under /services/.

Answers come from a script the test sets (`then(...)`): each request takes the next
answer; once the script is empty every request is answered ok. An answer may be
HOLD: the request waits, unanswered, until release() (or the server closes). Only
requests that were answered ok count as posted (`posted`); every request is recorded
(`requests`). `wait_posted(n)` blocks until n messages were posted.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOLD = "hold"


class SlackStub:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.posted: list[dict[str, Any]] = []
        self._script: list[Any] = []
        self._lock = threading.Lock()
        self._posted_q: queue.Queue[dict[str, Any]] = queue.Queue()
        self._arrived_q: queue.Queue[dict[str, Any]] = queue.Queue()
        self._release = threading.Event()
        self._ts = 0
        self.server: ThreadingHTTPServer | None = None
        self.port = 0

    # --- control -------------------------------------------------------------------------------
    def start(self, port: int = 0) -> SlackStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                stub._handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def close(self) -> None:
        """Stop listening: connections are refused from now on; held requests are dropped."""
        self._release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/T000/B000/XXXX"

    def then(self, *answers: Any) -> SlackStub:
        """Queue answers: HOLD, or (status, body) / (status, body, headers); a dict body is JSON."""
        with self._lock:
            self._script.extend(answers)
        return self

    def release(self) -> None:
        self._release.set()

    def wait_posted(self, n: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.posted) < n:
            try:
                self._posted_q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{len(self.posted)} of {n} messages posted; requests: {self.requests}") from None
        return self.posted

    def wait_request(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next request to arrive (answered or not)."""
        try:
            return self._arrived_q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no request arrived; requests so far: {self.requests}") from None

    # --- serving -------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = {"raw": body.decode(errors="replace")}
        req = {"path": h.path, "auth": h.headers.get("Authorization"), "json": payload, "at": time.time()}
        with self._lock:
            self.requests.append(req)
            answer = self._script.pop(0) if self._script else None
        self._arrived_q.put(req)
        if answer == HOLD:
            self._release.wait(60)
            h.close_connection = True
            return  # never answered: the client sees the connection drop
        webhook = h.path.startswith("/services/")
        if answer is None:
            with self._lock:
                self._ts += 1
                ts = f"1700000000.{self._ts:06d}"
            answer = (200, "ok" if webhook else {"ok": True, "channel": payload.get("channel"), "ts": ts})
            req["ts"] = None if webhook else ts
        status, content, *rest = answer
        headers = rest[0] if rest else {}
        data = json.dumps(content).encode() if isinstance(content, dict) else str(content).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json" if isinstance(content, dict) else "text/plain")
        h.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            h.send_header(k, str(v))
        h.end_headers()
        h.wfile.write(data)
        ok = status == 200 and (content == "ok" or (isinstance(content, dict) and content.get("ok")))
        if ok:
            with self._lock:
                self.posted.append(req)
            self._posted_q.put(req)
