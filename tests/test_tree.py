"""Token trees: the mask, one-pass verification equal to path-by-path, lossless acceptance, branching drafters."""

import pytest
import torch
from conftest import MAX_NEW, learned_drafter, same_path, tiny_target
from scipy.stats import chisquare

import specdec_learn as sd
from specdec_learn.drafters import branching
from specdec_learn.drafters.base import Proposal
from specdec_learn.tree import TreeSpec, best_first, chain_parents, depths, tree_mask, tree_positions
from specdec_learn.verify import greedy_accept, rejection_accept
from specdec_learn.zoo import make_drafter

BRANCHING = branching()

#        root
#       /    \
#      0      1
#     / \      \
#    2   3      4
PARENTS = [-1, -1, 0, 0, 1]


def test_mask_lets_each_node_see_the_cache_its_ancestors_and_itself():
    allowed = tree_mask(PARENTS, past=2, dtype=torch.float32, device="cpu")[0, 0] == 0  # [6, 8]
    seen = [torch.nonzero(row).flatten().tolist() for row in allowed]
    # columns: cache 0, 1 | root 2 | nodes 0..4 at 3..7
    assert seen == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2, 3, 5], [0, 1, 2, 3, 6], [0, 1, 2, 4, 7]]
    assert tree_positions(PARENTS, past=2, device="cpu").tolist() == [[2, 3, 3, 4, 4, 4]]
    assert depths(PARENTS) == [1, 1, 2, 2, 2]


def test_a_chain_mask_is_the_causal_mask():
    allowed = tree_mask(chain_parents(4), past=3, dtype=torch.float32, device="cpu")[0, 0] == 0
    assert torch.equal(allowed, torch.ones(5, 8, dtype=torch.bool).tril(diagonal=3))


def test_bad_trees_and_specs_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="after their parents"):
        Proposal([1, 2], parents=[1, -1])
    with pytest.raises(ValueError, match="2 parents for 3"):
        Proposal([1, 2, 3], parents=[-1, 0])
    for bad in (dict(nodes=0), dict(depth=0), dict(branch=0), dict(nodes=2.5)):
        with pytest.raises(ValueError, match="TreeSpec"):
            TreeSpec(**bad)
    with pytest.raises(ValueError, match="--tree 16,4,4"):
        TreeSpec.parse("lots")
    assert TreeSpec.parse("8,3") == TreeSpec(nodes=8, depth=3)


def test_best_first_expands_the_most_probable_candidate():
    guesses = {(): [(10, 0.6), (11, 0.3)], (10,): [(20, 0.9), (21, 0.1)], (11,): [(30, 0.5)], (10, 20): [(40, 0.5)]}
    tokens, parents, scores = best_first(lambda path: guesses.get(tuple(path), []), TreeSpec(nodes=4, depth=3))
    # 10 (0.6), then 20 (0.54), 11 (0.3), 40 (0.27); 30 (0.15) and 21 (0.06) miss the budget
    assert tokens == [10, 20, 11, 40] and parents == [-1, 0, -1, 1]
    assert scores == pytest.approx([0.6, 0.54, 0.3, 0.27])


def test_greedy_walk_follows_the_targets_argmax_down_the_tree():
    drafts = [7, 8, 5, 6, 9]  # the tree above
    picks = [8, 6, 9, 2, 3, 4]  # the target's argmax after the root and after each node
    logits = torch.nn.functional.one_hot(torch.tensor(picks), 12).float()
    assert greedy_accept(drafts, logits, PARENTS) == ([1, 4], 4)  # root -> 8 (node 1) -> 9 (node 4), bonus 4
    picks[0] = 5  # nothing at the root's children holds it: corrected at once
    logits = torch.nn.functional.one_hot(torch.tensor(picks), 12).float()
    assert greedy_accept(drafts, logits, PARENTS) == ([], 5)


def test_sibling_rejection_sampling_emits_the_targets_distribution():
    """Three one-hot siblings tried in turn: the first emitted token still follows p (chi-square)."""
    vocab, n = 6, 20000
    torch.manual_seed(3)
    p = torch.rand(4, vocab).softmax(-1)  # rows: root, then the three children
    drafts, parents = [0, 2, 4], [-1, -1, -1]
    gen = torch.Generator().manual_seed(11)
    counts = torch.zeros(vocab)
    for _ in range(n):
        path, nxt = rejection_accept(drafts, None, p, gen, parents)
        counts[drafts[path[0]] if path else nxt] += 1
    assert chisquare(counts.numpy(), (p[0] * n).numpy()).pvalue > 1e-3


def test_second_level_of_a_tree_follows_the_target_too():
    vocab, n = 5, 20000
    torch.manual_seed(4)
    p = torch.rand(4, vocab).softmax(-1)
    p[0] = torch.nn.functional.one_hot(torch.tensor(1), vocab).float()  # the target always starts with token 1
    drafts, parents = [1, 3, 0], [-1, 0, 0]  # node 0 = 1; under it two siblings, 3 and 0
    gen = torch.Generator().manual_seed(5)
    counts = torch.zeros(vocab)
    for _ in range(n):
        path, nxt = rejection_accept(drafts, None, p, gen, parents)
        assert path[:1] == [0]
        counts[drafts[path[1]] if len(path) > 1 else nxt] += 1
    assert chisquare(counts.numpy(), (p[1] * n).numpy()).pvalue > 1e-3  # row 1: after node 0


