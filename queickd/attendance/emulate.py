"""Emulated cards for demos and tests: nfcpy itself plays the card over its `udp` driver,
so a terminal reading `udp:HOST:PORT` goes through nfcpy's real reader code.

Each function presents one card on udp:HOST:PORT for `hold` seconds, or until the
`until` event is set, then takes it away (it blocks meanwhile). An empty udp poll waits
a second for an answer, so a tap shorter than about 1.3 s may go unseen: tests hold the
card until the terminal has seen it, then set `until`. Needs the `nfc` extra.
"""

from __future__ import annotations

import socket
import threading
import time

import nfc
import nfc.clf

PMM = "0100000000000000"  # an IC code nfcpy does not specialise: plain Type 3 activation
SYSTEM_CODE = "0003"  # the common area of transport IC cards
DEFAULT_HOLD = 1.5


def felica_tap(port: int, idm: str, hold: float = DEFAULT_HOLD, host: str = "127.0.0.1",
               until: threading.Event | None = None) -> None:
    """A FeliCa card (IDm `idm`, 16 hex digits), emulated through connect(card=...)."""
    target = nfc.clf.LocalTarget("212F")
    target.sensf_res = bytearray.fromhex("01" + idm + PMM + SYSTEM_CODE)
    clf = nfc.ContactlessFrontend(f"udp:{host}:{port}")
    end = time.monotonic() + hold
    if until is not None:
        threading.Thread(target=_take_felica_away, args=(until, host, port, idm), daemon=True).start()
    try:
        # on-connect False: once a command for this card arrives (see _take_felica_away),
        # connect() returns instead of serving it.
        clf.connect(card={"on-startup": lambda _: target, "on-connect": lambda _: False, "timeout": hold},
                    terminate=lambda: time.monotonic() >= end or (until is not None and until.is_set()))
    finally:
        clf.close()


def _take_felica_away(until: threading.Event, host: str, port: int, idm: str) -> None:
    # While nfcpy's emulated card listens it answers polls until its timeout; a command
    # addressed to its IDm ends the listen, and the card leaves the field.
    until.wait()
    cmd = bytearray([10, 0x04]) + bytearray.fromhex(idm)  # Request Response
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"212F " + cmd.hex().encode(), (host, port))


def type_a_tap(port: int, uid: str, hold: float = DEFAULT_HOLD, host: str = "127.0.0.1",
               until: threading.Event | None = None) -> None:
    """An ISO 14443 Type A card (a Type 2 tag with UID `uid`, 4 bytes, answering READ
    with zeros), emulated through listen()."""
    target = nfc.clf.LocalTarget("106A")
    target.sens_res = bytearray.fromhex("4400")
    target.sdd_res = bytearray.fromhex(uid)
    target.sel_res = bytearray.fromhex("00")
    clf = nfc.ContactlessFrontend(f"udp:{host}:{port}")
    end = time.monotonic() + hold
    try:
        activated = clf.listen(target, hold)
        cmd = activated.tt2_cmd if activated is not None else None
        while cmd is not None and time.monotonic() < end and not (until is not None and until.is_set()):
            answer = bytearray(16) if cmd[:1] == b"\x30" else None  # READ: four pages
            try:
                cmd = clf.exchange(answer, max(0.05, end - time.monotonic()))
            except nfc.clf.CommunicationError:
                return  # the reader stopped talking to the card
    finally:
        clf.close()
