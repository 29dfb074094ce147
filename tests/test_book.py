"""The book, built and read in a real browser.

Builds the Jupyter Book with warnings as errors (book/build.py), serves it on
localhost, and opens every page in Debian's headless Chromium through
Playwright. Each page must load with no failed request and no request
leaving the machine (MathJax, require.js and the widget embed script are
local copies), no script error, rendered math, every figure the chapter
stores, links that lead somewhere, nothing wider than the text column at
1280 px, and a navigation that reaches every chapter. Screenshots go to
book/_build/screenshots/ (git-ignored) as test artefacts.
"""

import functools
import http.server
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from browser_env import CHROMIUM_ARGS, need_chromium, need_module, need_npm

sync_api = need_module("playwright.sync_api", "book")
nbformat = need_module("nbformat", "book")
yaml = need_module("yaml", "book")

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
HTML = BOOK / "_build" / "html"
SHOTS = BOOK / "_build" / "screenshots"


def toc_pages() -> list[str]:
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text())
    return [toc["root"]] + [ch["file"] for part in toc["parts"] for ch in part["chapters"]]


def stored_figures(page: str) -> int:
    """How many figures a chapter's stored outputs hold (0 for a markdown page)."""
    name = Path(page).name
    path = ROOT / "notebooks" / f"{name}.ipynb"
    if not path.exists():
        return 0
    nb = nbformat.read(path, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def has_math(page: str) -> bool:
    path = ROOT / "notebooks" / f"{Path(page).name}.ipynb"
    if not path.exists():
        return False
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    text = re.sub(r"```.*?```|`[^`]*`", "", text, flags=re.S)  # code is not math
    return bool(re.search(r"\$[^$\s][^$]*\$", text))


@pytest.fixture(scope="module")
def site():
    """Build the book, serve it on a free localhost port; yields the base URL."""
    need_npm()
    build = subprocess.run([sys.executable, str(BOOK / "build.py")], cwd=ROOT, capture_output=True, text=True)
    assert build.returncode == 0, f"the book did not build (warnings are errors):\n{build.stdout[-3000:]}\n{build.stderr[-6000:]}"
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    chromium = need_chromium()  # skipped locally when missing, an error with CI=true
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser, base: str, url: str):
    """Load `url`; returns (page, problems) where problems lists failed or outside requests and script errors."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []

    def only_local(route):
        if route.request.url.startswith(base):
            route.continue_()
        else:  # the book must not need the network
            problems.append(f"request leaving the machine: {route.request.url}")
            route.abort()

    page.route("**/*", only_local)
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    page.goto(url, wait_until="networkidle")
    return page, problems


def test_every_chapter_is_reachable_from_the_navigation(site, browser):
    page, problems = open_page(browser, site, site + "intro.html")
    hrefs = page.eval_on_selector_all(".bd-sidebar-primary a.reference.internal", "els => els.map(e => e.href)")
    page.close()
    assert not problems, problems
    reached = {h.split("#")[0].removeprefix(site).removesuffix(".html") for h in hrefs}
    missing = [p for p in toc_pages()[1:] if p not in reached]
    assert not missing, f"not in the sidebar navigation: {missing} (found {sorted(reached)})"


@pytest.mark.parametrize("page_name", toc_pages())
def test_page_renders_offline(site, browser, page_name):
    page, problems = open_page(browser, site, site + page_name + ".html")
    SHOTS.mkdir(parents=True, exist_ok=True)
    if has_math(page_name):
        page.wait_for_selector("mjx-container", timeout=20_000)
    page.screenshot(path=str(SHOTS / f"{Path(page_name).name}.png"), full_page=True)
    try:
        assert not problems, "\n".join(problems)
        assert page.title(), "the page has no title"

        # math: every formula typeset by MathJax, none left as TeX or as an error
        math = page.eval_on_selector_all(
            "span.math, div.math", "els => els.map(e => !!e.querySelector('mjx-container'))")
        assert all(math), f"{math.count(False)} of {len(math)} formulas were not typeset"
        assert page.locator("mjx-merror").count() == 0, "MathJax reported a TeX error"
        if has_math(page_name):
            assert math, "the chapter has formulas but the page shows none"

        # figures: every stored figure is on the page and has loaded
        sizes = page.eval_on_selector_all(
            "main img", "els => els.filter(e => e.src.startsWith('data:') || e.src.includes('_images'))"
            ".map(e => [e.src.slice(0, 60), e.complete && e.naturalWidth])")
        expected = stored_figures(page_name)
        assert len(sizes) == expected, f"{len(sizes)} figures on the page, the notebook stores {expected}"
        assert all(w for _, w in sizes), f"figures that did not load: {[s for s, w in sizes if not w]}"

        # links: every link inside the book leads to a page (and anchor) that exists
        links = page.eval_on_selector_all("main a[href]", "els => els.map(e => e.href)")
        for link in {l for l in links if l.startswith(site)}:
            url, _, anchor = link.partition("#")
            assert page.request.get(url).status == 200, f"broken link: {link}"
            if anchor and url.rstrip("/") == page.url.split("#")[0].rstrip("/"):
                assert page.locator(f"[id='{anchor}']").count(), f"link to a missing anchor: {link}"

        # layout at 1280 px: no code or output block runs out of the column, no formula is clipped
        overflowing = page.eval_on_selector_all(
            "main pre", "els => els.filter(e => e.offsetParent && e.scrollWidth > e.clientWidth + 1)"
            ".map(e => e.textContent.trim().slice(0, 70))")
        assert not overflowing, f"blocks wider than the column at 1280 px: {overflowing[:5]}"
        # (a formula wider than the column would be cut at its edge or hidden behind a scrollbar:
        # at 1280 px each one fits, broken over lines where long; narrower screens scroll, specdec.css)
        wide = page.eval_on_selector_all(
            "mjx-container[display='true']", "els => els.filter(e => e.scrollWidth > e.clientWidth + 1)"
            ".map(e => e.textContent.slice(0, 50))")
        assert not wide, f"display formulas wider than the column at 1280 px: {wide[:5]}"
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1280, f"the page scrolls sideways: {width} px wide in a 1280 px window"

        # widgets: shown as their static HTML, not as an empty live widget
        source = (ROOT / "notebooks" / f"{Path(page_name).name}.ipynb")
        if source.exists() and "TokenViewer(" in source.read_text():
            assert page.locator(".sd-token-viewer .sd-tok").count() > 0, "the token viewer's static view is missing"
    finally:
        page.close()


def test_widget_scripts_are_local(site):
    """Pages with widget state load require.js and the embed script from the site, never a CDN."""
    pages = [p for p in HTML.rglob("*.html") if "application/vnd.jupyter.widget-state+json" in p.read_text()]
    assert pages, "no page carries widget state: the widget chapters were stored without it"
    for p in pages:
        text = p.read_text()
        assert "require.js" in text and "html-manager/embed-amd.js" in text, p
        assert "cdn.jsdelivr" not in text and "cdnjs" not in text, f"{p} still names a CDN"


def test_a_failing_npm_is_reported_in_npms_own_words(tmp_path, monkeypatch):
    """No network and no npm cache: the build stops with npm's message, not a bare CalledProcessError."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("book_build", ROOT / "book" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    fake = tmp_path / "bin" / "npm"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'npm error code ENOTCACHED: request to the registry failed, offline' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(build, "VENDOR", tmp_path / "_vendor")  # never the real one
    with pytest.raises(SystemExit) as stop:
        build.fetch_assets()
    assert "ENOTCACHED" in str(stop.value) and "npm pack" in str(stop.value)
