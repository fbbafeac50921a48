"""The documentation site in a real browser: Debian's chromium, headless, driven by selenium.

The site is built once (``mkdocs build --strict``, as CI builds it) and served from a thread on
127.0.0.1.  From the front page the test follows the navigation to every page, and fails on a
page without its title (``<h1>``), on any console error (a script that throws, an asset that
does not load: the browser's SEVERE log entries), on a page the navigation does not reach, and
on a search that finds nothing.  Chromium resolves no host but 127.0.0.1, so a page that would
load something from the internet (fonts, scripts, a repository's star count) fails here, in CI
and offline alike, instead of depending on the network.  A screenshot of the front page is
kept in ``.artifacts/docs/`` (git-ignored).
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urlsplit

import pytest

from tests.support import ROOT, wait_until
from tests.support.browser import chromium

pytestmark = pytest.mark.browser

ARTIFACTS = ROOT / ".artifacts" / "docs"

#: Every link of the navigation, absolute (the browser resolves the relative hrefs).
_NAV_LINKS = """
return Array.from(document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]'), a => a.href);
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strictly from the checkout's mkdocs.yml (a warning fails the build)."""
    out = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if build.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed (exit {build.returncode}):\n{build.stderr}{build.stdout}")
    print(f"\nsite built in {time.monotonic() - started:.1f} s")
    return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    """The built site served over HTTP on 127.0.0.1 (a free port) from a thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, name="docs-http", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def site_browser() -> Iterator[Any]:
    """Chromium as the UI's browser tests start it, plus its console log and no host but loopback."""
    # every other host fails at once, the same with and without a network
    driver = chromium("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", console_log=True)
    yield driver
    driver.quit()


def _page(url: str) -> str:
    """A page's address without its fragment (the navigation also links to the current page's headings)."""
    return urldefrag(url).url


def _severe(browser: Any) -> list[str]:
    """The console's error entries since the last call (reading the log empties it)."""
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def _visit(browser: Any, url: str) -> list[str]:
    """Open ``url``; its problems: no ``<h1>``, console errors."""
    browser.get(url)
    wait_until(
        lambda: browser.execute_script("return document.readyState") == "complete",
        what=f"{url} to load",
        timeout=30,
        interval=0.05,
    )
    problems = [f"{url}: console error: {message}" for message in _severe(browser)]
    titles = [h.text for h in browser.find_elements("css selector", "article h1")]
    if not any(title.strip() for title in titles):
        problems.append(f"{url}: no <h1> in the page's article")
    return problems


def test_every_page_of_the_navigation_loads_without_a_console_error(
    site: Path, base_url: str, site_browser: Any
) -> None:
    browser = site_browser
    started = time.monotonic()
    problems = _visit(browser, base_url)

    # The front page: its search works (the search worker loads the index, finds a page).
    field = browser.find_element("css selector", "input.md-search__input")
    wait_until(field.is_displayed, what="the search field in the header", timeout=10, interval=0.05)
    field.click()
    field.send_keys("topology")
    wait_until(
        lambda: browser.find_elements("css selector", ".md-search-result__item"),
        what="search results for 'topology'",
        timeout=20,
        interval=0.1,
    )
    field.clear()
    problems += [f"{base_url} (search): console error: {m}" for m in _severe(browser)]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.get(base_url)
    wait_until(lambda: browser.execute_script("return document.readyState") == "complete", what="the front page")
    shot = ARTIFACTS / "front.png"
    assert browser.save_screenshot(str(shot))
    print(f"screenshot of the front page: {shot}")
    problems += [f"{base_url}: console error: {m}" for m in _severe(browser)]

    # Every page the navigation links to, and the pages their navigation links to.
    seen = {_page(base_url)}
    queue = [_page(u) for u in browser.execute_script(_NAV_LINKS)]
    while queue:
        url = queue.pop(0)
        if url in seen or not url.startswith(base_url):
            continue
        seen.add(url)
        problems += _visit(browser, url)
        queue += [_page(u) for u in browser.execute_script(_NAV_LINKS)]
    problems += [f"(after the last page): console error: {m}" for m in _severe(browser)]
    print(f"{len(seen)} pages visited in {time.monotonic() - started:.1f} s")

    # ...which are all of the site's pages (mkdocs --strict refuses a page outside the nav).
    built = {
        base_url + "".join(f"{part}/" for part in p.parent.relative_to(site).parts) for p in site.rglob("index.html")
    }
    reached = {u if urlsplit(u).path.endswith("/") else u + "/" for u in seen}
    unreached = sorted(built - reached)
    assert not problems, "\n".join(problems)
    assert not unreached, f"pages of the built site the navigation does not reach: {unreached}"
