"""Every exercise in the book accepts a right answer and refuses wrong ones, without giving itself away.

The right answers here are worked out by hand (or independently of the
check), so a check that computes the wrong thing fails. The notebook side:
every exercise has an answer cell, a hidden solution and a one-line check cell
that is stored without output and holds no expected value.
"""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_learn.drafters.dspark import MarkovHead
from specdec_learn.drafters.suffix import SuffixTrie
from specdec_learn.exercises import CHECKS, Wrong, check
from specdec_learn.workloads import is_benchmark_prompt

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def tiny_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def toy_markov():
    words = ["of", "course", "no", "problem", "."]
    base = torch.tensor([[2.0, 0.0, 1.9, 0.0, 0.0], [0.0, 1.9, 0.0, 2.0, 0.0]])
    toy = MarkovHead(vocab_size=5, rank=2)
    with torch.no_grad():
        toy.markov_w1.weight.zero_()
        toy.markov_w1.weight[0] = torch.tensor([1.0, 0.0])
        toy.markov_w1.weight[2] = torch.tensor([0.0, 1.0])
        toy.markov_w2.weight.zero_()
        toy.markov_w2.weight[1, 0] = 1.0
        toy.markov_w2.weight[3, 1] = 1.0
    return dict(base=base, anchor=4, toy=toy, words=words)


class FakeTarget:
    """encode() adds 30 template tokens around one token per word."""

    def encode(self, prompt, chat=True):
        return list(range(len(prompt.split()) + (30 if chat else 0)))


MODEL = tiny_model()
EMBEDDING = 4000 * 256 / 1e6
PARAMS = EMBEDDING + (2 * (256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 512 + 2 * 256) + 256) / 1e6  # + layers, norm
HEAD = SimpleNamespace(layers=[torch.nn.Linear(10, 10, bias=False)], fc=torch.nn.Linear(20, 10, bias=False))
CANDIDATES = ["math/m001", "math/m002", "math/m005", "math/m006", "humaneval/HumanEval/0", "humaneval/HumanEval/13"]
TRAINING = [i for i in CANDIDATES if not is_benchmark_prompt(i)]
DSPARK = SimpleNamespace(config=SimpleNamespace(vocab_size=1000, markov_rank=8), markov_head=MarkovHead(1000, 8))

def toy_trie():
    words = "the cat sat on the mat . the cat ran . the cat sat on".split()
    vocab = sorted(set(words))
    trie = SuffixTrie(max_depth=6)
    trie.add([vocab.index(w) for w in words])
    return dict(trie=trie, vocab=vocab)


# exercise -> (what the chapter passes, a right answer, wrong answers)
CASES = {
    "0.1": (dict(model=MODEL), round(PARAMS, 1), [PARAMS + EMBEDDING, PARAMS * 1e6, PARAMS + 0.3]),
    "0.2": (dict(target=FakeTarget(), prompt="Write a haiku about tea."), 30, [35, 5]),
    "1.1": (dict(model=MODEL), MODEL.num_parameters() * 2 / 1e6 + 0.3, [MODEL.num_parameters() * 4 / 1e6 + 2]),
    "1.2": ({}, 2.0, [3.125, 2.5]),
    "2.1": ({}, 0.65, [0.5, 0.35, 0.60]),
    "2.2": ({}, [6 / 7, 1 / 7, 0.0], [[1.0, 0.0, 0.0], [0.5, 0.35, 0.15], [0.3, 0.05, 0.0]]),
    "3.1": ({}, [7, 1], [[5, 6], [2, 5]]),
    "3.2": ({}, 2.13, [2.91, 3.2]),
    "4.1": ({}, (18, 19), [(19, 20), (19, 19)]),
    "4.2": ({}, 1.82, [0.84, 1.85]),
    "4.3": (dict(head=HEAD, target_cost=1000, c_mtp=0.5), 0.3, [0.5, 0.1]),
    "5.1": ({}, (39, 38), [(39, 39), (40, 39), (38, 38)]),
    "5.2": ({}, 6144, [4096, 262_144]),
    "5.3": (dict(text=SimpleNamespace(num_hidden_layers=4, num_key_value_heads=1, head_dim=256)),
            4 * 2 * 256 * 4096 * 2, [4 * 256 * 4096 * 2]),
    "6.1": ({}, (2, 18, 33), [(2, 18, 34), (1, 18, 35)]),
    "6.2": ({}, [3, 6, 6, 17], [[3, 7, 8, 20]]),
    "6.3": ({}, (2.56, 5.76), [(3.05, 6.86), (2.56, 3.2)]),
    "7.1": ({}, 15, [16, 14]),
    "7.2": ({}, [2, 10, 18, 26, 34], [[1, 9, 17, 25, 33], [0, 8, 16, 24, 32]]),
    "7.3": ({}, 4, [3, 5]),
    "8.1": ({}, 2, [4, 3]),
    "8.2": (toy_markov(), ["no", "problem"], [["of", "course"], ["no", "course"]]),
    "8.3": (dict(model=DSPARK), (2 * 1000 * 8, 1000 * 1000), [(1000 * 8, 1000 * 1000), (16000, 1000)]),
    "9.1": ({}, 2.31, [1.31, 2.18, 2.5]),
    "9.2": (dict(lengths=[1.5, 1.7, 2.0, 2.6], ks=[1, 2, 4, 8]), 4, [2, 8, 3]),
    "10.1": ({}, {"method": "mtp", "num_speculative_tokens": 3},
             [{"method": "mtp", "num_speculative_tokens": 3, "model": "Qwen/Qwen3.5-0.8B"},
              {"method": "mtp", "num_speculative_tokens": 4}, "mtp"]),
    "10.2": ({}, 2.5, [2.615, 1.5]),
    "10.3": ({}, 4, [8, 10]),
    "11.1": ({}, 0.41, [1 / 3, 1.0]),
    "11.2": (dict(acc=[0.5, 0.4, 0.3]), 1.76, [0.76, 2.2]),
    "11.3": (dict(candidates=CANDIDATES), TRAINING, [CANDIDATES, TRAINING[:-1]]),
    "12.1": ({}, 21.14, [37.54, 16.4]),
    "12.2": ({}, (15, 7), [(16, 7), (15, 6)]),
    "13.1": (toy_trie(), ["the", "mat"], [["the", "mat", "."], ["the", "cat", "sat"], ["mat"]]),
    "13.2": ({}, 684, [960, 820, 24]),
    "14.1": ({}, [1, 4], [[0, 2], [1], [1, 4, 5]]),
    "14.2": ({}, 13, [3, 15, 12]),
    "12.3": ({}, {"mtp", "gemma4_mtp", "dflash", "dspark"}, [{"mtp", "dflash", "dspark"}, {"ngram", "mtp"}]),
}


