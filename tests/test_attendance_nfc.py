"""NFC readers end to end: a card on the reader becomes exactly one punch in the log.

The cards are emulated by nfcpy over its udp driver and read by the terminal through
nfcpy's reader code (sense, activation, presence checks), one target per reader, as
each empty udp poll costs a second per target. A card stays on the reader until the
terminal has seen it, so no test depends on when a poll happens."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("nfc")

from attendance_support import ALICE_IDM, BOB_IDM, CAROL_UID, RunningTerminal, terminals  # noqa: E402

from queickd.attendance.emulate import felica_tap, type_a_tap
from queickd.attendance.punchlog import ACCEPTED, IGNORED, IN, OUT, Tap


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tap(term: RunningTerminal, card, port: int, card_id: str, held: float = 0.0) -> Tap:
    """Put a card on the reader until the terminal has seen it, keep it there `held`
    seconds more, take it away, and wait until the reader has noticed (only then may the
    next card come: it would answer the presence checks meant for this one, as no
    physical card could). Returns what the tap came to."""
    released, gone = term.terminal.loop.releases, threading.Event()
    card_thread = threading.Thread(target=card, args=(port, card_id, 20.0), kwargs={"until": gone}, daemon=True)
    card_thread.start()
    try:
        seen = term.next_tap()
        time.sleep(held)  # a person keeping the card on the reader
    finally:
        gone.set()
        card_thread.join(10)
    assert term.terminal.loop.wait_released(released + 1, 20), "the reader never saw the card leave"
    return seen


@pytest.fixture
def run_terminal(tmp_path):
    yield from terminals(tmp_path)

def test_a_felica_tap_becomes_exactly_one_punch(run_terminal):
    port = free_udp_port()
    term = run_terminal(f"udp:127.0.0.1:{port}", targets=["212F"])
    first = tap(term, felica_tap, port, ALICE_IDM)
    assert (first.card_id, first.outcome, first.punch.direction, first.name) == (ALICE_IDM, ACCEPTED, IN, "Alice")
    assert tap(term, felica_tap, port, BOB_IDM).card_id == BOB_IDM  # nothing came between
    assert term.taps.empty()
    assert [p.card_id for p in term.plog.punches()] == [ALICE_IDM, BOB_IDM]


def test_a_felica_card_held_on_the_reader_is_one_tap(run_terminal):
    port = free_udp_port()
    term = run_terminal(f"udp:127.0.0.1:{port}", targets=["212F"], debounce=0)
    assert tap(term, felica_tap, port, ALICE_IDM, held=1.5).card_id == ALICE_IDM  # ~15 presence checks
    assert term.taps.empty() and term.terminal.loop.releases == 1
    assert len(term.plog.punches()) == 1


def test_a_felica_retap_inside_the_debounce_is_ignored(run_terminal):
    port = free_udp_port()
    term = run_terminal(f"udp:127.0.0.1:{port}", targets=["212F"])  # default debounce: 60 s
    first, second = tap(term, felica_tap, port, ALICE_IDM), tap(term, felica_tap, port, ALICE_IDM)
    assert (first.outcome, second.outcome) == (ACCEPTED, IGNORED)
    assert len(term.plog.punches()) == 1


def test_a_type_a_tap_becomes_one_punch_and_a_held_card_one_tap(run_terminal):
    port = free_udp_port()
    term = run_terminal(f"udp:127.0.0.1:{port}", targets=["106A"], debounce=0)
    taps = [tap(term, type_a_tap, port, CAROL_UID, held=1.5), tap(term, type_a_tap, port, CAROL_UID)]
    assert [(t.card_id, t.punch.direction) for t in taps] == [(CAROL_UID, IN), (CAROL_UID, OUT)]
    assert term.taps.empty()


# --- a PN532 over UART ---------------------------------------------------------------------------

@pytest.fixture
def pn532():
    from pn532sim import PN532Simulator

    sim = PN532Simulator()
    yield sim
    sim.close()


def test_a_pn532_on_a_serial_port_reads_a_felica_tap_once_however_long_it_is_held(run_terminal, pn532):
    # The pty's device file stands in for /dev/ttyAMA0 (or a /dev/serial/by-id/ link).
    term = run_terminal(f"tty:{pn532.path}:pn532", targets=["212F"], debounce=0)
    term.wait_reader_open()
    assert 0x14 in pn532.commands  # nfcpy's driver configured the chip (SAMConfiguration)
    pn532.present(ALICE_IDM)
    tap = term.next_tap()
    assert (tap.card_id, tap.punch.direction, tap.name) == (ALICE_IDM, IN, "Alice")
    held = pn532.commands.count(0x42) + 10
    assert pn532.wait_commands(0x42, held)  # ten presence checks (InCommunicateThru) while held
    assert term.terminal.loop.releases == 0 and term.taps.empty()
    pn532.remove()
    assert term.terminal.loop.wait_released(1, 20)
    pn532.present(BOB_IDM)
    assert term.next_tap().card_id == BOB_IDM
    assert [p.card_id for p in term.plog.punches()] == [ALICE_IDM, BOB_IDM]
