"""The generated reference pages (docs/reference/) match the code they are generated from:
a flag, op, config key or metric added without regenerating fails here, naming the page and
the command that rewrites it."""

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "gen-reference.py"
REFERENCE = ROOT / "docs" / "reference"
PAGES = ("cli.md", "config.md", "protocol.md", "metrics.md", "python.md")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    return out


@pytest.mark.parametrize("page", PAGES)
def test_the_committed_reference_page_is_what_the_code_generates(page, generated):
    committed = REFERENCE / page
    want = (generated / page).read_text()
    have = committed.read_text() if committed.is_file() else ""
    if have != want:
        diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                 f"docs/reference/{page} (committed)",
                                                 f"docs/reference/{page} (from the code)"))[:40])
        pytest.fail(f"docs/reference/{page} is out of date with the code: run "
                    f"`python3 scripts/gen-reference.py` and commit the page.\n{diff}", pytrace=False)


def test_a_flag_added_without_regenerating_fails_the_check():
    # The parser as it would be with one more client flag: the committed cli.md lacks it.
    code = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from queickd.cli import parser\n"
        "flags = parser._client_flags\n"
        "def more(p):\n"
        "    flags(p)\n"
        "    p.add_argument('--a-flag-nobody-documented', help='new')\n"
        "parser._client_flags = more\n"
        f"sys.argv = ['gen-reference', '--check', '--out', {str(REFERENCE)!r}]\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "cli.md is out of date: run python3 scripts/gen-reference.py" in r.stderr
    assert "protocol.md" not in r.stderr  # only the page the change is on


def test_the_check_passes_on_the_committed_pages():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (0, "")


def test_a_queickd_variable_in_the_shell_does_not_change_the_pages(generated, tmp_path):
    env = {"QUEICKD_PORT": "1234", "QUEICKD_WORKERS": "9", "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], cwd=ROOT, check=True, env=env)
    for page in PAGES:
        assert (tmp_path / page).read_text() == (generated / page).read_text(), page
