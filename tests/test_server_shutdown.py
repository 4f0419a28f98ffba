"""The TCP server's shutdown (api/server.py): a connection set up after it began is not served."""

import socket
import time

from queickd.api.server import Server
from queickd.api.service import QueueService
from queickd.store import open_store


def test_a_connection_accepted_just_before_shutdown_is_closed_not_served(monkeypatch):
    store = open_store("memory://")
    server = Server(QueueService(store, None, None, None, None, clock=time.time), "127.0.0.1", 0, hello_timeout=60)
    accept = server._accept

    def accept_then_shut_down(lsock):  # the shutdown begins between the accept and the set-up
        accept(lsock)
        server._closed = True

    monkeypatch.setattr(server, "_accept", accept_then_shut_down)
    server.start()
    try:
        with socket.create_connection(server.address, timeout=10) as s:
            s.settimeout(5)
            assert s.recv(100) == b""  # closed by the server: not left open for a minute, served
    finally:
        server.stop(grace=1)
        store.close()
