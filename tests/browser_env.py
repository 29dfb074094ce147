"""What the browser tests need from outside Python, and what happens when it is missing.

tests/test_book.py and tests/test_jupyterlab.py drive a real Chromium ($CHROMIUM,
else Debian's /usr/bin/chromium) through Playwright; the book's build also needs
npm. `make setup` installs both with apt-get where it can (root on Debian, see
.ci/browser-tools.sh). Anywhere else a test that needs one says what to install
and is skipped, except in CI (CI=true): there a missing tool fails the run, so
CI can never pass by skipping the browser.
"""

from __future__ import annotations

import importlib
import os
import shutil

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# headless, and nothing that phones home: this machine's network is closed
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]

HOW = {
    "chromium": "Debian `sudo apt-get install chromium`, Ubuntu `sudo snap install chromium` and "
                "CHROMIUM=/snap/bin/chromium, Fedora `sudo dnf install chromium`, "
                "macOS `brew install --cask chromium`; or export CHROMIUM=/path/to/chrome-or-chromium",
    "npm": "Debian/Ubuntu `sudo apt-get install npm`, Fedora `sudo dnf install nodejs-npm`, macOS `brew install node`",
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing(what: str, how: str):
    """Skip (locally) or fail (CI=true) because `what` is not there; `how` says how to get it."""
    message = f"{what} is missing: {how}."
    if in_ci():
        pytest.fail(f"{message} CI=true: a missing tool fails the run, it is never skipped.", pytrace=False)
    pytest.skip(f"{message} (Skipped locally; with CI=true this fails.)", allow_module_level=True)


def need_chromium() -> str:
    """The path of the Chromium to drive."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing(f"Chromium ({CHROMIUM})", HOW["chromium"])
    return CHROMIUM


def need_npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        missing("npm (the book's build fetches MathJax and the widget scripts with it)", HOW["npm"])
    return npm


def need_module(name: str, extra: str):
    """Import `name`, which the `extra` of this package installs."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"the Python module {name}", f'pip install -e ".[{extra}]" (`make setup` installs every extra)')
