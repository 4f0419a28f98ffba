"""A TCP proxy standing in for the network between an edge daemon and its upstream: it
passes bytes, refuses connections, cuts the live ones, blackholes them (bytes taken, none
passed on, no reset), or cuts a connection as the upstream's next replies come back (the
upstream has committed what they answer; the edge never hears it)."""

from __future__ import annotations

import contextlib
import socket
import threading

PASS, REFUSE, BLACKHOLE = "pass", "refuse", "blackhole"


class LinkProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.mode = PASS
        self.cut_replies = 0  # enqueue replies still to cut: each cuts its connection instead of passing
        self.blackhole_at_reply = False  # the next enqueue reply turns the link into a blackhole
        self.replies_cut = threading.Event()  # set once cut_replies reached 0 by cutting
        self.connections = 0
        self._lock = threading.Lock()
        self._live: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"queickd://127.0.0.1:{self.port}"

    def set(self, mode: str) -> None:
        """PASS, REFUSE (new connections closed at once; live ones cut) or BLACKHOLE."""
        self.mode = mode
        if mode == REFUSE:
            self.cut()

    def cut_next_replies(self, n: int) -> None:
        self.replies_cut.clear()
        self.cut_replies = n

    def cut(self) -> None:
        """Cut every live connection (both ends see it closed)."""
        with self._lock:
            live, self._live = self._live, []
        for s in live:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == REFUSE:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                client.close()  # a reset, as a closed port's
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._live += [client, upstream]
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self.mode == BLACKHOLE:
                    continue  # taken and dropped: the sender sees no reset, no reply
                if replies and self.blackhole_at_reply and b'"job_id"' in data:
                    self.blackhole_at_reply, self.mode = False, BLACKHOLE
                    continue
                if replies and self.cut_replies > 0 and b'"job_id"' in data:  # not a hello's
                    with self._lock:
                        self.cut_replies -= 1
                        if self.cut_replies == 0:
                            self.replies_cut.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
