"""The performance page's tables: `python -m bench.publish` run on the small bench results
committed in tests/data/ (bench-sqlite.json as bench.run writes it, bench-pg.json as
bench.pg does), writing into a page between its marker comments; and the peers' job
modules, which the bench byte-compiles as a user's first import would."""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
from pathlib import Path

from bench.peers import write_huey_app

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

PAGE = """# Performance

Prose before the tables, which the script must keep as it is.

<!-- bench:sqlite:start -->
an old table
<!-- bench:sqlite:end -->

Prose between the tables.

<!-- bench:pg:start -->
an old PostgreSQL table
<!-- bench:pg:end -->

Prose after the tables.
"""


def publish(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "bench.publish", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def written_page(tmp_path: Path, *args: str) -> str:
    page = tmp_path / "performance.md"
    page.write_text(PAGE)
    r = publish("--page", str(page), *args)
    assert r.returncode == 0, r.stderr
    return page.read_text()


def sqlite_rows(text: str) -> dict[str, list[str]]:
    """The SQLite table's rows by their first cell."""
    body = text.split("<!-- bench:sqlite:start -->")[1].split("<!-- bench:sqlite:end -->")[0]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")]
                                             for line in body.splitlines() if line.startswith("| "))}


def test_the_end_to_end_row_gives_each_systems_median_and_queickds_ratios(tmp_path):
    rows = sqlite_rows(written_page(tmp_path, "--json", str(DATA / "bench-sqlite.json")))
    e2e = rows["end to end, 5,000 jobs appending a byte, one enqueue per job, 4 workers"]
    assert e2e == ["2,500 jobs/s (2.27× Queick; 1.25× huey)", "1,100 jobs/s", "2,000 jobs/s"]


def test_a_row_of_several_measurements_gives_each_and_each_ratio(tmp_path):
    rows = sqlite_rows(written_page(tmp_path, "--json", str(DATA / "bench-sqlite.json")))
    latency = rows["enqueue → start, lone jobs 50 ms apart, p50 / p90 / p99"]
    assert latency == ["1.1 / 1.4 / 2.0 ms (0.50× / 0.40× / 0.04× Queick)", "2.2 / 3.5 / 45.0 ms", "—"]


def test_rows_the_run_did_not_measure_are_left_out(tmp_path):
    rows = sqlite_rows(written_page(tmp_path, "--json", str(DATA / "bench-sqlite.json")))
    assert "one client, one request at a time, enqueue only" in rows
    assert not any(label.startswith("SD card") or label.startswith("idle") for label in rows)
    assert rows["… the same, `--durability normal`"] == ["4,500 jobs/s", "", ""]


def test_the_table_names_the_machine_and_the_date_of_the_run(tmp_path):
    text = written_page(tmp_path, "--json", str(DATA / "bench-sqlite.json"))
    assert ("Measured on 2026-12-06 18:30 UTC on Test CPU Model 9000, 2 cores, 7.8 GiB RAM, Linux 6.1.0-test, "
            "Python 3.11.7, SQLite 3.40.1 (median of 3 rounds).") in text


def test_the_tables_replace_what_was_between_the_markers_and_keep_the_prose(tmp_path):
    text = written_page(tmp_path, "--json", str(DATA / "bench-sqlite.json"), "--pg-json", str(DATA / "bench-pg.json"))
    assert "an old table" not in text and "an old PostgreSQL table" not in text
    before, rest = text.split("<!-- bench:sqlite:start -->\n")
    assert before == PAGE.split("<!-- bench:sqlite:start -->\n")[0]
    between = rest.split("<!-- bench:sqlite:end -->")[1].split("<!-- bench:pg:start -->")[0]
    assert between == "\n\nProse between the tables.\n\n"
    assert text.endswith("<!-- bench:pg:end -->\n\nProse after the tables.\n")
    assert "| end to end, batched: rate | 4,169 jobs/s | 1,122 jobs/s | 303 jobs/s |" in text
    assert "PostgreSQL 15.20 (median of 1 round)." in text


def test_only_the_table_given_is_replaced(tmp_path):
    text = written_page(tmp_path, "--pg-json", str(DATA / "bench-pg.json"))
    assert "an old table" in text and "an old PostgreSQL table" not in text


def test_the_page_is_written_again_the_same_from_the_same_results(tmp_path):
    once = written_page(tmp_path, "--json", str(DATA / "bench-sqlite.json"))
    page = tmp_path / "performance.md"
    assert publish("--page", str(page), "--json", str(DATA / "bench-sqlite.json")).returncode == 0
    assert page.read_text() == once


def test_a_page_without_the_markers_is_refused_and_left_alone(tmp_path):
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\nNo markers here.\n")
    r = publish("--page", str(page), "--json", str(DATA / "bench-sqlite.json"))
    assert r.returncode == 2
    assert "<!-- bench:sqlite:start -->" in r.stderr
    assert page.read_text() == "# Performance\n\nNo markers here.\n"


def test_the_peers_job_modules_are_byte_compiled_for_the_source_they_sit_beside(tmp_path):
    """Queick re-imports the job module twice per job: without bytecode beside the copy,
    where PYTHONDONTWRITEBYTECODE is set, each job compiled the source twice."""
    write_huey_app(tmp_path, sys.executable)
    for name in ("benchjobs.py", "hueyjobs.py"):
        source = tmp_path / name
        cached = Path(importlib.util.cache_from_source(str(source)))
        header = cached.read_bytes()[:16]
        magic, flags, mtime, size = header[:4], *struct.unpack("<3I", header[4:])
        st = source.stat()
        assert (magic, flags, mtime, size) == (importlib.util.MAGIC_NUMBER, 0, int(st.st_mtime) & 0xFFFFFFFF,
                                               st.st_size & 0xFFFFFFFF)
