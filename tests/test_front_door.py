"""The service as the one way in, and the one translation of its refusals per transport."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from store_contract import job

from queickd.api.replies import NotCommittedError, refused
from queickd.api.service import QueueService
from queickd.core.policy.admission import RETRY_AFTER_DEFAULT, Admission, Refusal
from queickd.core.protocol import Code, QueueError
from queickd.run.loader import FunctionLoader
from queickd.services.batcher import SubmitBatcher
from queickd.services.pool_config import PoolConfig
from queickd.services.scheduler import Scheduler
from queickd.services.worker import WorkerPool
from queickd.store import open_store
from queickd.store.contract.fleet import FleetStore
from queickd.store.sqlite.inmemory import IN_MEMORY
from queickd.store.sqlite.store import SQLiteStore

JOBS = str(Path(__file__).parent / "jobs")
FULL = Refusal(Code.QUEUE_FULL, "the queue holds 1 waiting jobs, its limit", retry_after=2.5)
TAKEN = Refusal(Code.CONFLICT, "key 'k' already has job 4 waiting or running", job_id=4)


def _service(store: SQLiteStore, batcher: SubmitBatcher) -> QueueService:
    loader = FunctionLoader(JOBS)
    pool = WorkerPool(store, loader, PoolConfig(0))
    return QueueService(store, batcher, loader, Scheduler(store, pool.wake), pool)


# --- one translation, three transports ------------------------------------------------------


def test_a_queue_full_refusal_over_tcp_is_its_error_with_retry_after():
    assert refused(FULL).json() == {"ok": False, "error": {"code": "queue_full", "message": FULL.message},
                                    "retry_after": 2.5}


def test_a_key_conflict_over_tcp_names_the_job_and_gives_no_retry_after():
    assert refused(TAKEN).json() == {"ok": False, "error": {"code": "conflict", "message": TAKEN.message,
                                                            "job_id": 4}}


def test_a_queue_full_refusal_over_http_is_429_with_retry_after_rounded_up():
    status, body, headers = refused(FULL).http()
    assert (status, body["retry_after"], headers) == (429, 2.5, {"Retry-After": "3"})


def test_a_key_conflict_over_http_is_429_and_says_when_to_come_back():
    status, body, headers = refused(TAKEN).http()
    assert (status, body["error"]["code"], body["retry_after"]) == (429, "conflict", RETRY_AFTER_DEFAULT)
    assert int(headers["Retry-After"]) >= 1


@pytest.mark.parametrize(("code", "status"), [(Code.BAD_REQUEST, 400), (Code.NOT_ALLOWED, 403),
                                              (Code.NOT_FOUND, 404), (Code.UNAUTHORIZED, 401)])
def test_a_queue_error_over_http_has_its_codes_status(code, status):
    assert refused(QueueError(code, "no")).http() == (status, QueueError(code, "no").to_reply(), {})


def test_a_commit_that_failed_is_http_503_asking_to_try_again():
    status, body, headers = refused(NotCommittedError("disk full")).http()
    assert (status, body["error"]["message"], headers) == (503, "not accepted, try again: disk full",
                                                           {"Retry-After": "5"})


def test_a_commit_that_did_not_finish_in_time_over_http_says_the_job_may_have_been_stored():
    release, stored = threading.Event(), threading.Event()

    class SlowStore(SQLiteStore):  # a commit that outlasts the webhook's wait
        def submit_requests(self, requests, now, admission):
            assert release.wait(10)
            answers = super().submit_requests(requests, now, admission)
            stored.set()
            return answers

    store = SlowStore(IN_MEMORY)
    batcher = SubmitBatcher(store)
    batcher.start()
    svc = _service(store, batcher)
    try:
        with pytest.raises(NotCommittedError) as e:
            svc.enqueue_wait([[job()]], 0.05)
        status, body, headers = refused(e.value).http()
        assert (status, body["error"]["maybe_committed"]) == (503, True)
        assert "may have been stored" in body["error"]["message"]
        release.set()
        assert stored.wait(10)  # the request it gave up on is stored all the same
        assert store.counts()["queued"] == 1
    finally:
        release.set()
        batcher.stop()


def test_health_fails_once_the_disk_has_failed_to_flush_a_commit(tmp_path, monkeypatch):
    import os

    from queickd.store.records import NotDurableError

    store = SQLiteStore(str(tmp_path / "q.db"), durability="full")
    svc = _service(store, SubmitBatcher(store))
    assert store.durability_lost() is None

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(NotDurableError):
        store.submit([job()], 0.0)
    healthy, reason = svc.health()
    assert not healthy and "flush of the WAL to disk failed" in reason and "Input/output" in reason
    store.close()


def test_a_bug_is_an_internal_error_naming_its_type_on_every_transport():
    r = refused(KeyError("x"))
    assert r.json()["error"] == {"code": "internal", "message": "KeyError: 'x'"}
    assert r.http()[0] == 500


def test_a_queick_client_reads_an_admission_refusal_with_its_code():
    assert refused(FULL).legacy() == f"queue_full: {FULL.message}"


def test_a_queick_client_reads_a_validation_error_with_its_code():
    assert refused(QueueError(Code.NOT_ALLOWED, "os:system is not allowed")).legacy() == "not_allowed: os:system is not allowed"


# --- the service's operations -----------------------------------------------------------------


def test_enqueue_wait_returns_the_answers_once_committed():
    store = open_store("memory://")
    batcher = SubmitBatcher(store)
    batcher.start()
    try:
        svc = _service(store, batcher)
        answers = svc.enqueue_wait([[svc.prepare_job({"func": "testjobs:noop"})]], timeout=10)
    finally:
        batcher.stop()
    assert store.get(answers[0][0].job_id).func == "testjobs:noop"


def test_enqueue_wait_answers_an_admission_refusal():
    store = open_store("memory://")
    batcher = SubmitBatcher(store, admission=Admission(1, 100, 0))
    batcher.start()
    try:
        svc = _service(store, batcher)
        job = svc.prepare_job({"func": "testjobs:noop"})
        answers = svc.enqueue_wait([[job], [job]], timeout=10)
    finally:
        batcher.stop()
    assert isinstance(answers[1], Refusal) and answers[1].code == Code.QUEUE_FULL


def test_enqueue_wait_raises_not_committed_once_the_committer_has_stopped():
    store = open_store("memory://")
    batcher = SubmitBatcher(store)
    batcher.stop()
    svc = _service(store, batcher)
    with pytest.raises(NotCommittedError, match="shutting down"):
        svc.enqueue_wait([[svc.prepare_job({"func": "testjobs:noop"})]], timeout=10)


def test_prepare_job_refuses_a_function_outside_the_allowlist():
    svc = _service(open_store("memory://"), SubmitBatcher(open_store("memory://")))
    with pytest.raises(QueueError) as e:
        svc.prepare_job({"func": "os:system", "args": ["true"]})
    assert e.value.code == Code.NOT_ALLOWED


def test_the_service_reports_a_missing_job_as_not_found():
    svc = _service(open_store("memory://"), SubmitBatcher(open_store("memory://")))
    with pytest.raises(QueueError) as e:
        svc.job(12345)
    assert e.value.code == Code.NOT_FOUND


def test_a_single_daemon_store_is_not_a_fleet_store():
    assert not isinstance(open_store("memory://"), FleetStore)