@pytest.mark.slow
def test_tree_verification_equals_running_each_path_alone(target):
    ids = target.encode("Write a Python function that adds two numbers.")
    tokens = [target.tokenizer.encode(w)[0] for w in (" def", " The", " add", "(", " first")]
    state, _ = target.prefill(ids)
    rows = target.verify(state, tokens, parents=PARENTS).logits  # [6, V], one pass
    for node in range(len(tokens)):
        path, at = [], node
        while at >= 0:
            path.insert(0, tokens[at])
            at = PARENTS[at]
        alone, _ = target.prefill(ids)
        chain = target.verify(alone, path).logits[-1]  # the row after the path's last token
        torch.testing.assert_close(rows[1 + node], chain, atol=2e-4, rtol=1e-4)


@pytest.mark.slow
def test_commit_keeps_the_accepted_path_in_the_cache(target):
    ids = target.encode("Count from one to five.")
    tokens = [target.tokenizer.encode(w)[0] for w in (" One", " 1", ",", " two", " 2")]
    tree, _ = target.prefill(ids)
    target.verify(tree, tokens, parents=PARENTS)
    target.commit(tree, [tokens[1], tokens[4], 11], path=[1, 4])  # root -> node 1 -> node 4, then token 11
    chain, _ = target.prefill(ids)
    target.verify(chain, [tokens[1], tokens[4]])
    target.commit(chain, [tokens[1], tokens[4], 11])
    assert tree.ids == chain.ids and tree.cache.get_seq_length() == chain.cache.get_seq_length()
    torch.testing.assert_close(target.verify(tree, [5]).logits, target.verify(chain, [5]).logits, atol=2e-4, rtol=1e-4)


def branched(trace) -> bool:
    """Whether some round's tree gave one node two children (or the root two)."""
    return any(r.parents is not None and len(set(r.parents)) < len(r.parents) for r in trace)


# A pattern the n-gram and suffix drafters find several continuations of, so that their trees branch.
PATTERN = [5, 9, 14, 3, 27, 8, 5, 9, 14, 3, 27, 8, 20, 21, 5, 9, 14, 3, 27, 8, 12, 30, 5, 9]
SPEC = TreeSpec(nodes=6, depth=3, branch=2)
RIGHT_AT_TIMES = ("ngram", "suffix", "draft_model")  # the random-weight learned drafters seldom are


def tiny_tree_drafter(method, target):
    """A drafter of `method` for a tiny target: the n-gram and suffix drafters, a partly right draft model, or a
    random-weight drafter of a learned method."""
    from test_draft_model import NOISE, noisy_copy

    if method == "ngram":
        return sd.NgramDrafter()
    if method == "suffix":
        return sd.SuffixDrafter()
    if method == "draft_model":
        return sd.DraftModelDrafter(noisy_copy(target.model, NOISE), target)
    return learned_drafter(method, target)


@pytest.mark.parametrize("method", BRANCHING)
def test_greedy_with_a_tree_equals_plain_decoding(method):
    """Every branching drafter's trees, on a tiny target (4 layers: room for the learned drafters' taps): the output
    is AR's, token for token."""
    target = tiny_target(layers=4)
    ar = sd.generate(target, PATTERN, max_new_tokens=40)
    out = sd.generate(target, PATTERN, tiny_tree_drafter(method, target), max_new_tokens=40, tree=SPEC,
                      keep_trace=True)
    assert out.tokens == ar.tokens, f"{method} with a tree differs from AR"
    assert branched(out.trace), f"{method} never branched"
    if method in RIGHT_AT_TIMES:
        assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens


@pytest.mark.slow
@pytest.mark.parametrize("method", ["eagle3", "dflash", "dspark"])
def test_a_shipped_drafters_trees_equal_plain_decoding(target, real_prompts, ar_greedy, method):
    """fp32, the shipped learned drafters, on 4 real prompts: trained weights accept deep paths, which random ones
    on a tiny target never do (EAGLE-3 grows its tree step by step; DFlash and DSpark read it off one block)."""
    drafter, trace = make_drafter(method, target), []
    for prompt, ar in zip(same_path(real_prompts), same_path(ar_greedy)):
        out = sd.generate(target, prompt, drafter, max_new_tokens=MAX_NEW, tree=SPEC, keep_trace=True)
        assert out.tokens == ar.tokens, f"{method} with a tree differs from AR on {prompt[:40]!r}"
        trace += out.trace
    assert branched(trace), f"{method} never branched"
    assert max(len(r.path or []) for r in trace) >= 2, f"{method}: no path of two tree nodes was ever accepted"


@pytest.mark.slow
def test_trees_refuse_what_they_cannot_do(target):
    with pytest.raises(ValueError, match="cannot grow a tree"):
        sd.generate(target, "Hi", make_drafter("mtp", target), tree=TreeSpec())
    from test_sliding_window import tiny_gemma3

    sliding = sd.DraftModelDrafter(tiny_gemma3(vocab_size=target.vocab_size, hidden=16, layers=2), target)
    with pytest.raises(ValueError, match="sliding-window .* draft a chain"):
        sd.generate(target, "Hi", sliding, tree=TreeSpec())
    with pytest.raises(ValueError, match="beyond dflash's block"):
        sd.generate(target, "Hi", make_drafter("dflash", target), tree=TreeSpec(depth=99))
    with pytest.raises(ValueError, match="not both"):
        sd.generate(target, "Hi", sd.NgramDrafter(), k=3, tree=TreeSpec())
    with pytest.raises(ValueError, match="needs a drafter"):
        sd.generate(target, "Hi", tree=TreeSpec())


def test_the_vllm_backend_refuses_a_tree_and_says_why(capsys):
    from specdec_learn.cli import main

    for command in (["bench", "--methods", "eagle3", "--workload", "math", "--prompts", "1"],
                    ["generate", "--method", "eagle3", "--prompt", "Hi"]):
        assert main([*command, "--backend", "vllm", "--tree", "8,3"]) == 2
        err = capsys.readouterr().err
        assert "removed tree attention" in err and "--backend native" in err and "Traceback" not in err
