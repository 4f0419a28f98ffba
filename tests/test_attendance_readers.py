"""Serial line readers end to end: a pty and pyserial's socket://, unplugged and plugged
back in; a line becomes one tap."""

from __future__ import annotations

import os

import pytest
from attendance_support import ALICE_IDM, BOB_IDM, CardFeed, terminals

from queickd.attendance.punchlog import ACCEPTED

pytest.importorskip("serial")


@pytest.fixture
def run_terminal(tmp_path):
    yield from terminals(tmp_path)

def test_a_line_reader_on_a_pty_survives_unplug_and_replug(run_terminal, tmp_path):
    link = tmp_path / "ttyCARD"  # what a udev rule would keep pointing at the device

    def plug() -> int:
        master, slave = os.openpty()
        name = os.ttyname(slave)
        os.close(slave)  # the terminal opens its own end
        if link.is_symlink():
            link.unlink()
        link.symlink_to(name)
        return master

    master = plug()
    term = run_terminal(str(link))
    term.wait_reader_open(1)
    os.write(master, f"{ALICE_IDM.lower()}\r\n".encode())
    assert term.next_tap().card_id == ALICE_IDM
    os.close(master)  # unplugged
    master = plug()
    try:
        term.wait_reader_open(2)
        os.write(master, b"not a card\n" + BOB_IDM.encode() + b"\n")
        tap = term.next_tap()
        assert (tap.card_id, tap.outcome) == (BOB_IDM, ACCEPTED)
    finally:
        os.close(master)


def test_a_line_reader_on_socket_survives_unplug_and_replug(run_terminal):
    feed = CardFeed()
    try:
        term = run_terminal(feed.url)
        term.wait_reader_open(1)
        feed.tap(ALICE_IDM)
        assert term.next_tap().card_id == ALICE_IDM
        feed.unplug()
        feed.replug()
        term.wait_reader_open(2)  # reopened after its backoff
        feed.tap(BOB_IDM)
        assert term.next_tap().card_id == BOB_IDM
    finally:
        feed.close()
