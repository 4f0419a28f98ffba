"""Queick pickles that name no global and still cost the daemon its time: hashing while they
load, decodes left queued by clients that hung up, and requests sent a few bytes at a time.
The scan that refuses them before anything loads (api/picklebounds.py) and real daemons
(`--accept-queick-clients`) served such bytes over real sockets."""

from __future__ import annotations

import os
import pickle
import select
import socket
import struct
import threading
import time

import pytest
from attackhelpers import bystander_enqueue_seconds, rss_mb

from queickd.api import legacy, picklebounds
from queickd.api.picklebounds import PickleBoundsError, PickleScan

LIMIT = 64 * 1024
NOOP = pickle.dumps({"func_name": "testjobs.noop", "args": ()})  # what Queick 1.2.1 sends, in short


def scan(data: bytes, limit: int) -> bool:
    """One whole pickle's scan: True when it is whole (or reaches a global)."""
    return PickleScan(limit).feed(data)


def _s(text: str) -> bytes:
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def request_around(args_ops: bytes) -> bytes:
    """{'func_name': 'testjobs.noop', 'args': <args_ops>} as protocol-2 opcodes."""
    return b"\x80\x02}(" + _s("func_name") + _s("testjobs.noop") + _s("args") + args_ops + b"u."


def tuple_hash_bomb(levels: int = 60) -> bytes:
    """args = {T: None}, T_0 = None and T_i = (T_{i-1}, T_{i-1}) through the memo: 353 bytes
    whose dict key hashes 2**levels tuples (tuple hashes are not cached)."""
    ops = b"}Nq\x00"  # EMPTY_DICT, NONE, BINPUT 0
    for i in range(1, levels + 1):  # BINGET i-1, TUPLE2 (with the copy on the stack), BINPUT i
        ops += b"h" + bytes([i - 1]) + b"\x86q" + bytes([i])
    return request_around(ops + b"Ns")  # NONE, SETITEM


def colliding_int_set(n: int = 5000) -> bytes:
    """args = a set of n ints that all hash alike (1 + i * (2**61 - 1)): quadratic to build."""
    def long1(v: int) -> bytes:
        b = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
        return b"\x8a" + bytes([len(b)]) + b
    return request_around(b"\x8f(" + b"".join(long1(1 + i * ((1 << 61) - 1)) for i in range(n)) + b"\x90")


def slow_request() -> bytes:
    """~60 KiB of plain data that takes the decoding thread ~0.1 s, refused only at the end
    (bytes are not JSON data): nothing is stored."""
    return pickle.dumps({"func_name": "testjobs.noop", "args": (*[None] * 60_000, b"x")}, protocol=4)


# --- the scan, on its own ------------------------------------------------------------------------
def test_a_dict_key_of_tuples_shared_through_the_memo_is_refused_before_loading():
    with pytest.raises(PickleBoundsError, match="dict key of type tuple"):
        scan(tuple_hash_bomb(), LIMIT)


@pytest.mark.parametrize("data", [pickle.dumps({"args": {1, 2}}, protocol=4),
                                  pickle.dumps({"args": frozenset({1, 2})}, protocol=4), colliding_int_set()],
                         ids=["set", "frozenset", "colliding-ints"])
def test_sets_are_refused_before_loading(data):
    with pytest.raises(PickleBoundsError, match="sets are refused"):
        scan(data, LIMIT)


@pytest.mark.parametrize("key", [2.5, 1 << 61, (1, 2), b"k"], ids=["float", "big-int", "tuple", "bytes"])
def test_dict_keys_other_than_strings_small_ints_bools_or_none_are_refused(key):
    with pytest.raises(PickleBoundsError, match="dict key of type"):
        scan(pickle.dumps({"func_name": "m.f", "args": ({key: 1},)}, protocol=4), LIMIT)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_data_fed_a_byte_at_a_time_is_whole_exactly_at_its_stop(protocol):
    data = pickle.dumps({"func_name": "m.f", "args": (1, -5, 2 ** 40, 2.5, "s", None, True, [1, [2]] * 3,
                                                      {"k": (3, 4), 7: None, None: 1, False: 0}),
                         "retry": False, "start_at": 1.7e9}, protocol=protocol)
    s = picklebounds.PickleScan(LIMIT)
    assert [s.feed(data[i:i + 1]) for i in range(len(data))] == [False] * (len(data) - 1) + [True]


def test_a_pickle_fed_in_small_pieces_is_scanned_in_about_the_time_of_one_fed_whole():
    data = request_around(b"]" + b"N0" * 30_000)  # 60 KB of opcodes
    t0 = time.perf_counter()
    assert scan(data, LIMIT)
    whole = time.perf_counter() - t0
    s = picklebounds.PickleScan(LIMIT)
    t0 = time.perf_counter()
    assert [s.feed(data[i:i + 60]) for i in range(0, len(data), 60)][-1]  # ~1,000 pieces
    assert time.perf_counter() - t0 < 3 * whole + 0.05  # scanning from byte 0 each time: ~500x


