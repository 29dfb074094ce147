"""Figures for the book and the CLI (matplotlib only).

Each function takes benchmark records (see bench.py) or training recipes and
returns a Figure, so a notebook shows it inline and the CLI saves it to a
file; `training_runs` gives the lines a chapter prints beside a learning curve.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from .models import cache_dir

# matplotlib keeps a font cache and its config under $HOME unless told otherwise:
# keep them in the library's cache, the one place it writes to (a user's own setting wins).
os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))

import matplotlib  # noqa: E402

if not matplotlib.get_backend().lower().startswith(("module://", "nbagg", "widget", "ipympl")):
    matplotlib.use("Agg")  # headless by default; notebooks keep their inline backend
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(fig, path, dpi: int = 120) -> None:
    """fig.savefig through a temporary name, then rename: an interrupted save never leaves half an image."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    os.replace(tmp, path)


def _by_method(records):
    """Chains only (trees have chain_vs_tree), one group per method and draft vocabulary."""
    groups: dict[str, list] = {}
    for r in records:
        if r.method != "ar" and r.tree is None:
            groups.setdefault(r.name, []).append(r)
    return groups


def speedup_vs_k(records, ax=None):
    """Speedup over AR against k, one line per method (AR is the line at 1)."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5, 3.5))
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="AR")
    for method, rs in _by_method(records).items():
        rs = sorted(rs, key=lambda r: r.k)
        ax.plot([r.k for r in rs], [r.speedup for r in rs], marker="o", label=method)
    ax.set(xlabel="draft tokens per round (k)", ylabel="speedup over AR", title="Throughput vs k")
    ax.legend()
    return fig


def per_position_acceptance(records, ax=None):
    """Per-position acceptance (vLLM's definition) for each (method, k)."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5, 3.5))
    for r in records:
        rates = r.stats.per_position_acceptance
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker=".", label=f"{r.name} k={r.label}")
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1.02), title="Per-position acceptance")
    ax.legend(fontsize="small")
    return fig


def time_breakdown(records, ax=None):
    """Where the time goes: prefill, drafting and verification, per (method, k)."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6, 3.5))
    labels = [f"{r.method}\nk={r.k}" for r in records]
    prefill = [r.stats.prefill_time for r in records]
    draft = [r.stats.draft_time for r in records]
    verify = [r.stats.verify_time for r in records]
    ax.bar(labels, prefill, label="prefill")
    ax.bar(labels, draft, bottom=prefill, label="draft")
    ax.bar(labels, verify, bottom=[a + b for a, b in zip(prefill, draft)], label="verify")
    ax.set(ylabel="seconds", title="Time per phase")
    ax.legend()
    return fig


def bench_figure(records):
    """The three panels side by side: what `specdec bench --plot` saves."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    speedup_vs_k(records, axes[0])
    per_position_acceptance(records, axes[1])
    time_breakdown(records, axes[2])
    fig.tight_layout()
    return fig


def forward_time_vs_rows(rows, seconds, ax=None):
    """Time of one target forward pass against the number of rows (tokens) it scores.

    Flat means the pass is paid for by reading the weights, not by the
    arithmetic on the rows: the room speculative decoding lives in.
    """
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5, 3.5))
    ms = [1000 * s for s in seconds]
    ax.plot(rows, ms, marker="o", label="measured")
    ax.plot(rows, [ms[0] * r for r in rows], ls=":", color="grey", label="if every row cost as much as one")
    ax.set(xscale="log", xlabel="rows scored in one forward pass", ylabel="milliseconds", title="Forward time vs rows")
    ax.set_xticks(rows, [str(r) for r in rows])
    ax.set_ylim(0, max(ms) * 1.5)
    ax.legend(fontsize="small")
    return fig


def distribution_check(probs, counts, labels, ax=None):
    """Target probabilities next to the frequencies of tokens a sampler produced.

    probs, counts: per-token sequences of equal length; labels: token captions.
    """
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6, 3.5))
    total = int(sum(counts))
    xs = range(len(probs))
    ax.bar([x - 0.2 for x in xs], probs, width=0.4, label="target p")
    ax.bar([x + 0.2 for x in xs], [c / total for c in counts], width=0.4, label=f"sampled ({total} draws)")
    ax.set_xticks(list(xs), labels, rotation=45, ha="right")
    ax.set(ylabel="probability", title="Speculative sampling vs the target distribution")
    ax.legend()
    fig.tight_layout()
    return fig


