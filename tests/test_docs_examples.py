"""Every fenced Python and shell example of README.md and docs/ runs, as tests/docexamples.py
describes (against a real daemon where the page needs one), or is marked not-run with its
reason. A failure names the page and the line of the block."""

from pathlib import Path

import pytest
from docexamples import ExampleError, collect, needs_daemon, run_page, to_run
from helpers import DaemonProcess

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _run(page: Path, tmp_path: Path, root: Path = ROOT) -> None:
    blocks = collect(page)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    daemon, failure = None, None
    if needs_daemon(blocks):
        daemon = DaemonProcess(f"sqlite:///{tmp_path / 'queue.db'}", "--app-dir", str(workspace)).start()
    try:
        run_page(blocks, workspace, root, daemon.port if daemon else None)
    except ExampleError as e:
        failure = str(e)
    finally:
        if daemon is not None:
            daemon.close()
    if failure is not None:
        pytest.fail(failure, pytrace=False)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_of_the_page_runs_or_says_why_not(page, tmp_path):
    _run(page, tmp_path)


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_a_failing_block_is_named_by_its_file_and_line(tmp_path):
    page = _page(tmp_path, "# Title\n\n```python\nprint('fine')\n```\n\nThen:\n\n```sh\nfalse\n```\n")
    with pytest.raises(ExampleError, match=r"^page\.md:9: the ```sh block failed \(exit 1\)"):
        run_page(collect(page), _workspace(tmp_path), tmp_path, None)


def test_a_block_marked_not_run_is_skipped_with_its_reason(tmp_path):
    page = _page(tmp_path, "<!-- not-run: needs systemd -->\n```sh\nsystemctl restart queickd\n```\n")
    [block] = collect(page)
    assert block.not_run == "needs systemd"
    assert to_run([block]) == []


def test_a_not_run_marker_without_a_reason_is_refused(tmp_path):
    page = _page(tmp_path, "text\n\n<!-- not-run -->\n```sh\ntrue\n```\n")
    with pytest.raises(ExampleError, match=r"page\.md:3: write the marker as <!-- not-run: REASON -->"):
        collect(page)


def test_a_file_block_is_written_for_the_blocks_after_it(tmp_path):
    page = _page(tmp_path, "```python\n# file: pkg/mod.py\nX = 41\n```\n\n"
                           "```python\nfrom pkg.mod import X\nassert X + 1 == 42, X\n```\n")
    run_page(collect(page), _workspace(tmp_path), tmp_path, None)
    assert (tmp_path / "workspace" / "pkg" / "mod.py").read_text() == "# file: pkg/mod.py\nX = 41\n"


def test_a_pages_test_files_run_under_pytest(tmp_path):
    page = _page(tmp_path, "```python\n# file: test_x.py\ndef test_x():\n    assert 1 == 2\n```\n")
    with pytest.raises(ExampleError, match=r"page\.md:1 \(its test files under pytest\)"):
        run_page(collect(page), _workspace(tmp_path), tmp_path, None)


def test_a_console_block_runs_its_dollar_lines_only(tmp_path):
    page = _page(tmp_path, "```console\n$ echo hi > out.txt\nhi\n```\n")
    run_page(collect(page), _workspace(tmp_path), tmp_path, None)
    assert (tmp_path / "workspace" / "out.txt").read_text() == "hi\n"


def test_a_block_in_another_language_does_not_run(tmp_path):
    page = _page(tmp_path, "```toml\nport = 'not toml' = 1\n```\n")
    assert to_run(collect(page)) == []


def test_an_example_reaches_the_pages_daemon_through_the_default_port(tmp_path):
    page = _page(tmp_path, "```python\n# file: jobfunc.py\ndef add(a, b):\n    return a + b\n```\n\n"
                           "```python\nfrom queickd import JobQueue\nfrom jobfunc import add\n"
                           "q = JobQueue()\nassert q.wait(q.enqueue(add, args=(1, 2)), timeout=20)['result'] == 3\n```\n\n"
                           "```sh\nqueick stats\n```\n")
    _run(page, tmp_path, root=ROOT)


def _workspace(tmp_path: Path) -> Path:
    w = tmp_path / "workspace"
    w.mkdir()
    return w