def test_the_decode_pool_refuses_past_its_limit_until_a_slot_is_given_back():
    pool = legacy.DecodePool(limit=2)
    release = threading.Event()
    try:
        running = pool.try_submit(release.wait, 10)
        queued = pool.try_submit(release.wait, 10)
        assert running is not None and queued is not None
        assert pool.try_submit(release.wait, 10) is None
        assert queued.cancel()  # a connection that hangs up gives its queued decode's slot back
        assert pool.try_submit(release.wait, 10) is not None
    finally:
        release.set()
        pool.shutdown(wait=True)


# --- a real daemon --------------------------------------------------------------------------------
@pytest.fixture
def legacy_daemon(start_daemon):
    return start_daemon(None, "--accept-queick-clients")


def exchange(port: int, data: bytes, timeout: float = 10.0) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    return pickle.loads(reply)  # the daemon under test is trusted; its reply is plain data


def send_and_hang_up(port: int, data: bytes, times: int) -> None:
    for _ in range(times):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(data)


def cpu_seconds(daemon) -> float:
    with open(f"/proc/{daemon.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state is [0], utime [11]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drip(s: socket.socket, piece: bytes, times: int) -> bytes:
    """Send `piece` `times` times, each as its own segment ~2 ms apart (a slow sender), or
    until the daemon answers; returns its answer so far."""
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(times):
        if select.select([s], [], [], 0.002)[0]:
            return s.recv(4096)
        s.sendall(piece)
    return b""


def test_a_tuple_hash_bomb_is_refused_and_the_daemon_keeps_serving(legacy_daemon):
    answer = exchange(legacy_daemon.port, tuple_hash_bomb())  # a frozen daemon: socket.timeout
    assert answer["success"] is False and "dict key of type tuple" in answer["error"]
    assert bystander_enqueue_seconds(legacy_daemon, timeout=10) < 2.0


def test_a_set_of_colliding_ints_is_refused_as_a_pickle_bomb(legacy_daemon):
    answer = exchange(legacy_daemon.port, colliding_int_set())
    assert answer["success"] is False and "pickle refused: opcode EMPTY_SET" in answer["error"]


def test_a_queick_request_is_answered_at_once_after_clients_sent_theirs_and_hung_up(legacy_daemon):
    send_and_hang_up(legacy_daemon.port, slow_request(), 100)  # ~10 s of decoding, for no one
    t0 = time.monotonic()
    while (answer := exchange(legacy_daemon.port, NOOP, timeout=5))["error"] and \
            answer["error"].startswith("queue_full") and time.monotonic() - t0 < 5:
        pass  # refused while the last of them are dropped: try again, as the reply says
    assert answer == {"success": True, "error": None}
    assert time.monotonic() - t0 < 5


def test_requests_of_clients_that_hung_up_do_not_stay_in_the_daemons_memory(legacy_daemon):
    before = rss_mb(legacy_daemon)
    send_and_hang_up(legacy_daemon.port, slow_request(), 300)  # 18 MB sent, each copy kept: 36 MB
    bystander_enqueue_seconds(legacy_daemon, timeout=10)
    assert rss_mb(legacy_daemon, "VmHWM") - before < 12


def test_a_request_sent_in_small_pieces_costs_the_daemon_little_time(legacy_daemon):
    with socket.create_connection(("127.0.0.1", legacy_daemon.port), timeout=10) as s:
        s.sendall(request_around(b"]" + b"N0" * 25_000)[:-2])  # all but its last SETITEMS, STOP
        cpu, t0 = cpu_seconds(legacy_daemon), time.monotonic()
        assert drip(s, b"N0", 1000) == b""
        used, elapsed = cpu_seconds(legacy_daemon) - cpu, time.monotonic() - t0
        s.sendall(b"u.")
        reply = s.recv(4096)
    assert pickle.loads(reply) == {"success": True, "error": None}
    assert used < 0.25 * elapsed  # the whole buffer scanned again for every piece: the decoding thread busy


def test_a_connection_is_refused_once_it_has_used_its_decoding_time(legacy_daemon):
    with socket.create_connection(("127.0.0.1", legacy_daemon.port), timeout=10) as s:
        s.sendall(b"\x80\x02c")  # GLOBAL: a module name, dripped, each piece ending as a STOP would
        reply = drip(s, b"m.", 5000)
    assert "over 0.5 s of decoding" in pickle.loads(reply)["error"]
