"""A local HTTP server standing in for Slack: the Web API's chat.postMessage and
conversations.history under /api/ (slack-sdk's base_url) and incoming webhooks under
/services/.

Answers come from a script the test sets (`then(...)`): each request takes the next
answer; once the script is empty every request is answered as Slack would. An answer
may be HOLD: the request waits, unanswered, until release() (or the server closes); or
STALL: the post is accepted (stored, counts as posted) and then its answer is held the
same way, so the client never learns that it went through. Only posts that Slack
accepted count as posted (`posted`, with their metadata); every request is recorded
(`requests`). conversations.history answers from the posted messages, newest first, in
pages, with their metadata only if include_all_metadata is asked for; `history_error`
makes it answer ok:false instead. `post_every` makes it answer 429 to a post that comes
too soon after the last it took, as Slack does. `wait_posted(n)` blocks until n messages
were posted.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOLD = "hold"
STALL = "stall"


class SlackStub:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.posted: list[dict[str, Any]] = []
        self._script: list[Any] = []
        self._lock = threading.Lock()
        self._posted_q: queue.Queue[dict[str, Any]] = queue.Queue()
        self._arrived_q: queue.Queue[dict[str, Any]] = queue.Queue()
        self._release = threading.Event()
        self._last_ts = 0.0
        self.history_error: str | None = None  # e.g. "missing_scope": history answers ok:false with it
        # Seconds between two posts Slack takes: a post sooner than that after the last one it
        # took is answered 429 with the rest of the pause as Retry-After (None: no limit).
        self.post_every: float | None = None
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

            def do_GET(self) -> None:  # noqa: N802 - slack-sdk sends conversations.history as a GET
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

    def requests_to(self, method: str) -> list[dict[str, Any]]:
        """The requests to one Web API method, e.g. 'chat.postMessage'."""
        return [r for r in self.requests if r["path"].split("?")[0] == f"/api/{method}"]

    def wait_request(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next request to arrive (answered or not)."""
        try:
            return self._arrived_q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no request arrived; requests so far: {self.requests}") from None

    # --- serving -------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        if "x-www-form-urlencoded" in (h.headers.get("Content-Type") or ""):
            payload = dict(urllib.parse.parse_qsl(body.decode()))  # slack-sdk's GETs carry a form body
        else:
            try:
                payload = json.loads(body or b"{}")
            except ValueError:
                payload = {"raw": body.decode(errors="replace")}
        path, _, query = h.path.partition("?")
        if query:
            payload = {**payload, **dict(urllib.parse.parse_qsl(query))}
        req = {"path": h.path, "auth": h.headers.get("Authorization"), "json": payload, "at": time.time()}
        with self._lock:
            self.requests.append(req)
            answer = self._script.pop(0) if self._script else None
        self._arrived_q.put(req)
        if answer == HOLD:
            self._hold(h)
            return
        webhook = path.startswith("/services/")
        if path == "/api/conversations.history" and answer is None:
            answer = self._history(payload)
        elif answer is None and path != "/api/conversations.history" and (wait := self._too_soon()) is not None:
            answer = (429, {"ok": False, "error": "ratelimited"}, {"Retry-After": f"{wait:.3f}"})
        elif answer is None or answer == STALL:
            self._accept(req, webhook)
            if answer == STALL:
                self._hold(h)
                return
            answer = (200, "ok" if webhook else {"ok": True, "channel": payload.get("channel"), "ts": req["ts"]})
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

    def _too_soon(self) -> float | None:
        """With post_every: the rest of the pause, if a post now would come too soon."""
        if self.post_every is None:
            return None
        with self._lock:
            last = max((float(m["at"]) for m in self.posted), default=None)
        if last is None or time.time() >= last + self.post_every:
            return None
        return last + self.post_every - time.time()

    def _hold(self, h: BaseHTTPRequestHandler) -> None:
        self._release.wait(60)
        h.close_connection = True  # never answered: the client sees the connection drop

    def _accept(self, req: dict[str, Any], webhook: bool) -> None:
        """Store a post as Slack would, with a ts (None through a webhook), and count it posted."""
        with self._lock:
            # ts: the post time in seconds.microseconds, unique and increasing, as Slack's is.
            self._last_ts = max(time.time(), self._last_ts + 1e-6)
            req["ts"] = None if webhook else f"{self._last_ts:.6f}"
            self.posted.append(req)
        self._posted_q.put(req)

    def _history(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.history_error is not None:
            return 200, {"ok": False, "error": self.history_error, "needed": "channels:history",
                         "provided": "chat:write"}
        oldest = float(params.get("oldest") or 0)
        limit = int(params.get("limit") or 100)
        start = int(params.get("cursor") or 0)
        with_metadata = str(params.get("include_all_metadata", "")).lower() in ("1", "true")
        with self._lock:
            found = [m for m in reversed(self.posted) if m["ts"] is not None
                     and m["json"].get("channel") == params.get("channel") and float(m["ts"]) > oldest]
        page = found[start:start + limit]
        messages = []
        for m in page:
            msg = {"type": "message", "ts": m["ts"], "text": m["json"].get("text")}
            if with_metadata and m["json"].get("metadata"):
                msg["metadata"] = m["json"]["metadata"]
            messages.append(msg)
        more = start + limit < len(found)
        return 200, {"ok": True, "messages": messages, "has_more": more,
                     "response_metadata": {"next_cursor": str(start + limit) if more else ""}}
