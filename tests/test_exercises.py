"""Every exercise in the book accepts its solution and refuses wrong answers, without giving itself away.

The solutions are book/solutions.py's (the instructor edition's), called with
what the chapter has; the planted wrong answers are the mistakes readers
make, and the known ones must get their own hint. Each coding lab is run
with its reference solution (correct) and with planted bugs (the named hint).
The notebook side: every exercise is a reader's cell and a one-line check
stored without output; no chapter holds a solution; running a reader's cell
and its check as they stand answers nothing.
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from specdec_learn.exercises import CHECKS, GIVEN, Wrong, check, given, shipped_drafter, smollm2
from specdec_learn.labs import earliest_match, first_child_walk  # mistakes labs.py diagnoses, planted as bugs
from specdec_learn.limits import matmul_weights

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
LABS = {"2.3": "speculative_sample", "3.3": "ngram_propose", "5.4": "centroid_logits", "6.4": "eagle3_first_draft",
        "8.4": "survival_gate", "13.3": "longest_match", "14.3": "accept_walk", "14.4": "tree_visibility"}


def load_solutions():
    spec = importlib.util.spec_from_file_location("solutions", ROOT / "book" / "solutions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOLUTIONS = load_solutions()


def solution_of(name):
    return getattr(SOLUTIONS, LABS[name] if name in LABS else "solution_" + name.replace(".", "_"))


def chapter_variables():
    """What the chapters hold under the names the solutions take."""
    target, head = smollm2(), shipped_drafter("mtp").head
    return dict(target=target, prompt=given("0.2"), head=head,
                target_cost=matmul_weights(target.decoder.layers, target.lm_head),
                text=shipped_drafter("gemma4_mtp").assistant.config.get_text_config(),
                model=shipped_drafter("dspark").model,
                made=json.loads((ROOT / "specdec_learn/checkpoints/eagle3-smollm2-135m/recipe.json").read_text()))


def solved(name, variables):
    import inspect

    fn = solution_of(name)
    if name in LABS:
        return fn
    return fn(**{arg: variables[arg] for arg in inspect.signature(fn).parameters})


# exercise -> wrong answers (the first ones are the mistakes readers make)
WRONGS = {
    "0.1": [0.174, 0.348, 21.0, 0.5], "0.2": [30, 23, 37], "1.1": [134.5, 269.0, 538.1],
    "1.2": [3.125, 2.5], "2.1": [0.5, 0.35, 0.60],
    "2.2": [[1.0, 0.0, 0.0], [0.5, 0.35, 0.15], [0.3, 0.05, 0.0]], "3.1": [[5, 6], [2, 5]], "3.2": [2.91, 3.2],
    "4.1": [(19, 20), (19, 19)], "4.2": [0.84, 1.85], "4.3": [0.5, 0.0], "5.1": [(39, 39), (40, 39), (38, 38)],
    "5.2": [4096, 262_144], "5.3": [1, 0], "6.1": [(2, 18, 34), (1, 18, 35)], "6.2": [[3, 7, 8, 20]],
    "6.3": [(3.05, 6.86), (2.56, 3.2)], "7.1": [10, 8], "7.2": [[1, 9, 17, 25, 33], [0, 8, 16, 24, 32]],
    "7.3": [3, 5], "8.1": [4, 3], "8.2": [["of", "course"], ["no", "course"]], "8.3": [(1, 1), (2, 2)],
    "9.1": [1.31, 2.18, 2.5], "9.2": [4, 2, 3],
    "10.1": [{"method": "mtp", "num_speculative_tokens": 3, "model": "Qwen/Qwen3.5-0.8B"},
             {"method": "mtp", "num_speculative_tokens": 4}, "mtp"],
    "10.2": [2.615, 1.5], "10.3": [8, 10], "11.1": [1 / 3, 1.0], "11.2": [0.76, 2.2],
    "11.3": [[], GIVEN["11.3"], "math/m001"], "12.1": [37.54, 16.4], "12.2": [(8, 4), (7, 3), (15, 7)],
    "12.3": [1.83, 5.65, 4.0],
    "13.1": [["the", "mat", "."], ["the", "cat", "sat"], ["mat"]],
    "13.2": [960, 820, 24], "14.1": [[0, 2], [1], [1, 4, 5]], "14.2": [3, 15, 12],
    "15.1": ["ar", "fastest", 3], "15.2": [0, -1.0, "ngram"],
}


@pytest.fixture(scope="module")
def variables():
    return chapter_variables()


def test_every_exercise_has_a_solution_and_wrong_answers():
    assert set(WRONGS) | set(LABS) == set(CHECKS)
    for name in CHECKS:
        assert callable(solution_of(name)), name


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_solution_passes(name, variables, capsys):
    assert check(name, solved(name, variables)).startswith("Correct")
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("name", sorted(WRONGS))
def test_wrong_answers_fail_with_a_hint(name):
    for wrong in WRONGS[name]:
        with pytest.raises(Wrong) as err:
            check(name, wrong)
        assert len(str(err.value)) > 10, f"exercise {name}: a hint, not a bare failure, for {wrong!r}"


def test_hand_worked_answers_pass():
    """Answers worked out by hand, not by the code the checks use."""
    for name, right in [("2.1", 0.65), ("2.2", [6 / 7, 1 / 7, 0.0]), ("3.1", [7, 1]), ("5.1", (39, 38)),
                        ("6.2", [3, 6, 6, 17]), ("8.1", 2), ("8.2", ["no", "problem"]), ("9.2", 8),
                        ("12.2", (7, 4)), ("12.3", 4.48), ("13.1", ["the", "mat"]), ("13.2", 684), ("14.1", [1, 4]),
                        ("14.2", 13), ("0.2", 24), ("1.1", 134.5 / 2), ("7.1", 9)]:
        assert check(name, right).startswith("Correct"), name


@pytest.mark.parametrize("name,wrong,says", [
    ("9.1", 1.306, "own token"),           # 1 + a + ... without the 1
    ("9.1", 2.176, "alpha..0 to"),         # the sum stopped at a^(k-1)
    ("2.1", 0.35, "REJECTION"),            # the total variation distance
    ("0.1", 0.174, "count it once"),       # the tied output head counted as a second matrix
    ("0.2", 30, "before AND after"),       # every template token, not those before the message
    ("1.1", 134.5, "one byte"),            # 8 bits a weight, not 4
    ("7.1", 10, "anchor"),                 # the block size, anchor slot included
    ("8.3", (2 * 49152 * 32, 49152**2), "at rank 16"),  # the shipped rank
    ("10.2", 84 / 52 + 1, "total since"),  # the engine's totals, not the call's
    ("9.2", 4, "ADDED DRAFT"),             # the raw gain, not per added draft
    ("12.3", 1.83, "ONE"),                 # a block pass counted k times
    ("13.1", ["the", "mat", "."], "at most max_spec_factor"),  # the spec-factor cap ignored
])
def test_a_known_mistake_gets_its_own_diagnosis(name, wrong, says):
    with pytest.raises(Wrong, match=says):
        check(name, wrong)


def test_reading_the_reference_the_wrong_way_round_is_named():
    """15.2's inverse ratio: the figures come from the committed reference run, so the mistake is computed too."""
    right = SOLUTIONS.solution_15_2()
    with pytest.raises(Wrong, match="upside down"):
        check("15.2", 1 / right)


