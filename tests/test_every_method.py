"""Every method the CLI offers imports, loads what it ships and decodes losslessly on the real model.

A fast canary over all drafters at once, through the same path as
`specdec generate --method ...`: `make test-newest` runs it (with the
drafters' own test files) against the newest torch and transformers pip
resolves, so that a release that breaks a drafter shows up in CI before a
student installs it. Greedy in fp32: every method must print exactly the text
plain decoding prints.
"""

import contextlib
import io
import re

import pytest

from specdec_learn.cli import main
from specdec_learn.methods import names

METHODS = names()

PROMPT = "Write a Python function `count_vowels(s)` and a second one `count_consonants(s)` that reuses it."
ARGS = ["--max-new-tokens", "24", "--dtype", "fp32", "--device", "cpu", "--k", "3", "--prompt", PROMPT]


def generate(method: str) -> tuple[str, str]:
    """The text and the stats line `specdec generate --method <method>` prints."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["generate", "--method", method, *ARGS])
    assert rc == 0, f"specdec generate --method {method} failed: {err.getvalue().strip()[-2000:]}"
    found = re.search(r"\[.*mean acceptance length [0-9.]+", err.getvalue())
    assert found, f"no stats line from {method}: {err.getvalue()!r}"
    return out.getvalue(), found.group(0)


@pytest.fixture(scope="module")
def ar_text(target):  # `target` (conftest) converts the model first: the CLI would print that on stdout
    text, stats = generate("ar")
    assert text.strip() and stats.startswith("[ar k=0]") and stats.endswith("mean acceptance length 1.00")
    return text


def test_the_cli_offers_every_method():
    assert {"ar", "ngram", "suffix", "draft_model", "eagle3", "mtp", "gemma4_mtp", "dflash", "dspark"} <= set(METHODS)


@pytest.mark.parametrize("method", [m for m in METHODS if m != "ar"])
def test_method_decodes_exactly_like_ar(method, ar_text):
    """Every drafter is right some of the time on PROMPT: the learned ones load trained weights, and the n-gram
    and suffix drafters find the names the answer repeats. A mean acceptance length of 1.00 means nothing was kept."""
    text, stats = generate(method)
    assert stats.startswith(f"[{method} k=3]"), f"{method} did not draft: {stats}"  # k=0 would mean no drafter
    assert text == ar_text, f"{method}: greedy output differs from plain decoding"
    assert float(stats.rsplit(" ", 1)[-1]) > 1.0, f"{method}: no draft was ever accepted: {stats}"
