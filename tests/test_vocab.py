"""A reduced draft vocabulary: the cut head scores what the full one does, and decoding stays lossless."""

from types import SimpleNamespace

import pytest
import torch
from conftest import MAX_NEW
from scipy.stats import chisquare
from test_verify import _first_token_histogram

import specdec_learn as sd
from specdec_learn.bench import bench
from specdec_learn.sampling import Sampling, probabilities
from specdec_learn.train.corpus import corpus_vocabulary
from specdec_learn.vocab import ReducedHead, choose_draft_vocab, coverage
from specdec_learn.workloads import load_workload
from specdec_learn.zoo import REDUCIBLE, make_drafter


def example(ids, mask):
    return SimpleNamespace(input_ids=ids, loss_mask=mask)


def test_the_draft_vocabulary_counts_answer_tokens_only_and_keeps_eos():
    data = [example([9, 9, 9, 1, 1, 2, 3], [False, False, False, True, True, True, True]),
            example([9, 1, 3, 3], [False, True, True, True])]  # answers: 1 x3, 3 x3, 2 x1; 9 is prompt only
    assert choose_draft_vocab(data, 2, 10).tolist() == [1, 3]
    assert choose_draft_vocab(data, 2, 10, always=(7,)).tolist() == [1, 7]  # EOS first, then the most frequent
    assert choose_draft_vocab(data, 5, 10).tolist() == [0, 1, 2, 3, 4]  # 3 seen, then the lowest unused ids
    assert coverage(data, [1, 3]) == pytest.approx(6 / 7)
    with pytest.raises(ValueError, match="1..10"):
        choose_draft_vocab(data, 0, 10)


def test_reduced_head_scores_its_rows_and_nothing_else():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    ids = [3, 7, 8, 20, 49]
    cut = ReducedHead(head, ids)
    x = torch.randn(4, 16)
    full, reduced = head(x), cut(x)  # [4, 50] each
    torch.testing.assert_close(reduced[:, ids], full[:, ids])
    outside = torch.ones(50, dtype=torch.bool)
    outside[ids] = False
    assert torch.isinf(reduced[:, outside]).all() and cut.draft_vocab_size == 5
    with pytest.raises(ValueError, match="0..49"):
        ReducedHead(head, [50])


def test_rejection_sampling_with_a_cut_draft_distribution_is_still_exact():
    """q is zero outside the draft vocabulary (what a ReducedHead gives): the output still follows p."""
    vocab, n = 8, 20000
    torch.manual_seed(2)
    p = (torch.rand(3, vocab) ** 2).softmax(-1)
    logits = torch.randn(2, vocab)
    logits[:, [0, 5, 6]] = float("-inf")  # tokens 0, 5, 6 cannot be drafted
    q = probabilities(logits, Sampling(temperature=1.0))

    def drafts_fn(gen):
        return [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)], q

    counts = _first_token_histogram(p, q, drafts_fn, n, vocab)
    assert chisquare(counts.numpy(), (p[0] * n).numpy()).pvalue > 1e-3


def test_the_corpus_vocabulary_is_sorted_unique_and_holds_eos(target):
    ids = corpus_vocabulary(target.name, 4096, target.vocab_size, tuple(sorted(target.eos_ids)))
    assert len(ids) == 4096 and list(ids) == sorted(set(ids)) and target.eos_ids <= set(ids)


# A code prompt on which every reducible drafter keeps many drafts, and the one that stops at EOS (conftest).
VOCAB_PROMPTS = (2, 9)


@pytest.mark.slow
@pytest.mark.parametrize("method", REDUCIBLE)
def test_greedy_with_a_reduced_vocabulary_equals_plain_decoding(target_fp32, real_prompts, ar_greedy_fp32, method):
    """fp32: a drafter scoring 2,048 tokens drafts differently, and the output is still AR's; EOS is always in the
    reduced vocabulary, so the drafter still proposes the end of the answer (on these prompts in fp32; in bf16
    the draft model misses that one token)."""
    target = target_fp32
    drafter = make_drafter(method, target, draft_vocab=2048)
    total, kept = sd.Stats(), []
    for prompt, ar in [(real_prompts[i], ar_greedy_fp32[i]) for i in VOCAB_PROMPTS]:
        out = sd.generate(target, prompt, drafter, k=3, max_new_tokens=MAX_NEW, keep_trace=True)
        assert out.tokens == ar.tokens, f"{method} with a reduced vocabulary differs from AR on {prompt[:40]!r}"
        total, kept = total + out.stats, kept + [t for r in out.trace for t in r.drafts[: r.accepted]]
    assert total.num_accepted_tokens > 0, f"{method}: nothing accepted with a reduced vocabulary"
    assert target.eos_ids & set(kept), f"{method}: the end of the answer was never drafted"


def test_draft_vocab_is_refused_where_it_means_nothing(target):
    with pytest.raises(ValueError, match="eagle3 has no draft vocabulary to reduce.*drop --draft-vocab"):
        make_drafter("eagle3", target, draft_vocab=4096)
    with pytest.raises(ValueError, match=r"--draft-vocab must lie in 1\.\.49152"):
        make_drafter("dflash", target, draft_vocab=0)
    with pytest.raises(ValueError, match="shares its head with the verifier"):
        make_drafter("draft_model", target, draft="target", draft_vocab=4096)
    assert not isinstance(target.lm_head, ReducedHead)  # and the target's head is untouched


@pytest.mark.slow
def test_bench_runs_reduced_vocabularies_beside_the_full_ones(target):
    prompts = load_workload("math", n=1)
    records = bench(target, ["ngram", "dflash"], [2], prompts, max_new_tokens=6, progress=False, draft_vocabs=[1024])
    assert [(r.name, r.k) for r in records] == [("ar", 0), ("ngram", 2), ("dflash", 2), ("dflash v1024", 2)]
    assert records[-1].to_json()["draft_vocab"] == 1024 and records[-1].greedy_match == 1.0
