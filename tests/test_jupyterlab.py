"""A chapter in a real JupyterLab, as a student opens it: run it, move the k slider, see it re-run.

Starts JupyterLab (the `notebooks` extra) on 127.0.0.1 with a random token, in
a temporary folder that holds a copy of chapter 9 (JupyterLab autosaves, and the
stored chapter must not change). Headless Chromium, through Playwright, opens
the chapter, runs every cell from the Run menu in quick mode, waits for the
KSlider widget, drags the k slider to its right end and checks that the
widget's output changes from k = 1 (computed up front) to k = 8, which only the
live kernel can compute: quick mode precomputes k = 1 and 4. A screenshot of the
page after the drag is left in the test's tmp_path.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser_env import CHROMIUM_ARGS, need_chromium, need_module

need_module("jupyterlab", "notebooks")
need_module("ipywidgets", "notebooks")
sync_api = need_module("playwright.sync_api", "book")

pytestmark = [pytest.mark.jupyterlab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "notebooks" / "09_tuning_k.ipynb"  # the chapter with the k slider
RUN_ALL_TIMEOUT_S = 15 * 60  # a model load and a small sweep, on two busy cores
SETTINGS = {  # user settings of the fresh JupyterLab
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},  # every cell in the page, not only the visible
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server with a copy of the chapter; yields (base URL, token, folder)."""
    home = tmp_path_factory.mktemp("lab")
    work = home / "notebooks"
    work.mkdir()
    shutil.copy2(CHAPTER, work / CHAPTER.name)
    port, token = free_port(), secrets.token_hex(16)
    settings = home / "settings"
    for plugin, value in SETTINGS.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = dict(os.environ, SPECDEC_QUICK="1", JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), IPYTHONDIR=str(home / "ipython"))
    log = open(home / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={work}", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly", *(["--allow-root"] if os.geteuid() == 0 else [])],  # CI is root
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"JupyterLab exited:\n{(home / 'jupyterlab.log').read_text()[-4000:]}"
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    json.load(r)
                break
            except OSError:
                assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
                time.sleep(0.5)
        yield base, token, work
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    chromium = need_chromium()  # skipped locally when missing, an error with CI=true
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def prompts(page) -> list[str]:
    return page.eval_on_selector_all(".jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent.trim())")


def kernel_idle(page) -> bool:
    """The status bar names the kernel and says it is idle (it reads "No Kernel" while the page loads)."""
    text = page.inner_text("#jp-main-statusbar")
    return "ipykernel" in text and "Idle" in text


def wait_until_run(page, timeout_s: float) -> None:
    """Until the kernel is idle with no cell queued or running, twice in a row (it idles between cells)."""
    deadline, calm = time.monotonic() + timeout_s, 0
    while calm < 2:
        assert time.monotonic() < deadline, f"the chapter did not finish within {timeout_s:.0f} s: {prompts(page)}"
        time.sleep(2)
        calm = calm + 1 if kernel_idle(page) and not any("*" in p for p in prompts(page)) else 0


def test_chapter_runs_and_the_k_slider_reruns_it(lab, browser, tmp_path):
    base, token, work = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    outside: list[str] = []

    def only_local(route):
        if route.request.url.startswith(base):
            route.continue_()
        else:  # JupyterLab and the widgets must work offline
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{base}/lab/tree/{CHAPTER.name}?token={token}", wait_until="domcontentloaded")
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=120_000)
        deadline = time.monotonic() + 120
        while not kernel_idle(page):  # the notebook loaded and its kernel started
            assert time.monotonic() < deadline, f"no idle kernel after 120 s: {page.inner_text('#jp-main-statusbar')}"
            time.sleep(0.5)

        # Run > Run All Cells, as a reader does
        page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        page.click(".lm-Menu-item[data-command='runmenu:run-all']")
        page.wait_for_function("() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                               ".some(e => e.textContent.includes('*'))", timeout=30_000)
        wait_until_run(page, RUN_ALL_TIMEOUT_S)

        # File > Save, then read what ran from the saved copy: every code cell, no error
        page.click(".lm-MenuBar-itemLabel:text-is('File')")
        page.click(".lm-Menu-item[data-command='docmanager:save']")
        page.wait_for_selector(".jp-mod-dirty", state="detached", timeout=30_000)
        saved = json.loads((work / CHAPTER.name).read_text())
        code = [c for c in saved["cells"] if c["cell_type"] == "code"]
        assert all(c["execution_count"] for c in code), f"cells not run: {[c['execution_count'] for c in code]}"
        failed = [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
        assert not failed, f"a cell failed: {failed[0]['ename']}: {failed[0]['evalue']}"

        # the live widget, not the static HTML the book shows: a slider and one k's bars
        widget = page.locator(".jp-OutputArea-output .widget-vbox").filter(has=page.locator(".sd-acceptance"))
        assert widget.count() == 1, "the KSlider widget did not render live (is the ipywidgets extension installed?)"
        widget.scroll_into_view_if_needed()
        view = widget.locator(".sd-acceptance")
        before = view.inner_text()
        assert "k = 1" in before and before.count("position") == 1, before
        assert widget.locator(".widget-readout").inner_text().strip() == "1"

        # drag the handle to the far right: k = 8, which no one computed yet
        track = widget.locator(".noUi-target").bounding_box()
        handle = widget.locator(".noUi-handle").bounding_box()
        page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
        page.mouse.down()
        page.mouse.move(track["x"] + track["width"] + 40, handle["y"] + handle["height"] / 2, steps=12)
        page.mouse.up()
        assert widget.locator(".widget-readout").inner_text().strip() == "8"
        view.filter(has_text="k = 8").wait_for(timeout=300_000)  # the kernel re-runs the generation
        after = view.inner_text()
        page.screenshot(path=str(tmp_path / "jupyterlab-k-slider.png"), full_page=True)
        assert "k = 8" in after and after.count("position") == 8, after
        assert "mean acceptance length" in after and "x plain decoding" in after and after != before
        assert not outside, f"requests leaving the machine: {outside[:5]}"
        assert not errors, f"script errors in the page: {errors[:5]}"
    finally:
        page.close()
