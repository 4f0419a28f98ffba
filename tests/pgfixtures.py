"""PostgreSQL for the tests: a fresh database per test session, a fresh schema per test.

Set QUEICKD_TEST_PG to a server URL (default postgresql://postgres@127.0.0.1:5432/postgres).
Without psycopg or a reachable server the tests that use these fixtures skip and say why.
conftest.py loads this module as a plugin, so every test can ask for these fixtures.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

SERVER = os.environ.get("QUEICKD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _with_db(url: str, db: str, schema: str | None = None) -> str:
    parts = urlsplit(url)
    query = f"options={quote('-csearch_path=' + schema)}" if schema else parts.query
    return urlunsplit((parts.scheme, parts.netloc, "/" + db, query, ""))


def _admin():
    try:
        import psycopg
    except ImportError:
        pytest.skip("PostgreSQL tests need psycopg 3 (pip install -e '.[test]')")
    try:
        return psycopg.connect(SERVER, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"no PostgreSQL server reachable at {SERVER} (set QUEICKD_TEST_PG): {e}".strip())


@contextlib.contextmanager
def _new_database(prefix: str):
    """A freshly created database (unique name), dropped on leaving; yields its URL."""
    admin = _admin()
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_db(SERVER, name)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def pg_database():
    """A database of its own for this test session (parallel runs never share one)."""
    with _new_database("queickd_test") as url:
        yield url


@pytest.fixture
def pg_url(pg_database):
    """A URL whose connections work in a schema made for this test alone."""
    import psycopg

    schema = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_database, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
    return _with_db(pg_database, urlsplit(pg_database).path.lstrip("/"), schema)


@pytest.fixture
def pg_store(pg_url):
    """A PostgresStore on a schema of its own."""
    from queickd.store.postgres.store import PostgresStore

    s = PostgresStore(pg_url)
    yield s
    s.close()


@pytest.fixture
def pg_fresh_database(pg_database):
    """A whole database for one test: for tests whose processes LISTEN (notifications are
    per database, so a database of its own keeps other tests' traffic out)."""
    with _new_database("queickd_t") as url:
        yield url


@pytest.fixture
def pg(pg_fresh_database):
    """(URL, an autocommit connection to it): a database of its own, and a way in to look
    at it (pg_stat_activity, the queue's tables) beside what the test runs on it."""
    import psycopg

    with psycopg.connect(conninfo(pg_fresh_database), autocommit=True) as c:
        yield pg_fresh_database, c


def conninfo(url: str) -> str:
    """What the store connects with for this URL: its queue's schema on the search_path."""
    from queickd.store.postgres.namespace import split_url

    return split_url(url)[0]


def listen_for_queickd(url: str):
    """A connection of its own LISTENing on queickd's wake-up and finish channels."""
    import psycopg

    from queickd.store.postgres.channels import CHANNEL, FINISHED_CHANNEL

    c = psycopg.connect(url, autocommit=True)
    c.execute(f"LISTEN {CHANNEL}; LISTEN {FINISHED_CHANNEL}")
    return c
