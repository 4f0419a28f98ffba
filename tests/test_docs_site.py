"""The documentation site: mkdocs.yml builds strictly, every page of its nav is built and
linked from every page, and a browser draws the home page and a reference page with the
navigation in them. Needs the docs extra (pip install -e '.[docs]'); the screenshots need
Chromium. Each skips with the reason when its tool is missing."""

import functools
import html
import http.server
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent
CHROMIUM = "/usr/bin/chromium"
SECTIONS = ("Tutorials", "How-to guides", "Reference", "Explanation")  # Diátaxis's four

needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material are not installed (pip install -e '.[docs]')")
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None,
    reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium)")


def nav_pages(nav, section: str = "") -> list[tuple[str, str]]:
    """(title, page.md) of every page in mkdocs.yml's nav, sections walked in order. A bare
    page in a section (its index page) takes the section's title."""
    pages = []
    for entry in nav:
        if isinstance(entry, str):
            pages.append((section, entry))
            continue
        for title, target in entry.items():
            if isinstance(target, list):
                pages += nav_pages(target, title)
            else:
                pages.append((title, target))
    return pages


def tabs(page_html: str) -> list[str]:
    """The labels of the section tabs across the top of a Material page, in order."""
    return [html.unescape(label) for label in
            re.findall(r'class="md-tabs__link"[^>]*>\s*(.*?)\s*</a>', page_html, re.S)]


def built(site: Path, page: str) -> Path:
    """Where mkdocs (directory URLs) writes page.md: x/index.md -> x/index.html, x/y.md -> x/y/index.html."""
    stem = page.removesuffix(".md")
    if stem == "index" or stem.endswith("/index"):
        return site / (stem + ".html")
    return site / stem / "index.html"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs and mkdocs-material are not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    return out


@needs_mkdocs
def test_every_page_in_the_nav_is_built(site, config):
    pages = nav_pages(config["nav"])
    assert len(pages) >= 20
    missing = [page for _, page in pages if not built(site, page).is_file()]
    assert missing == []


@needs_mkdocs
def test_the_home_page_links_every_section_and_page_of_the_nav(site, config):
    home = (site / "index.html").read_text()
    top = [next(iter(entry)) for entry in config["nav"]]
    assert tabs(home) == top
    assert set(SECTIONS) <= set(top)
    for title, page in nav_pages(config["nav"]):
        href = page.removesuffix(".md").removesuffix("index")
        href = href + "/" if href and not href.endswith("/") else (href or ".")
        assert f'href="{href}"' in home, (title, href)


def png_size_and_colours(data: bytes) -> tuple[int, int, int]:
    """Width, height and the number of distinct byte values of the image data (a blank page
    has a handful; a drawn one, text and all, has nearly every value)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


@pytest.fixture
def served(site):
    """The built site over real HTTP on a free port, as `mkdocs serve` or any web server gives it."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1000", *args],
                          capture_output=True, text=True, timeout=90)


@needs_mkdocs
@needs_chromium
@pytest.mark.parametrize("page", ["", "reference/cli/"], ids=["home", "reference"])
def test_a_browser_draws_the_page_with_the_navigation(served, page, tmp_path):
    url = f"{served}/{page}"
    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert set(SECTIONS) <= set(tabs(dom.stdout))  # the section tabs across the top, as drawn
    shot = tmp_path / "page.png"
    r = chromium(tmp_path, f"--screenshot={shot}", url)
    assert r.returncode == 0, r.stderr[-2000:]
    data = shot.read_bytes()
    width, height, colours = png_size_and_colours(data)
    assert (width, height) == (1280, 1000)
    assert len(data) > 10_000 and colours > 64  # a drawn page, not a blank one
    keep = os.environ.get("QUEICKD_SCREENSHOT")
    if keep:  # for a person to look at: QUEICKD_SCREENSHOT=/tmp/docs pytest tests/test_docs_site.py
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / f"{page.strip('/').replace('/', '-') or 'home'}.png")
