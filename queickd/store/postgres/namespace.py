"""The schema the queue's objects live in, apart from an application's own tables in the
same database: `queickd` unless the store URL says `?schema=NAME` (or its `options` give a
search_path: that schema). Every connection the store opens names it in its startup options,
so the store's SQL stays unqualified; the functions in the schema carry their own
search_path (PIN_FUNCTIONS), whatever their caller's is. Imports no psycopg.

A database migrated before the schema existed keeps its objects where the default
search_path put them (the role's own schema, or public) until the migration MOVE moves them.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

DEFAULT_SCHEMA = "queickd"
MOVE = 28  # the index in MIGRATIONS (schema.py) of the move: schema version 29
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_SEARCH_PATH = re.compile(r"-c\s*search_path\s*=\s*(\S+)")

# The schema a database migrated before MOVE keeps its objects in: the one of the default
# search_path ("$user", public) that holds queickd_meta, if it is not the schema itself.
_LEGACY = """
    SELECT n.nspname FROM pg_namespace n
    WHERE n.nspname IN (session_user, 'public') AND n.nspname <> current_schema()
      AND to_regclass(format('%I.queickd_meta', n.nspname)) IS NOT NULL
    ORDER BY n.nspname = 'public' LIMIT 1"""

# Each function in the schema runs with the schema's search_path, not its caller's.
PIN_FUNCTIONS = """
    DO $pin$
    DECLARE f regprocedure;
    BEGIN
        FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                 WHERE p.pronamespace = current_schema()::regnamespace
                   AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) s WHERE s LIKE 'search_path=%')
        LOOP
            EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        END LOOP;
    END
    $pin$;
"""


def move_migration(tables: list[str]) -> str:
    """The migration that moves a database's queickd objects from where the default
    search_path put them into the schema (the current one when it runs): the `tables`
    (their indexes, constraints, identity sequences, row types and triggers go with them)
    and the queickd_* functions. Nothing to move on a database created in the schema."""
    names = ", ".join(f"'{t}'" for t in tables)
    return f"""
    DO $move$
    DECLARE
        legacy text;
        t text;
        f regprocedure;
    BEGIN
        {_LEGACY.strip()} INTO legacy;
        IF legacy IS NULL THEN
            RETURN;
        END IF;
        FOREACH t IN ARRAY ARRAY[{names}] LOOP
            IF to_regclass(format('%I.%I', legacy, t)) IS NOT NULL THEN
                EXECUTE format('ALTER TABLE %I.%I SET SCHEMA %I', legacy, t, current_schema());
            END IF;
        END LOOP;
        FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                 WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = legacy) AND p.proname LIKE 'queickd\\_%'
        LOOP
            EXECUTE format('ALTER FUNCTION %s SET SCHEMA %I', f, current_schema());
        END LOOP;
    END
    $move$;
    """ + PIN_FUNCTIONS


def split_url(url: str) -> tuple[str, str]:
    """(the conninfo psycopg is given, the schema) of a store URL: `schema` taken out of its
    query and the schema put first in the connections' search_path."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = [v for k, v in query if k == "schema"]
    query = [(k, v) for k, v in query if k != "schema"]
    options = " ".join(v for k, v in query if k == "options")
    query = [(k, v) for k, v in query if k != "options"]
    found = _SEARCH_PATH.search(options)
    schema = given[-1] if given else found.group(1).split(",")[0].strip('"') if found else DEFAULT_SCHEMA
    if not _NAME.fullmatch(schema):
        raise ValueError(f"the store's schema must be a lower-case SQL name (a-z, 0-9, _), not {schema!r}")
    options = _SEARCH_PATH.sub("", options).strip()
    query.append(("options", f"{options} -c search_path={schema}".strip()))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote))), schema


def ident(name: str) -> str:
    """NAME quoted as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def enter(c: Any, schema: str) -> str | None:
    """In the caller's transaction: the schema created if missing; if the database's objects
    are still where the default search_path put them (before MOVE), the transaction's
    search_path is that schema, whose name is returned, else None."""
    if c.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()[0] is None:
        c.execute(f"CREATE SCHEMA {ident(schema)}")
    if c.execute("SELECT to_regclass('queickd_meta')").fetchone()[0] is not None:
        return None
    row = c.execute(_LEGACY).fetchone()
    if row is None:
        return None
    legacy = row[0]
    version = c.execute(f"SELECT value FROM {ident(legacy)}.queickd_meta WHERE key = 'schema_version'").fetchone()
    if version is not None and int(version[0]) > MOVE:
        return None  # moved already: that one is another queue's schema
    leave(c, legacy)
    return legacy


def leave(c: Any, schema: str) -> None:
    """The transaction's search_path set to `schema` (SET LOCAL: the session's comes back at
    its end)."""
    c.execute(f"SET LOCAL search_path = {ident(schema)}")


def missing_schema_hint(schema: str) -> str:
    """What to do about a database without the queue's schema (or its function)."""
    return (f"the queue's schema {schema!r} is not in this database, or not migrated:"
            f" run `queick db migrate --store URL` (URL naming ?schema={schema} if not the default)")

