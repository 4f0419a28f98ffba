"""Cards emulated by nfcpy itself over its `udp` driver: the terminal reads them through
nfcpy's real reader code (sense, activation, presence checks) on the other end.

Each function presents one card for `hold` seconds on udp:127.0.0.1:PORT, then takes it
away; run it in a thread (present() does) while the terminal polls."""

from __future__ import annotations

import threading
import time

import nfc
import nfc.clf

PMM = "0100000000000000"  # an IC code nfcpy does not specialise: plain Type 3 activation


def felica(port: int, idm: str, hold: float) -> None:
    """A FeliCa card, emulated through ContactlessFrontend.connect(card=...)."""
    target = nfc.clf.LocalTarget("212F")
    target.sensf_res = bytearray.fromhex("01" + idm + PMM + "0003")
    clf = nfc.ContactlessFrontend(f"udp:127.0.0.1:{port}")
    end = time.monotonic() + hold
    try:
        clf.connect(card={"on-startup": lambda _: target, "timeout": hold},
                    terminate=lambda: time.monotonic() >= end)
    finally:
        clf.close()


def type_a(port: int, uid: str, hold: float) -> None:
    """An ISO 14443 Type A card (a Type 2 tag answering READ), emulated through listen()."""
    target = nfc.clf.LocalTarget("106A")
    target.sens_res = bytearray.fromhex("4400")
    target.sdd_res = bytearray.fromhex(uid)
    target.sel_res = bytearray.fromhex("00")
    clf = nfc.ContactlessFrontend(f"udp:127.0.0.1:{port}")
    end = time.monotonic() + hold
    try:
        activated = clf.listen(target, hold)
        cmd = activated.tt2_cmd if activated is not None else None
        while cmd is not None and time.monotonic() < end:
            answer = bytearray(16) if cmd[:1] == b"\x30" else None  # READ: four pages of zeros
            try:
                cmd = clf.exchange(answer, max(0.05, end - time.monotonic()))
            except nfc.clf.CommunicationError:
                return  # the reader stopped talking to us
    finally:
        clf.close()


def present(card, port: int, card_id: str, hold: float) -> threading.Thread:
    t = threading.Thread(target=card, args=(port, card_id, hold), daemon=True)
    t.start()
    return t