def tree_mask_figure(parents, labels, past: int = 0, ax=None):
    """The tree attention mask as a picture: row = a query token, column = what it may see (tree.py)."""
    import torch

    from .tree import tree_mask

    allowed = (tree_mask(parents, past, torch.float32, "cpu")[0, 0] == 0).int().numpy()  # [n+1, past+n+1]
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5.5, 4.5))
    ax.imshow(allowed, cmap="Blues", vmin=0, vmax=1.3)
    names = [f"cache {i}" for i in range(past)] + list(labels)
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("keys: what a row attends to")
    ax.set_ylabel("queries: root, then each node")
    ax.set_title("Tree attention mask (blue: visible)")
    fig.tight_layout()
    return fig


def chain_vs_tree(records, ax=None):
    """Mean acceptance length and speedup of each drafter's chains and trees, side by side."""
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7, 3.8))
    runs = [r for r in records if r.method != "ar"]
    xs = range(len(runs))
    ax.bar(xs, [r.stats.mean_acceptance_length for r in runs],
           color=["#5b8fd6" if r.tree is None else "#e08a3c" for r in runs])
    for x, r in zip(xs, runs):
        ax.text(x, r.stats.mean_acceptance_length, f"{r.speedup:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"{r.method}\n{'k=' if r.tree is None else 'tree '}{r.label}" for r in runs],
                  fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("mean acceptance length (bars); speedup (labels)")
    ax.set_title("Chains (blue) and trees (orange)")
    fig.tight_layout()
    return fig


def drafted(acc: list) -> list:
    """Per-position accuracies from the first drafted token on.

    A block drafter's (DFlash, DSpark) slot 0 holds the anchor, the token the
    target gave, which is never drafted: its accuracy is nan, so it is dropped.
    """
    return acc[1:] if acc and math.isnan(acc[0]) else acc


def learning_curves(recipes: dict, position: int = 0, ax=None, key: str = "acc"):
    """Held-out accuracy at one drafted position against training tokens read, one line per run.

    recipes: {label: a recipe.json as a dict}; its "held_out_curve" (train/loop.curve) gives the
    points. position 0 is the first drafted token, the one every round's acceptance starts with.
    key: which accuracy, "acc" (all held-out examples) or one prompt source's, e.g. "acc_templated".
    """
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(6.5, 3.8))
    for label, recipe in recipes.items():
        points = []
        for p in recipe.get("held_out_curve", []):
            acc = drafted(p.get(key, []))
            if p.get("tokens_seen") and len(acc) > position:
                points.append((p["tokens_seen"], acc[position]))
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens read")
    ax.set_ylabel(f"held-out top-1 accuracy, drafted position {position + 1}")
    ax.set_title("Acceptance vs data: the learning curve")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def training_runs(recipes: dict, positions: int = 1) -> str:
    """One line per training run: steps, tokens read, minutes, and its held-out accuracy at position 1.

    recipes: {label: a recipe.json as a dict}, as learning_curves takes them. Position 1's accuracy is
    given at the first and the last evaluation of the curve, how far the run climbed; positions > 1
    adds a line with the first `positions` drafted positions at the end, how fast later drafts fall off.
    """
    width = max(map(len, recipes), default=0)
    lines = []
    for label, recipe in recipes.items():
        curve = [drafted(p["acc"])[0] for p in recipe["held_out_curve"]]
        line = (f"{label:{width}} {recipe['steps']:>5,} steps, {recipe['tokens_seen']:>9,} tokens, "
                f"{recipe['train_minutes']:5.1f} min; position 1: {curve[0]:.2f} -> {curve[-1]:.2f}")
        if positions > 1:
            end = drafted(recipe["held_out"]["acc"])[:positions]
            line += f"\n{'':{width}} positions 1-{positions} at the end: " + " ".join(f"{a:.2f}" for a in end)
        lines.append(line)
    return "\n".join(lines)
