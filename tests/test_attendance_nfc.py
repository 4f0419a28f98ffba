"""NFC readers end to end: a card on the reader becomes exactly one punch in the log.

The cards are emulated by nfcpy over its udp driver and read by the terminal through
nfcpy's reader code (sense, activation, presence checks), one target per reader, as
each empty udp poll costs a second per target."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("nfc")

import nfc_cards  # noqa: E402
from attendance_helpers import ALICE_IDM, BOB_IDM, CAROL_UID, RunningTerminal, terminals  # noqa: E402

from queickd.attendance.punchlog import ACCEPTED, IGNORED, IN, OUT  # noqa: E402

# How long a card stays on the reader. An empty udp poll waits a second for an answer
# that never comes (a datagram to a port nobody has bound yet is dropped), so a tap has
# to outlast one poll cycle to be seen at all.
TAP = 1.5


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tap(term: RunningTerminal, card, port: int, card_id: str, hold: float = TAP) -> None:
    """Present a card for `hold` seconds, take it away, and wait until the reader has
    noticed: only then may the next card come (else it would answer the presence checks
    meant for the last one, as no physical card could)."""
    done = term.terminal.loop.releases
    nfc_cards.present(card, port, card_id, hold).join()
    assert term.terminal.loop.wait_released(done + 1, 20), "the reader never saw the card leave"



@pytest.fixture
def run_terminal(tmp_path):
    yield from terminals(tmp_path)

def test_a_felica_tap_becomes_exactly_one_punch(run_terminal):
    port = free_udp_port()
    term = run_terminal(f"udp:127.0.0.1:{port}", targets=["212F"])
    tap(term, nfc_cards.felica, port, ALICE_IDM)
    first = term.next_tap()
    assert (first.card_id, first.outcome, first.punch.direction, first.name) == (ALICE_IDM, ACCEPTED, IN, "Alice")
    tap(term, nfc_cards.felica, port, BOB_IDM)
    assert term.next_tap().card_id == BOB_IDM  # nothing came between
    assert [p.card_id for p in term.plog.punches()] == [ALICE_IDM, BOB_IDM]


def test_a_felica_card_held_on_the_reader_is_one_tap(run_terminal):
    port = free_udp_port()
    term = run_terminal(f"udp:127.0.0.1:{port}", targets=["212F"], debounce=0)
    tap(term, nfc_cards.felica, port, ALICE_IDM, hold=TAP + 1.0)  # about ten presence checks once seen
    assert term.next_tap().card_id == ALICE_IDM
    assert term.taps.empty() and term.terminal.loop.releases == 1
    assert len(term.plog.punches()) == 1


def test_a_felica_retap_inside_the_debounce_is_ignored(run_terminal):
    port = free_udp_port()
    term = run_terminal(f"udp:127.0.0.1:{port}", targets=["212F"])  # default debounce: 60 s
    tap(term, nfc_cards.felica, port, ALICE_IDM)
    tap(term, nfc_cards.felica, port, ALICE_IDM)
    first, second = term.next_tap(), term.next_tap()
    assert (first.outcome, second.outcome) == (ACCEPTED, IGNORED)
    assert len(term.plog.punches()) == 1


def test_a_type_a_tap_becomes_one_punch_and_a_held_card_one_tap(run_terminal):
    port = free_udp_port()
    term = run_terminal(f"udp:127.0.0.1:{port}", targets=["106A"], debounce=0)
    tap(term, nfc_cards.type_a, port, CAROL_UID, hold=TAP + 1.0)
    tap(term, nfc_cards.type_a, port, CAROL_UID)
    taps = [term.next_tap(), term.next_tap()]
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
