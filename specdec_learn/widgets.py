"""Watching speculation happen, token by token (ipywidgets for the book).

Two views:

* `TokenViewer`: one generation, round by round. Each round the drafter
  proposed some tokens; the target kept a prefix (accepted, green), turned
  down the first one after it (rejected, red, struck through), never looked at
  the rest (discarded, grey), and wrote one token of its own: the *replacement*
  for the rejected draft (blue) or, when every draft survived, the *bonus*
  token (yellow). A slider steps through the rounds.
* `KSlider`: pick k, re-run a short generation, and watch the per-position
  acceptance bars and the mean acceptance length change.

A built book has no Python kernel behind it, so a live widget cannot work
there. Each view therefore displays as two things at once: the live widget
(which Jupyter shows) and a static HTML rendering of the same data (which the
book shows, see book/_config.yml). `static_html()` gives the latter directly.

Everything is computed from `generate(..., keep_trace=True)`: the library's
own loop, nothing re-implemented here.
"""

from __future__ import annotations

import html

from .decode import Generation, generate
from .drafters.base import Drafter
from .sampling import GREEDY, Sampling
from .target import Target

# kind of token -> (background colour, caption in the legend)
KINDS = {
    "accepted": ("#c7ecc7", "draft accepted"),
    "rejected": ("#f8c4c4", "draft rejected"),
    "discarded": ("#e4e4e4", "draft never checked"),
    "replaced": ("#c4dcf8", "target's token (replaces a rejected draft)"),
    "bonus": ("#fbeeaa", "target's token (bonus, or plain decoding)"),
}


def round_tokens(trace) -> list[list[tuple[int, str]]]:
    """Each round of a trace as [(token id, kind), ...] in the order the loop saw them.

    Round with drafts d1..dk of which n were accepted: d1..dn "accepted",
    d(n+1) "rejected", d(n+2)..dk "discarded", then the target's own token,
    "replaced" when a draft was rejected, else "bonus". A tree round shows its
    accepted path, then the children of the node where the walk stopped
    (rejected), then every other node (discarded).
    """
    rounds = []
    for r in trace:
        if getattr(r, "parents", None) is not None:
            rounds.append(tree_round_tokens(r))
            continue
        row = [(t, "accepted") for t in r.drafts[: r.accepted]]
        if r.accepted < len(r.drafts):
            row.append((r.drafts[r.accepted], "rejected"))
            row += [(t, "discarded") for t in r.drafts[r.accepted + 1 :]]
        row.append((r.next_token, "replaced" if r.accepted < len(r.drafts) else "bonus"))
        rounds.append(row)
    return rounds


def tree_round_tokens(r) -> list[tuple[int, str]]:
    """A tree round as [(token id, kind)]: the path, the stop node's children, the other branches."""
    stop = r.path[-1] if r.path else -1
    tried = [i for i, p in enumerate(r.parents) if p == stop]
    row = [(r.drafts[i], "accepted") for i in r.path] + [(r.drafts[i], "rejected") for i in tried]
    row += [(t, "discarded") for i, t in enumerate(r.drafts) if i not in r.path and i not in tried]
    return row + [(r.next_token, "replaced" if tried else "bonus")]


def output_tokens(trace) -> list[tuple[int, str]]:
    """The committed output as [(token id, kind)]: which tokens came from the drafter, which from the target."""
    return [(t, kind) for row in round_tokens(trace) for t, kind in row if kind in ("accepted", "replaced", "bonus")]


def _span(target: Target, token: int, kind: str) -> str:
    colour = KINDS[kind][0]
    strike = "text-decoration:line-through;" if kind == "rejected" else ""
    return (
        f'<span class="sd-tok sd-{kind}" title="{kind} (id {token})" style="background:{colour};{strike}'
        f'padding:1px 2px;margin:1px;border-radius:3px;font-family:monospace;white-space:pre">'
        f"{html.escape(target.pieces([token])[0])}</span>"  # whitespace made visible (Target.pieces)
    )


def legend_html() -> str:
    items = "".join(
        f'<span style="background:{c};padding:1px 6px;margin-right:8px;border-radius:3px">{html.escape(caption)}</span>'
        for c, caption in KINDS.values()
    )
    return f'<div class="sd-legend" style="margin:4px 0;font-size:90%">{items}</div>'


def _stats_line(gen: Generation) -> str:
    s = gen.stats
    return (
        f"{s.num_output_tokens} tokens in {s.num_rounds} target forward passes; "
        f"mean acceptance length {s.mean_acceptance_length:.2f}"
    )


class _LiveAndStatic:
    """Displays as the live widget in Jupyter and as static HTML in the built book."""

    widget = None

    def static_html(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)  # text/plain + the widget view
        bundle["text/html"] = self.static_html()
        return bundle


