"""Forwarding loses no job and makes no second copy: after a partition, across kills of
the edge while it forwards, links cut between the central's commit and its reply, and a
link that goes silent mid-batch. Ids are compared on both sides."""

from __future__ import annotations

import time

from forwardhelpers import NONE_HELD, central_keys, central_order, edge_ids, held_count, start_edge
from linkproxy import PASS, REFUSE


def _edge(start_daemon, tmp_path, proxy, extra: str = ""):
    return start_edge(start_daemon, tmp_path, proxy, extra=extra)


def _held(edge, n: int) -> list[int]:
    with edge.client() as q:
        return [i for at in range(0, n, 5000)
                for i in q.enqueue_many([q.job("testjobs:noop") for _ in range(min(5000, n - at))])]


def _exactly_once(tmp_path, ids: list[int]) -> None:
    copies = central_keys(tmp_path / "central.db")
    assert sorted(copies) == sorted(ids)  # none lost
    assert {n for n in copies.values()} == {1}  # none twice
    assert central_order(tmp_path / "central.db") == sorted(ids)  # in the order accepted
    assert "held" not in set(edge_ids(tmp_path / "edge.db").values())


def test_ten_thousand_jobs_held_in_a_partition_reach_the_central_once_within_30_s(start_daemon, tmp_path,
                                                                                 proxy):
    edge = _edge(start_daemon, tmp_path, proxy)
    proxy.set(REFUSE)
    ids = _held(edge, 10_000)
    with edge.client() as q:
        assert held_count(q, 10_000) == 10_000
    returned = time.monotonic()
    proxy.set(PASS)
    edge.wait_for_line(NONE_HELD, timeout=30)
    assert time.monotonic() - returned < 30
    _exactly_once(tmp_path, ids)


def test_five_kills_of_the_edge_while_it_forwards_lose_and_repeat_nothing(start_daemon, tmp_path, proxy):
    # Paced to about 1,000 jobs a second in batches of 50, so each kill lands mid-stream.
    edge = _edge(start_daemon, tmp_path, proxy, extra="batch_jobs = 50\nbytes_per_second = 20000\n")
    proxy.set(REFUSE)
    ids = _held(edge, 3000)
    proxy.set(PASS)
    for _ in range(5):
        edge.wait_for_line(r"upstream .* reachable; forwarding", timeout=20)
        edge.kill()
        sent = len(central_keys(tmp_path / "central.db"))
        edge.start()
    assert 0 < sent < len(ids)  # the kills came while the forwarding was under way
    edge.wait_for_line(NONE_HELD, timeout=30)
    _exactly_once(tmp_path, ids)


def test_five_links_cut_between_the_centrals_commit_and_its_reply_repeat_nothing(start_daemon, tmp_path, proxy):
    edge = _edge(start_daemon, tmp_path, proxy, extra="batch_jobs = 20\n")
    proxy.set(REFUSE)
    ids = _held(edge, 300)
    proxy.cut_next_replies(5)
    proxy.set(PASS)
    assert proxy.replies_cut.wait(30)
    edge.wait_for_line(NONE_HELD, timeout=30)
    _exactly_once(tmp_path, ids)
    edge.wait_for_line(r"upstream .* unreachable")  # the cuts were seen as such


def test_a_link_that_goes_silent_mid_batch_is_timed_out_and_the_batch_resent(start_daemon, tmp_path, proxy):
    edge = _edge(start_daemon, tmp_path, proxy, extra="batch_jobs = 20\n")
    proxy.set(REFUSE)
    ids = _held(edge, 100)
    proxy.blackhole_at_reply = True
    proxy.set(PASS)
    edge.wait_for_line(r"unreachable \(.*timed out", timeout=20)
    proxy.set(PASS)
    edge.wait_for_line(NONE_HELD, timeout=30)
    _exactly_once(tmp_path, ids)
