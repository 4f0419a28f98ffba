"""Bad liveness options are refused where every enqueue is checked, naming the field: the
wire protocol, the SQL function enqueue() on PostgreSQL and a function's defaults in the
config file (exit 78)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from queickd.cli import EX_CONFIG
from queickd.core import protocol
from queickd.core.protocol import Code, QueueError

BAD = [
    ({"stalled_after": 0.5}, "stalled_after"),
    ({"stalled_after": 0}, "stalled_after"),
    ({"stalled_after": -5}, "stalled_after"),
    ({"stalled_after": float("nan")}, "stalled_after"),
    ({"stalled_after": 10 ** 9}, "stalled_after"),
    ({"stalled_after": "30"}, "stalled_after"),
    ({"on_stall": "restart"}, "on_stall"),
    ({"on_stall": 1}, "on_stall"),
]


@pytest.mark.parametrize(("options", "named"), BAD)
def test_a_bad_liveness_option_is_a_bad_request_naming_the_field(options, named):
    with pytest.raises(QueueError, match=named) as e:
        protocol.parse_job({"func": "m:f", **options}, 0.0)
    assert e.value.code == Code.BAD_REQUEST


def test_good_liveness_options_are_kept_as_given():
    job = protocol.parse_job({"func": "m:f", "stalled_after": 1, "on_stall": "kill"}, 0.0)
    assert (job.stalled_after, job.on_stall) == (1.0, "kill")


def test_a_daemon_answers_a_bad_stalled_after_with_bad_request(client):
    with pytest.raises(QueueError, match="stalled_after must be seconds from 1") as e:
        client.enqueue("testjobs:add", (1, 2), stalled_after=0.2)
    assert e.value.code == Code.BAD_REQUEST


@pytest.mark.parametrize(("options", "named"), [b for b in BAD if b[0].get("stalled_after") == b[0].get(
    "stalled_after")])  # NaN is no JSON: the client cannot send it to PostgreSQL
def test_the_sql_enqueue_function_refuses_bad_liveness_options(pg_database, pg_store, options, named):
    psycopg = pytest.importorskip("psycopg")
    qpg = pytest.importorskip("queickd.pg")
    with psycopg.connect(pg_database) as c:
        with pytest.raises(QueueError, match=named) as e:
            qpg.enqueue(c, "m:f", [], schema=pg_store.schema, **options)
        assert e.value.code == Code.BAD_REQUEST


def test_the_sql_enqueue_function_keeps_good_liveness_options(pg_database, pg_store):
    psycopg = pytest.importorskip("psycopg")
    qpg = pytest.importorskip("queickd.pg")
    with psycopg.connect(pg_database) as c:
        job_id = qpg.enqueue(c, "m:f", [], schema=pg_store.schema, stalled_after=2.5, on_stall="kill")
        c.commit()
    job = pg_store.get(job_id)
    assert (job.stalled_after, job.on_stall, job.stalled_at) == (2.5, "kill", None)


def test_a_functions_bad_stalled_after_in_the_config_file_exits_78_naming_it(tmp_path):
    path = tmp_path / "queickd.toml"
    path.write_text('[functions."testjobs:add"]\nstalled_after = 0.1\n')
    r = subprocess.run([sys.executable, "-m", "queickd", "--config", str(path), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == EX_CONFIG
    assert "stalled_after" in r.stderr


def test_queick_enqueue_sends_its_liveness_flags_and_the_daemon_checks_them(daemon):
    def enqueue(*flags):
        return subprocess.run([sys.executable, "-m", "queickd", "enqueue", "testjobs:noop", "--port",
                               str(daemon.port), *flags], capture_output=True, text=True, timeout=60)

    ok = enqueue("--stalled-after", "2m", "--on-stall", "kill")
    assert ok.returncode == 0, ok.stderr
    with daemon.client() as q:
        job = q.get(int(ok.stdout))
    assert (job["stalled_after"], job["on_stall"]) == (120.0, "kill")
    bad = enqueue("--stalled-after", "0.5")
    assert bad.returncode != 0 and "stalled_after must be seconds from 1" in bad.stderr
