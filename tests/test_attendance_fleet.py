"""Several attendance terminals, each beside its own edge daemon, forward their punches to
one central daemon that posts them to Slack (a local HTTP stand-in): after an outage of
every link, with a link cut between the central's commit and its reply, each punch is
posted exactly once and each terminal's in tap order."""

from __future__ import annotations

import pytest
from attendance_support import ALLOW, CardFeed, RunningTerminal, terminal_config
from forwardhelpers import NONE_HELD, edge_config
from linkproxy import PASS, REFUSE, LinkProxy
from slackstub import SlackStub

pytest.importorskip("slack_sdk")
pytest.importorskip("serial")

ALICE, BOB, CAROL = "0102030405060708", "08A1B2C3", "0A0B0C0D0E0F1011"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def slack():
    s = SlackStub().start()
    yield s
    s.close()


@pytest.fixture
def fleet(start_daemon, tmp_path, slack):
    """Two offices: (feed, terminal, edge, proxy) each; one central daemon."""
    central = start_daemon(f"sqlite:///{tmp_path / 'central.db'}", *ALLOW)
    offices, closers = [], []
    for n in (1, 2):
        d = tmp_path / f"office-{n}"
        d.mkdir()
        proxy = LinkProxy(central.port)
        cfg = edge_config(d / "edge.toml", proxy, functions=("queickd.attendance.*",), identity=f"office-{n}")
        edge = start_daemon(f"sqlite:///{d / 'edge.db'}", "--config", cfg)
        feed = CardFeed()
        term = RunningTerminal(terminal_config(d, feed.url, edge.port, slack_base_url=slack.base_url, debounce=0,
                                               post_key=f"attendance:office-{n}"))
        for card, name in ((ALICE, "Alice"), (BOB, "Bob"), (CAROL, "Carol")):
            term.plog.register(card, name)
        term.wait_reader_open()
        offices.append((feed, term, edge, proxy))
        closers += [term.stop, feed.close, proxy.close]
    yield central, offices
    for close in closers:
        close()


def test_each_terminals_punches_reach_slack_once_and_in_tap_order_after_an_outage(fleet, slack):
    central, offices = fleet
    for _, _, _, proxy in offices:
        proxy.set(REFUSE)
    taps: dict[int, list[str]] = {}
    for n, (feed, term, _, _) in enumerate(offices):
        taps[n] = []
        for card in (ALICE, BOB, CAROL, ALICE, BOB):
            feed.tap(card)
            taps[n].append(term.next_tap().punch.punch_id)
        term.wait_sent(5)  # on its edge daemon, held: the link is down
    assert slack.posted == []
    offices[0][3].cut_next_replies(1)  # the first office's first forward: committed, reply lost
    for _, _, _, proxy in offices:
        proxy.set(PASS)
    for n, (_, term, edge, _) in enumerate(offices):
        edge.wait_for_line(NONE_HELD, timeout=30)
        with edge.client() as q:
            for punch_id in taps[n]:
                assert q.wait(term.job_id(punch_id), timeout=30)["state"] == "succeeded"
    posted = [m["json"]["metadata"]["event_payload"]["punch_id"] for m in slack.posted]
    assert sorted(posted) == sorted(taps[0] + taps[1])  # each once
    for n in taps:
        assert [p for p in posted if p in taps[n]] == taps[n]  # in tap order per terminal
    assert offices[0][3].replies_cut.is_set()  # the cut happened, and was resent without a second post