def test_an_unanswered_exercise_says_so_and_raises_nothing(capsys):
    assert check("2.1", None).startswith("Not answered yet")

    def stub(*args):
        raise NotImplementedError

    assert check("3.3", stub).startswith("Not answered yet")
    assert capsys.readouterr().out.count("Not answered yet") == 2
    with pytest.raises(KeyError, match="No exercise '99.1'"):
        check("99.1", 1)


def test_checks_take_nothing_from_the_reader_but_the_answer():
    with pytest.raises(TypeError):
        check("11.3", [], candidates=[])  # once a way to make any answer "Correct"


def test_given_hands_out_a_copy():
    given("11.3").clear()
    assert GIVEN["11.3"]


def test_jupyter_shows_the_hint_not_a_traceback():
    assert Wrong("count both keys and values.")._render_traceback_() == ["Not yet: count both keys and values."]


# --- the labs: planted bugs ---------------------------------------------------------------


def resample_from_p(p, q, x, generator):
    if torch.rand((), generator=generator, dtype=torch.float64) * q[x] <= p[x]:
        return x
    return int(torch.multinomial(p, 1, generator=generator))


def keep_every_draft(p, q, x, generator):
    return x


def dense_logits(d, centroids, token_ordering, lm_head, top_k):
    return lm_head @ d


def contiguous_groups(d, centroids, token_ordering, lm_head, top_k):
    return SOLUTIONS.centroid_logits(d, centroids, torch.arange(len(token_ordering)), lm_head, top_k)


def draft_vocabulary_id(model, taps, token):
    target_id = SOLUTIONS.eagle3_first_draft(model, taps, token)
    return int((model.draft_to_target == target_id).nonzero()[0])


def each_confidence(confidence, threshold):
    return int((confidence >= threshold).sum())


def strictly_above(confidence, threshold):
    return int((torch.cumprod(confidence.double(), 0) > threshold).sum())