def test_every_exercise_has_cases():
    assert set(CASES) == set(CHECKS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_right_answer_passes(name, capsys):
    given, right, _ = CASES[name]
    assert check(name, right, **given).startswith("Correct")
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("name", sorted(CASES))
def test_wrong_answers_fail_with_a_hint(name):
    given, _, wrongs = CASES[name]
    for wrong in wrongs:
        with pytest.raises(Wrong) as err:
            check(name, wrong, **given)
        assert len(str(err.value)) > 10, f"exercise {name}: a hint, not a bare failure, for {wrong!r}"


@pytest.mark.parametrize("name,wrong,says", [
    ("9.1", 1.306, "own token"),           # 1 + a + ... without the 1
    ("9.1", 2.176, "alpha..0 to"),         # the sum stopped at a^(k-1)
    ("2.1", 0.35, "REJECTION"),            # the total variation distance
    ("0.1", PARAMS + EMBEDDING, "twice"),     # the tied embedding counted again
    ("10.2", 84 / 52 + 1, "total since"),  # the engine's totals, not the call's
    ("9.2", 2, "ADDED DRAFT"),             # the raw gain, not per added draft
    ("13.1", ["the", "mat", "."], "at most max_spec_factor"),  # the spec-factor cap ignored
])
def test_a_known_mistake_gets_its_own_diagnosis(name, wrong, says):
    given = CASES[name][0]
    with pytest.raises(Wrong, match=says):
        check(name, wrong, **given)


def test_no_answer_and_unknown_exercises_are_told_apart():
    with pytest.raises(Wrong, match="put your answer"):
        check("2.1", None)
    with pytest.raises(KeyError, match="No exercise '99.1'"):
        check("99.1", 1)


def test_jupyter_shows_the_hint_not_a_traceback():
    assert Wrong("count both keys and values.")._render_traceback_() == ["Not yet: count both keys and values."]


# --- the notebooks ---------------------------------------------------------------------

CHECK_CELL = re.compile(r'^check\("(\d+\.\d+)", answer(, \w+=[\w.\[\]"]+)*\)$')


def exercises_in(path):
    """(exercise id, [the code cells after its statement]) for each exercise of a chapter."""
    cells = json.loads(path.read_text())["cells"]
    found = []
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        for name in re.findall(r"\*\*Exercise (\d+\.\d+)\.\*\*", text) if cell["cell_type"] == "markdown" else []:
            found.append((name, cells[i + 1:i + 4]))
    return found


CHAPTERS = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))


def test_the_book_has_exactly_the_checked_exercises():
    names = [name for path in CHAPTERS for name, _ in exercises_in(path)]
    assert len(names) == len(set(names))
    assert set(names) == set(CHECKS)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_check_cells_reveal_nothing(path):
    for name, (answer, solution, check_cell) in exercises_in(path):
        assert "answer = None" in "".join(answer["source"]), f"{name}: the cell after the statement is the reader's"
        assert "hide-input" in solution["metadata"].get("tags", []), f"{name}: the solution cell is hidden"
        source = "".join(check_cell["source"]).strip()
        match = CHECK_CELL.match(source)
        assert match and match.group(1) == name, f"{name}: the check cell is one check({name!r}, answer, ...) call"
        assert not check_cell.get("outputs"), f"{name}: the check cell is stored without output"
        assert "nbval-ignore-output" in check_cell["metadata"].get("tags", []), name