class TokenViewer(_LiveAndStatic):
    """Step through one generation round by round; see the module docstring for the colours."""

    def __init__(self, target: Target, generation: Generation, max_rounds: int | None = None):
        if not generation.trace:
            raise ValueError("This generation has no trace: call generate(..., keep_trace=True).")
        import ipywidgets as W

        self.target, self.gen = target, generation
        self.rounds = round_tokens(generation.trace)
        self.max_rounds = max_rounds  # the static view shows at most this many rounds
        self.slider = W.IntSlider(
            value=len(self.rounds), min=1, max=len(self.rounds), description="round", continuous_update=True
        )
        self.view = W.HTML(self._round_html(len(self.rounds)))
        self.slider.observe(lambda change: setattr(self.view, "value", self._round_html(change["new"])), names="value")
        self.widget = W.VBox([W.HTML(legend_html()), self.slider, self.view])

    def _round_html(self, upto: int) -> str:
        """The output after `upto` rounds, and what happened in round `upto`."""
        done = [(t, kind) for row in self.rounds[: upto - 1] for t, kind in row if kind in ("accepted", "replaced", "bonus")]
        text = "".join(_span(self.target, t, kind) for t, kind in done)
        current = "".join(_span(self.target, t, kind) for t, kind in self.rounds[upto - 1])
        r = self.gen.trace[upto - 1]
        return (
            f'<div style="line-height:1.9">{text}<span style="border:2px solid #555;border-radius:4px;'
            f'padding:1px">{current}</span></div>'
            f'<div style="font-size:90%;color:#444">round {upto}: {len(r.drafts)} drafted, {r.accepted} accepted, '
            f"+1 from the target</div>"
        )

    def static_html(self) -> str:
        """Every round at once, in reading order: one framed group of tokens per round."""
        rows = self.rounds if self.max_rounds is None else self.rounds[: self.max_rounds]
        groups = "".join(
            f'<span class="sd-round" title="round {i}" style="display:inline-block;border:1px solid #bbb;'
            f'border-radius:4px;padding:0 2px;margin:2px 1px">{"".join(_span(self.target, t, kind) for t, kind in row)}'
            "</span>"
            for i, row in enumerate(rows, 1)
        )
        more = "" if len(rows) == len(self.rounds) else f" ... and {len(self.rounds) - len(rows)} more rounds."
        return (
            f'<div class="sd-token-viewer">{legend_html()}<div style="line-height:2.1">{groups}{more}</div>'
            f"<p>Each frame is one round (one target forward pass). {html.escape(_stats_line(self.gen))}.</p></div>"
        )


def acceptance_bars_html(gen: Generation, k: int, baseline: Generation | None = None) -> str:
    """Per-position acceptance as horizontal bars, plus the headline numbers.

    With `baseline` (plain decoding of the same prompt) the headline leads with
    throughput and the speedup: the number speculation is for.
    """
    s = gen.stats
    rates = s.per_position_acceptance + [0.0] * (k - len(s.per_position_acceptance))
    bars = "".join(
        f'<div style="display:flex;align-items:center;margin:2px 0"><span style="width:5em">position {i}</span>'
        f'<span style="display:inline-block;height:14px;width:{300 * rate:.0f}px;background:#5b8fd6"></span>'
        f'<span style="margin-left:6px">{rate:.2f}</span></div>'
        for i, rate in enumerate(rates, 1)
    )
    speed = ""
    if baseline is not None:
        ar = baseline.stats.tok_per_s
        speed = (f"{s.tok_per_s:.1f} tok/s, <b>{s.tok_per_s / ar:.2f}x</b> plain decoding "
                 f"({ar:.1f} tok/s); ")
    return (
        f'<div class="sd-acceptance"><b>k = {k}</b>: {speed}mean acceptance length {s.mean_acceptance_length:.2f}, '
        f"{s.num_output_tokens} tokens in {s.num_rounds} target passes{bars}</div>"
    )


class KSlider(_LiveAndStatic):
    """Choose k and re-run a short generation: tok/s and speedup over plain decoding, and per-position acceptance.

    Plain decoding of the same prompt runs once first (after a warm-up run), so
    every k is compared with it on the same machine; one short run is noisy,
    which chapter 9's benchmark is for. Results are cached per k, so moving the
    slider back is instant. The static view (for the book) lists every k run
    so far; `precompute` runs some up front.
    """

    def __init__(
        self,
        target: Target,
        prompt: str,
        drafter: Drafter,
        ks=range(1, 9),
        max_new_tokens: int = 48,
        sampling: Sampling = GREEDY,
        precompute=(1, 3, 5),
    ):
        import ipywidgets as W

        ks = list(ks)
        if not ks or min(ks) < 1:
            raise ValueError(f"ks must be draft lengths >= 1, got {ks}.")
        self.target, self.prompt, self.drafter = target, prompt, drafter
        self.max_new_tokens, self.sampling = max_new_tokens, sampling
        self.results: dict[int, Generation] = {}
        self.baseline = self._generate(None, 0)  # a warm-up: the first call pays for one-off set-up
        self.baseline = self._generate(None, 0)
        for k in precompute:
            self.run(k)
        first = precompute[0] if precompute else ks[0]
        self.slider = W.SelectionSlider(options=ks, value=first, description="k", continuous_update=False)
        self.view = W.HTML(acceptance_bars_html(self.run(first), first, self.baseline))
        self.slider.observe(self._changed, names="value")
        self.widget = W.VBox([self.slider, self.view])

    def run(self, k: int) -> Generation:
        """The generation at draft length k (cached)."""
        if k not in self.results:
            self.results[k] = self._generate(self.drafter, k)
        return self.results[k]

    def _generate(self, drafter: Drafter | None, k: int) -> Generation:
        return generate(self.target, self.prompt, drafter, k=k, max_new_tokens=self.max_new_tokens,
                        sampling=self.sampling)

    def _changed(self, change) -> None:
        k = change["new"]
        self.view.value = "<i>running ...</i>"
        self.view.value = acceptance_bars_html(self.run(k), k, self.baseline)

    def static_html(self) -> str:
        return "".join(acceptance_bars_html(self.results[k], k, self.baseline) for k in sorted(self.results))
