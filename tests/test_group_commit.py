"""Group commit: concurrent lone clients share commits (counted as fsyncs of a real daemon on
a slowed disk), and the committer's rules for what joins which commit."""

import selectors
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from store_contract import job
from test_batcher import HeldStore

from queickd.core.job import Submitted
from queickd.services.batcher import Gather, SubmitBatcher
from queickd.store import open_store
from queickd.store.sqlite.inmemory import IN_MEMORY
from queickd.store.sqlite.store import SQLiteStore


class SlowStore(SQLiteStore):
    """A real memory store whose every commit takes `seconds`, like a slow disk's, and which
    tells when it is writing."""

    def __init__(self, seconds: float) -> None:
        super().__init__(IN_MEMORY)
        self.seconds = seconds
        self.writing = threading.Event()

    def submit_requests(self, requests, now, admission):
        self.writing.set()
        time.sleep(self.seconds)  # the slow disk itself, not a wait in the test
        return super().submit_requests(requests, now, admission)

SHIM_SOURCE = Path(__file__).resolve().parent.parent / "bench" / "slowfsync.c"
CLIENTS, PER_CLIENT = 16, 25


def _slowed(tmp_path: Path, ms: int) -> tuple[dict[str, str], Path]:
    """The environment that slows every fsync/fdatasync of a process by `ms` and counts
    them (one byte per call in the returned file)."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the fsync shim")
    lib = tmp_path / "slowfsync.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(SHIM_SOURCE), "-ldl"], check=True)
    count = tmp_path / "fsyncs"
    return {"LD_PRELOAD": str(lib), "SLOW_FSYNC_MS": str(ms), "SLOW_FSYNC_COUNT": str(count)}, count


@pytest.fixture
def slow_fsync(tmp_path):
    """An SD card's fsync: 5 ms."""
    return _slowed(tmp_path, 5)


def _fsyncs(count: Path) -> int:
    return count.stat().st_size if count.exists() else 0


