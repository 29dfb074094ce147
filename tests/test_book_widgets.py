"""The book's widgets: the colours of each token, and both ways they display."""

import html

import pytest

import specdec_learn as sd
from specdec_learn.decode import RoundTrace
from specdec_learn.widgets import KINDS, KSlider, TokenViewer, output_tokens, round_tokens

pytest.importorskip("ipywidgets", reason="the book extra is not installed: `make setup`")


def test_round_tokens_classifies_every_case():
    trace = [
        RoundTrace(drafts=[1, 2, 3], accepted=1, next_token=9),  # 1 kept, 2 rejected, 3 never checked
        RoundTrace(drafts=[4, 5], accepted=2, next_token=6),  # all kept: bonus
        RoundTrace(drafts=[], accepted=0, next_token=7),  # nothing drafted: a plain step
        RoundTrace(drafts=[8], accepted=0, next_token=10),  # rejected at once
    ]
    assert round_tokens(trace) == [
        [(1, "accepted"), (2, "rejected"), (3, "discarded"), (9, "replaced")],
        [(4, "accepted"), (5, "accepted"), (6, "bonus")],
        [(7, "bonus")],
        [(8, "rejected"), (10, "replaced")],
    ]
    assert output_tokens(trace) == [(1, "accepted"), (9, "replaced"), (4, "accepted"), (5, "accepted"),
                                    (6, "bonus"), (7, "bonus"), (10, "replaced")]


def test_viewer_needs_a_trace(target):
    out = sd.generate(target, "Say hi.", max_new_tokens=2)
    with pytest.raises(ValueError, match="keep_trace=True"):
        TokenViewer(target, out)


@pytest.mark.slow
def test_viewer_shows_the_generation_live_and_static(target):
    prompt = "Write a Python function `is_even(n)` and then a function `is_odd(n)` that uses it."
    out = sd.generate(target, prompt, sd.NgramDrafter(), k=4, max_new_tokens=24, keep_trace=True)
    assert [t for t, _ in output_tokens(out.trace)] == out.tokens  # the viewer's output is the generation's
    viewer = TokenViewer(target, out)
    bundle = viewer._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # Jupyter: the live widget
    static = bundle["text/html"]  # the book: every round at once
    assert static.count('class="sd-round"') == len(out.trace)  # one frame per round
    assert static.count('class="sd-tok sd-') == sum(len(r.drafts) + 1 for r in out.trace)  # every token, once
    assert all(html.escape(caption) in static for _, caption in KINDS.values())  # the legend
    viewer.slider.value = 1  # stepping back shows round 1 only
    assert viewer.view.value.count('class="sd-tok sd-') == len(out.trace[0].drafts) + 1


@pytest.mark.slow
def test_k_slider_reruns_and_caches(target):
    slider = KSlider(target, "def add(a, b):\n    return a + b\n\ndef sub(a, b):", sd.NgramDrafter(),
                     ks=[1, 2, 3], max_new_tokens=12, precompute=(1,))
    assert set(slider.results) == {1}
    slider.slider.value = 3  # what a reader's drag does
    assert set(slider.results) == {1, 3}
    assert "k = 3" in slider.view.value and "position 3" in slider.view.value
    ar, spec = slider.baseline.stats, slider.results[3].stats  # plain decoding of the same prompt, run once
    assert slider.baseline.tokens == slider.results[3].tokens  # greedy: the same text at every k
    assert f"{spec.tok_per_s:.1f} tok/s" in slider.view.value
    assert f"{spec.tok_per_s / ar.tok_per_s:.2f}x</b> plain decoding ({ar.tok_per_s:.1f} tok/s)" in slider.view.value
    static = slider._repr_mimebundle_()["text/html"]
    assert "k = 1" in static and "k = 3" in static and "k = 2" not in static
    assert static.count("x</b> plain decoding") == 2  # the book's view shows the speedup of each k run
    with pytest.raises(ValueError, match="ks must be"):
        KSlider(target, "x", sd.NgramDrafter(), ks=[0, 1])