def any_seen_suffix(trie, ids, min_match):
    for n in range(min(trie.max_depth // 2, len(ids)), min_match - 1, -1):
        if trie.find(ids[-n:]) is not None:
            return n
    return 0


def one_step_walk(drafts, parents, picks):
    path, nxt = SOLUTIONS.accept_walk(drafts, parents, picks)
    return (path[:1], picks[path[0] + 1]) if len(path) > 1 else (path, nxt)


def causal_mask(parents, past):
    n = len(parents)
    allowed = torch.zeros(n + 1, past + n + 1, dtype=torch.bool)
    allowed[:, :past + 1] = True
    for row in range(1, n + 1):
        allowed[row, past + 1:past + 1 + row] = True  # every node drafted before, and itself
    return allowed


@pytest.mark.parametrize("name,bug,says", [
    ("2.3", resample_from_p, "counts the mass already accepted twice"),
    ("2.3", keep_every_draft, "every draft is kept"),
    ("3.3", earliest_match, "MOST RECENT"),
    ("5.4", dense_logits, "every token got a score"),
    ("5.4", contiguous_groups, "wrong tokens"),
    ("6.4", draft_vocabulary_id, "DRAFT vocabulary"),
    ("8.4", each_confidence, "running product"),
    ("8.4", strictly_above, ">="),
    ("13.3", any_seen_suffix, "must have children"),
    ("14.3", first_child_walk, "whichever rank"),
    ("14.3", one_step_walk, "goes on from THAT node|whichever rank"),  # the first case may fit both
    ("14.4", causal_mask, "not a causal mask"),
])
def test_a_planted_bug_fails_with_its_hint(name, bug, says):
    with pytest.raises(Wrong, match="|".join(re.escape(hint) for hint in says.split("|"))):
        check(name, bug)


def test_a_lab_that_raises_gets_a_hint_not_a_traceback():
    def broken(*args):
        return [][0]

    with pytest.raises(Wrong, match="IndexError"):
        check("14.3", broken)


# --- the notebooks ---------------------------------------------------------------------

CHECK_CELL = re.compile(r'^check\("(\d+\.\d+)", (\w+)\)$')
CHAPTERS = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))


def exercises_in(path):
    """(exercise id, the reader's cell, the check cell) for each exercise of a chapter."""
    cells = json.loads(path.read_text())["cells"]
    found = []
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        for name in re.findall(r"\*\*Exercise (\d+\.\d+)\.\*\*", text) if cell["cell_type"] == "markdown" else []:
            found.append((name, cells[i + 1], cells[i + 2]))
    return found


def test_the_book_has_exactly_the_checked_exercises():
    names = [name for path in CHAPTERS for name, _, _ in exercises_in(path)]
    assert len(names) == len(set(names))
    assert set(names) == set(CHECKS)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_check_cells_reveal_nothing(path):
    for name, reader, check_cell in exercises_in(path):
        source = "".join(check_cell["source"]).strip()
        match = CHECK_CELL.match(source)
        assert match and match.group(1) == name, f"{name}: the check cell is one check({name!r}, answer) call"
        assert match.group(2) == LABS.get(name, "answer"), f"{name}: a lab checks the function the reader writes"
        assert not check_cell.get("outputs"), f"{name}: the check cell is stored without output"
        assert "nbval-ignore-output" in check_cell["metadata"].get("tags", []), name


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_holds_a_solution(path):
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        text = "".join(cell["source"])
        assert "# Solution" not in text and "if answer is None" not in text, f"{path.name}: a solution cell"
        assert "hide-input" not in cell["metadata"].get("tags", []), f"{path.name}: a hidden cell (a solution?)"
    for name, reader, _ in exercises_in(path):
        code = "".join(reader["source"])
        if name in LABS:
            assert f"def {LABS[name]}(" in code and code.rstrip().endswith("raise NotImplementedError  # your code here")
        else:
            assert re.search(r"^answer = None  # your answer", code, flags=re.M), f"{name}: the reader's cell"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_running_a_chapter_answers_nothing(path, capsys):
    """Each reader's cell and its check, run as stored, leave the exercise unanswered (and fail nothing)."""
    for name, reader, check_cell in exercises_in(path):
        namespace = {"check": check, "given": given}
        exec("".join(reader["source"]), namespace)
        exec("".join(check_cell["source"]), namespace)
        assert capsys.readouterr().out.splitlines()[-1].startswith("Not answered yet"), name


def test_the_chapters_show_the_data_the_checks_use():
    """The toy data the chapters build by hand is the data the checks build theirs from."""
    text = {p.stem[:2]: p.read_text() for p in CHAPTERS}
    assert json.dumps(f'prompt = "{GIVEN["0.2"]}"')[1:-1] in text["00"]
    assert GIVEN["13.1"] in text["13"]
    toy = GIVEN["8.2"]
    assert json.dumps(f"words = {toy['words']}".replace("'", '"'))[1:-1] in text["08"]
    for row in toy["base"]:
        assert str(row) in text["08"], row


def test_the_instructor_edition_solves_every_exercise():
    """book/build.py --instructor puts a solution after every exercise and in place of every lab's stub."""
    import nbformat

    spec = importlib.util.spec_from_file_location("build", ROOT / "book" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        assert build.solution_cells(nb) == len(exercises_in(path)), path.name
        solutions = [c.source for c in nb.cells if c.source.startswith("# Solution (instructor edition)")]
        assert len(solutions) == len(exercises_in(path))
        assert not [s for s in solutions if "NotImplementedError" in s], path.name
