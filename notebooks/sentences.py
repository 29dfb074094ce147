"""The book's sentences about measured results, computed from the committed JSON.

The chapters state what a run measured in words, and the words must follow
the numbers: a sentence that says "faster" beside a ratio below 1 is a bug
(tests/test_prose.py looks for them). So the sentences the chapters share are
made here, from the results the library reads back (`bench.read_reference`,
`bench.read_results`), and a chapter adds only its own conclusion.

This module is the book's, not the library's: it sits beside the chapters,
which import it as `from sentences import ...` (a notebook's folder is on its
path in JupyterLab, nbval and notebooks/execute.py).
"""

from __future__ import annotations

NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}  # prose spells these


def compared(reference: dict, who: str, method: str, k: int) -> str:
    """What the reference run measured for one method at k, on every workload in `reference` ({name: Results})."""
    said = []
    for workload, results in reference.items():
        r = results.get(method, k)
        pace = "faster" if r["speedup"] > 1 else "slower"
        said.append(f"on {workload} {r['mean_acceptance_length']:.2f} tokens a round, "
                    f"{r['speedup']:.2f}x plain decoding ({pace})")
    return f"{who} at $k = {k}$: " + "; ".join(said)


def in_the_reference_run(reference: dict, rows: list[tuple[str, str, int]]) -> str:
    """'In the book's reference run (its size, greedy, its machine), ' and each (who, method, k) row `compared`.

    `reference`: {workload: Results} of its greedy runs, which share their size and machine.
    """
    run = next(iter(reference.values()))
    size = f"{run.config['num_prompts']} prompts x {run.config['max_new_tokens']} new tokens"
    machine = run.label.split("), ", 1)[1]
    return (f"In the book's reference run ({size} per workload, greedy, {machine}), "
            + "; ".join(compared(reference, *row) for row in rows))


def cost_sentence(results, method: str, k: int, who: str) -> str:
    """A drafter's measured acceptance, speed and costs in one sentence (chapters 4, 5, 7), from a Results."""
    m = results.get(method, k)
    return (f"Measured side by side with plain decoding ({results.label}; "
            f"`benchmarks/results/{results.path.name}`), {who}'s mean acceptance length at $k = {k}$ is "
            f"{m['mean_acceptance_length']:.2f} and it runs at {m['speedup']:.2f}x plain decoding: each drafted "
            f"token costs $c = {m['draft_cost']:.2f}$ of a plain step and the verify pass over "
            f"{NUMBERS.get(k + 1, k + 1)} rows {m['verify_cost']:.2f} plain steps.")
