"""An edge daemon offline for days: its held backlog is capped (jobs and bytes) and
answered with queue_full at the cap, never a silent drop; `queick status`, the status page
and /metrics say the link's state, the backlog, its oldest job and the last forward."""

from __future__ import annotations

import http.client
import subprocess
import sys

import pytest
from forwardhelpers import NONE_HELD, start_edge
from linkproxy import PASS, REFUSE, LinkProxy

from queickd.core.protocol import QueueError


@pytest.fixture
def proxy(central):  # the link starts refused: what the edge takes is held
    p = LinkProxy(central.port)
    p.set(REFUSE)
    yield p
    p.close()


def _edge(start_daemon, tmp_path, proxy, extra=""):
    return start_edge(start_daemon, tmp_path, proxy, "--http", "127.0.0.1:0", extra=extra,
                      functions=("testjobs:noop", "testjobs:append"))


def _get(edge, path: str) -> str:
    port = int(edge.wait_for_line(r"HTTP endpoint http://\S+:(\d+)/").group(1))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    return conn.getresponse().read().decode()


def test_the_backlog_at_its_job_cap_refuses_with_queue_full_and_drops_nothing(start_daemon, tmp_path, proxy):
    edge = _edge(start_daemon, tmp_path, proxy, extra="max_backlog_jobs = 5\n")
    with edge.client() as q:
        ids = [q.enqueue("testjobs:noop") for _ in range(5)]
        with pytest.raises(QueueError) as e:
            q.enqueue("testjobs:noop", idempotency_key="sixth")
        assert (e.value.code, e.value.retry_after) == ("queue_full", 60.0)
        assert q.enqueue("testjobs:add", (1, 2)) > 0  # not for the upstream: runs here, uncapped
        assert {q.get(i)["state"] for i in ids} == {"held"}
        proxy.set(PASS)
        edge.wait_for_line(NONE_HELD, timeout=20)
        assert q.enqueue("testjobs:noop") > 0  # room again once forwarded


def test_the_backlog_at_its_byte_cap_refuses_with_queue_full(start_daemon, tmp_path, proxy):
    edge = _edge(start_daemon, tmp_path, proxy, extra="max_backlog_bytes = 1000\n")
    with edge.client() as q:
        q.enqueue("testjobs:append", ("x" * 400, "a"))
        q.enqueue("testjobs:append", ("x" * 400, "b"))
        with pytest.raises(QueueError, match="backlog for the upstream is full"):
            q.enqueue("testjobs:append", ("x" * 400, "c"))


def test_status_shows_the_link_down_the_backlog_and_its_oldest(start_daemon, tmp_path, proxy):
    edge = _edge(start_daemon, tmp_path, proxy)
    with edge.client() as q:
        q.enqueue("testjobs:noop")
    edge.wait_for_line(r"upstream .* unreachable")
    out = subprocess.run([sys.executable, "-m", "queickd", "status", "--port", str(edge.port)],
                         capture_output=True, text=True, timeout=30).stdout
    assert "upstream DOWN queickd://127.0.0.1:" in out
    assert "held 1 (" in out and "last forward never" in out


def test_metrics_and_the_status_page_show_the_forwarding(start_daemon, tmp_path, proxy):
    edge = _edge(start_daemon, tmp_path, proxy)
    with edge.client() as q:
        q.enqueue("testjobs:noop")
        q.enqueue("testjobs:noop")
    edge.wait_for_line(r"upstream .* unreachable")
    metrics = _get(edge, "/metrics")
    assert 'queickd_upstream_up{link="down"} 0' in metrics
    assert "queickd_upstream_held_jobs 2" in metrics
    assert "queickd_upstream_last_forward_timestamp_seconds 0" in metrics
    page = _get(edge, "/")
    assert 'data-metric="upstream">down: 2 held' in page