def test_concurrent_lone_clients_share_fsyncs_on_a_slow_disk(start_daemon, slow_fsync):
    env, count = slow_fsync
    d = start_daemon(None, "--durability", "full", workers=0, env=env)
    clients = [d.client() for _ in range(CLIENTS)]
    for q in clients:
        q.stats()  # connected and served before the count starts
    before = _fsyncs(count)
    start, errors = threading.Barrier(CLIENTS), []

    def lone_client(q) -> None:
        try:
            start.wait(10)
            for _ in range(PER_CLIENT):
                q.enqueue("testjobs:noop")  # one request at a time, each waiting for its ack
        except Exception as e:  # reported below: a thread's failure must fail the test
            errors.append(e)

    threads = [threading.Thread(target=lone_client, args=(q,)) for q in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    fsyncs = _fsyncs(count) - before
    jobs = CLIENTS * PER_CLIENT
    counts = clients[0].stats()["counts"]
    for q in clients:
        q.close()
    assert errors == []
    assert counts.get("queued") == jobs
    assert fsyncs < jobs / 3, f"{fsyncs} fsyncs for {jobs} jobs: the requests did not share commits"


def test_submissions_of_one_loop_pass_share_one_commit():
    b = SubmitBatcher(open_store("memory://"))
    b.start()
    passes: list = []
    gather = Gather(b.submit_all, passes.append)
    answered = threading.Semaphore(0)
    answers: list = []

    def done(a) -> None:
        answers.append(a)
        answered.release()

    for _ in range(3):
        gather.submit([[job()]], done)
    assert len(passes) == 1  # one flush scheduled for the whole pass
    passes.pop()()
    for _ in range(3):
        assert answered.acquire(timeout=10)
    b.stop()
    assert b.commits == 1
    assert all(isinstance(a[0][0], Submitted) for a in answers)


def test_a_pass_with_one_small_submission_commits_it_on_the_loop_thread():
    b = SubmitBatcher(open_store("memory://"))  # no committer thread: only an inline commit can answer
    passes: list = []
    gather = Gather(b.submit_all, passes.append)
    got = []
    gather.submit([[job()]], lambda a: got.append(threading.get_ident()))
    passes.pop()()
    assert got == [threading.get_ident()]


def test_the_only_submission_of_a_pass_with_nothing_left_in_it_is_handed_over_at_once():
    b = SubmitBatcher(open_store("memory://"))  # no committer thread: only an inline commit can answer
    passes: list = []
    gather = Gather(b.submit_all, passes.append, pass_has_more=lambda: False)
    got = []
    gather.submit([[job()]], lambda a: got.append(a))
    assert passes == []  # no flush left for the pass's end
    assert isinstance(got[0][0][0], Submitted)


def test_a_submission_with_more_of_the_pass_to_run_waits_for_the_pass_to_end():
    b = SubmitBatcher(open_store("memory://"))
    b.start()
    passes: list = []
    more = [True]
    gather = Gather(b.submit_all, passes.append, pass_has_more=lambda: more[0])
    answered = threading.Semaphore(0)
    gather.submit([[job()]], lambda a: answered.release())
    more[0] = False  # the last read of the pass: its submission joins the first one's flush
    gather.submit([[job()]], lambda a: answered.release())
    assert len(passes) == 1
    passes.pop()()
    for _ in range(2):
        assert answered.acquire(timeout=10)
    b.stop()
    assert b.commits == 1


def test_requests_arriving_during_a_commit_all_go_into_the_next_one():
    store = HeldStore()
    b = SubmitBatcher(store)
    b.start()
    answered = threading.Semaphore(0)
    b.submit([[job()]], lambda a: answered.release())
    assert store.entered.wait(10)  # the first commit is being written
    for _ in range(5):  # five submitters arrive meanwhile, each on its own
        b.submit([[job()]], lambda a: answered.release(), inline=True)
    store.release.set()
    for _ in range(6):
        assert answered.acquire(timeout=10)
    b.stop()
    assert b.commits == 2



def test_after_a_shared_commit_the_committer_waits_briefly_for_its_acked_clients():
    b = SubmitBatcher(SlowStore(0.2), max_linger=1.0)  # may wait up to half a commit: 0.1 s
    acked, answered = threading.Event(), threading.Semaphore(0)

    def client_b(a) -> None:
        answered.release()
        acked.set()

    def done(a) -> None:
        answered.release()

    def comes_back() -> None:  # client B sends its next request as soon as it has its ack
        assert acked.wait(10)
        b.submit([[job()]], done)

    back = threading.Thread(target=comes_back)
    back.start()
    b.submit_all([([[job()]], done), ([[job()]], client_b)])  # commit 1: clients A and B
    b.start()
    assert b.store.writing.wait(10)
    b.submit([[job()]], done)  # client C arrives during commit 1
    for _ in range(4):
        assert answered.acquire(timeout=10)
    back.join(10)
    b.stop()
    assert b.commits == 2  # C waited for B's return instead of committing alone


def test_a_lone_job_starts_while_its_commit_is_flushed_and_its_ack_waits_for_the_flush(start_daemon, tmp_path):
    env, count = _slowed(tmp_path, 400)  # a very slow disk: the flush is the long part
    d = start_daemon(None, "--durability", "full", workers=1, env=env)
    out = tmp_path / "ran.txt"
    with d.client() as q:
        q.stats()  # connected before the clock starts
        acked = threading.Event()
        took: list[float] = []

        def enqueue() -> None:
            t0 = time.monotonic()
            q.enqueue("testjobs:append", args=[str(out), "ran"])
            took.append(time.monotonic() - t0)
            acked.set()

        sender = threading.Thread(target=enqueue)
        sender.start()
        deadline = time.monotonic() + 10
        while not out.exists():  # the job runs ...
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.005)
        started_before_ack = not acked.is_set()  # ... before the client has its ack
        sender.join(10)
    assert started_before_ack
    assert took and took[0] >= 0.4  # the ack came after a (slowed) flush


def test_the_server_loop_says_a_poll_with_one_ready_socket_has_nothing_more_in_its_pass():
    from queickd.api.server import _PassSelector

    sel = _PassSelector()
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        for a, _ in pairs:
            sel.register(a, selectors.EVENT_READ)
        pairs[0][1].send(b"x")
        assert len(sel.select(5)) == 1
        assert not sel.pass_has_more()  # the lone read flushes at once
        pairs[1][1].send(b"y")
        assert len(sel.select(5)) == 2
        assert sel.pass_has_more()  # another read of the pass may join its flush
    finally:
        sel.close()
        for a, b in pairs:
            a.close()
            b.close()
