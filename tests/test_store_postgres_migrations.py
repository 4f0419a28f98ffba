"""A PostgreSQL schema of any earlier version, as the release that made it left it, migrated
in place ends exactly as a fresh one: the same functions (to the letter, with their
settings), columns and indexes. The earlier schemas are built from the migrations of the
last release of schema 28 (tests/data/pg-migrations-28.json), not from today's list, whose
earlier entries create only what is still current."""

import json
import uuid
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

SHIPPED = json.loads((Path(__file__).parent / "data" / "pg-migrations-28.json").read_text(encoding="utf-8"))

# Everything a schema declares that a migration makes, by kind, schema names taken out.
_CATALOG = {
    "function": """SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
                          pg_get_functiondef(p.oid)
                   FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace""",
    "column": """SELECT table_name || '.' || column_name,
                        concat_ws(' ', ordinal_position, data_type, is_nullable, column_default, is_identity)
                 FROM information_schema.columns WHERE table_schema = current_schema()""",
    "index": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()",
    "table": """SELECT c.relname, concat_ws(' ', c.relkind, c.reloptions::text) FROM pg_class c
                WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'S')""",
}


def _in_schema(database: str, schema: str) -> str:
    parts = urlsplit(database)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, f"options={quote('-csearch_path=' + schema)}", ""))


def _new_schema(database: str) -> str:
    """The URL of a schema made for it alone."""
    import psycopg

    name = "m_" + uuid.uuid4().hex[:12]
    with psycopg.connect(database, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{name}"')
    return _in_schema(database, name)


def _catalog(url: str) -> dict[tuple[str, str], str]:
    import psycopg

    with psycopg.connect(url) as c:
        schema = c.execute("SELECT current_schema()").fetchone()[0]
        # Named wherever it stands: qualifying a name, in a function's pinned search_path.
        return {(kind, name): text.replace(schema, "<schema>")
                for kind, sql in _CATALOG.items() for name, text in c.execute(sql).fetchall()}


def _migrated(url: str) -> None:
    from queickd.store.postgres.store import PostgresStore

    PostgresStore(url).close()


@pytest.fixture(scope="module")
def fresh(pg_database) -> dict[tuple[str, str], str]:
    """What a fresh schema holds once migrated."""
    url = _new_schema(pg_database)
    _migrated(url)
    return _catalog(url)


@pytest.mark.parametrize("version", range(1, len(SHIPPED) + 1))
def test_a_schema_of_each_earlier_version_migrates_to_what_a_fresh_one_is(pg_database, fresh, version):
    import psycopg

    from queickd.store.postgres.schema import SCHEMA_VERSION

    old = _new_schema(pg_database)
    with psycopg.connect(old) as c:  # what that release left: its migrations, its version recorded
        for sql in SHIPPED[:version]:
            c.execute(sql)
        c.execute("INSERT INTO queickd_meta VALUES ('schema_version', %s)", (str(version),))
    _migrated(old)
    want, got = fresh, _catalog(old)
    assert sum(kind == "function" for kind, _ in want) >= 6
    assert {k: v for k, v in got.items() if want.get(k) != v} == {k: v for k, v in want.items() if got.get(k) != v}
    with psycopg.connect(old) as c:
        assert c.execute("SELECT value FROM queickd_meta WHERE key = 'schema_version'").fetchone()[0] == str(
            SCHEMA_VERSION)
