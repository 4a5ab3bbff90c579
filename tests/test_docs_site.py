"""The docs site as a reader's browser shows it.

The site is built with ``mkdocs build --strict`` (or ``site/`` reused when `make test` has just built
it), served over HTTP on 127.0.0.1 and opened in a real headless browser, Debian's chromium: the
quickstart page renders its RwF example, and each method page is reachable from the home page's
navigation. Without chromium the tests skip, except under CI, where scripts/setup.sh installs it.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urljoin

import pytest

REPO = Path(__file__).resolve().parents[1]
METHODS = ("RwF", "MaRS", "APN", "QOA")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Page(HTMLParser):
    """What the checks read from a rendered DOM: the title, h1 text, code text and navigation links."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.title, self.h1, self.code = "", "", ""
        self.nav_links: list[tuple[str, str]] = []  # (href, text)
        self._open: list[tuple[str, bool]] = []  # (tag, opens a navigation region)
        self._link: list[str] | None = None
        self.feed(dom)

    def in_(self, *tags: str) -> bool:
        return any(tag in tags for tag, _ in self._open)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in VOID:
            return
        self._open.append((tag, tag == "nav" or attrs.get("role") == "navigation"))
        if tag == "a" and any(nav for _, nav in self._open) and attrs.get("href"):
            self._link = [attrs["href"], ""]

    def handle_endtag(self, tag):
        if tag == "a" and self._link is not None:
            self.nav_links.append((self._link[0], " ".join(self._link[1].split())))
            self._link = None
        if any(open_ == tag for open_, _ in self._open):  # pop to the matching tag
            while self._open.pop()[0] != tag:
                pass

    def handle_data(self, data):
        if self._link is not None:
            self._link[1] += data
        if self.in_("title"):
            self.title += data
        if self.in_("h1"):
            self.h1 += data
        if self.in_("pre", "code"):
            self.code += data


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None)
    if path is None:
        reason = "Debian's chromium is not installed (scripts/setup.sh installs it: apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return path


def sources_newest() -> float:
    """The newest modification time of what the site is built from (the API pages read the package)."""
    sources = [REPO / "mkdocs.yml", *(REPO / "docs").rglob("*"), *(REPO / "hf_clroute").rglob("*.py")]
    return max(p.stat().st_mtime for p in sources if p.is_file())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = REPO / "site"
    if (built / "index.html").is_file() and (built / "index.html").stat().st_mtime >= sources_newest():
        return built  # `make test` built it a moment ago, strictly
    out = tmp_path_factory.mktemp("site")
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)]
    done = subprocess.run(mkdocs, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{(done.stdout + done.stderr)[-6000:]}"
    return out


@pytest.fixture(scope="module")
def site_url(site: Path) -> Iterator[str]:
    """The site served over HTTP, as a reader gets it (not file://)."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browse(chromium: str, site_url: str, tmp_path_factory: pytest.TempPathFactory):
    """``browse(url) -> Page``: the DOM headless chromium renders for the url (scripts run)."""
    profile = tmp_path_factory.mktemp("chromium-profile")

    def load(url: str) -> Page:
        command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=3000",
                   "--dump-dom", url]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0 and "<html" in done.stdout, (
            f"chromium could not render {url} (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return Page(done.stdout)

    return load


@pytest.fixture(scope="module")
def home(browse, site_url: str) -> Page:
    page = browse(site_url)
    assert page.nav_links, "the home page shows no navigation links"
    return page


def nav_target(home: Page, site_url: str, name: str) -> str:
    """The address of the home page's navigation link whose text starts with `name`."""
    hits = [href for href, text in home.nav_links if re.match(rf"{re.escape(name)}\b", text, flags=re.IGNORECASE)]
    assert hits, f"no navigation link named {name!r} on the home page: {sorted({t for _, t in home.nav_links})}"
    return urljoin(site_url, hits[0])


def test_quickstart_renders_its_rwf_example(browse, home: Page, site_url: str):
    page = browse(nav_target(home, site_url, "Quickstart"))
    assert "quickstart" in (page.title + page.h1).lower(), (page.title, page.h1)
    assert "RwfConfig" in page.code, "the quickstart page shows no code block with RwfConfig"


@pytest.mark.parametrize("method", METHODS)
def test_method_page_is_reachable_from_the_home_navigation(browse, home: Page, site_url: str, method: str):
    page = browse(nav_target(home, site_url, method))
    assert method.lower() in page.h1.lower(), f"the {method} link opened a page headed {page.h1!r} ({page.title!r})"
