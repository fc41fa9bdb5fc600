"""The documentation site as a reader meets it: built with `mkdocs build --strict` (as
`make docs` and CI build it), served over HTTP, and opened in a real headless browser
(Debian's chromium and its chromedriver, installed with apt-get by the setup when missing,
as root, as testenv builds its binaries). The home page, a runbook and the change pages
draw their Mermaid diagrams from the site's own copy of mermaid (nothing is fetched from
elsewhere), the command reference renders, and search finds a command."""

from __future__ import annotations

import functools
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 60


def _install_chromium() -> None:
    """Debian's packages, once per machine; the test is skipped only where they cannot be had."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("chromium and chromium-driver are not installed and apt-get cannot install them here")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"], check=True, env=env,
                   capture_output=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def site(built: Path) -> Iterator[str]:
    """The site built strictly into a temporary folder, served on a free local port."""
    handler = functools.partial(_QuietHandler, directory=str(built))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requested: list[str] = []

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        _QuietHandler.requested.append(self.path)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    _install_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _open(browser: object, url: str) -> object:
    browser.get(url)  # type: ignore[attr-defined]
    return browser


def _drawn(browser: object) -> int:
    """Waits until every Mermaid block of the page is drawn, and says how many there are.
    Material replaces each `pre.mermaid` (the source) with a `div.mermaid` holding the SVG
    in a closed shadow root: drawn is a `div` that takes room on the page."""
    from selenium.webdriver.support.ui import WebDriverWait

    script = ("var blocks = document.querySelectorAll('.mermaid');"
              "var drawn = Array.from(blocks).filter(function (e) {"
              "  return e.tagName === 'DIV' && e.getBoundingClientRect().height > 20; });"
              "return [blocks.length, drawn.length];")
    WebDriverWait(browser, WAIT_S).until(lambda b: b.execute_script(script)[0] == b.execute_script(script)[1] > 0)
    return int(browser.execute_script(script)[1])  # type: ignore[attr-defined]


def _sources(page: Path) -> list[str]:
    return [html.unescape(code) for code in re.findall(r'<pre class="mermaid"><code>(.*?)</code></pre>',
                                                       page.read_text(), re.S)]


def test_the_home_page_draws_its_diagram_from_the_sites_own_mermaid(site, browser):
    _QuietHandler.requested.clear()
    _open(browser, f"{site}/")
    assert browser.title.startswith("gpuops")  # type: ignore[attr-defined]
    assert _drawn(browser) == 1
    assert "/assets/javascripts/mermaid.min.js" in _QuietHandler.requested
    # Nothing came from another host: every resource the page loaded is the site's own.
    others = browser.execute_script(  # type: ignore[attr-defined]
        "return performance.getEntriesByType('resource').map(function (r) { return r.name; })"
        ".filter(function (n) { return n.indexOf(arguments[0]) !== 0; })", site)
    assert others == []


def test_a_runbook_renders_with_its_diagram(site, browser):
    from selenium.webdriver.common.by import By

    _open(browser, f"{site}/runbooks/halts/eviction-blocked/")
    heading = browser.find_element(By.CSS_SELECTOR, "article h1")  # type: ignore[attr-defined]
    assert heading.text == "Halted: a PodDisruptionBudget blocked the drain"
    assert _drawn(browser) == 1
    text = browser.find_element(By.CSS_SELECTOR, "article").text  # type: ignore[attr-defined]
    assert "What to check first" in text and "/gpu continue <run>" in text


def test_each_change_page_draws_its_state_diagram(site, browser):
    for kind in ("drain", "upgrade", "mig", "migrate"):
        _open(browser, f"{site}/changes/{kind}/")
        assert _drawn(browser) == 1, kind


def test_the_command_reference_renders_every_command(site, browser):
    from selenium.webdriver.common.by import By

    from commands.catalog import REGISTRY

    _open(browser, f"{site}/reference/commands/")
    headings = {h.text.rstrip("¶").strip()
                for h in browser.find_elements(By.CSS_SELECTOR, "article h2")}  # type: ignore[attr-defined]
    assert {f"/gpu {spec.name}" for spec in REGISTRY.commands.values()} <= headings


def test_search_finds_a_command(site, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _open(browser, f"{site}/")
    box = WebDriverWait(browser, WAIT_S).until(lambda b: b.find_element(By.CSS_SELECTOR, "input.md-search__input"))
    box.click()  # the header's search field, at this window's width
    box.send_keys("uncordon")
    WebDriverWait(browser, WAIT_S).until(
        lambda b: any("/gpu uncordon" in r.text for r in b.find_elements(By.CSS_SELECTOR, ".md-search-result__item")))


def test_every_diagram_of_the_site_parses_with_the_sites_mermaid(built, site, browser):
    # A diagram with a syntax error is drawn too (as an error picture): parse each one.
    _open(browser, f"{site}/")
    _drawn(browser)
    sources = [(page, code) for page in sorted(built.rglob("*.html")) for code in _sources(page)]
    assert len(sources) >= 30  # the home page, the concepts, four changes, every halt runbook, the results
    for page, code in sources:
        error = browser.execute_async_script(  # type: ignore[attr-defined]
            "var done = arguments[arguments.length - 1];"
            "mermaid.parse(arguments[0]).then(function () { done(null); }, function (e) { done(String(e)); });",
            code)
        assert error is None, f"{page.relative_to(built)}: {error}"
