"""Target on the real model: verify = a full forward, taps = HF hidden states, crop keeps the cache exact.

Compared with HF's own forward to a tolerance, so in fp32 (conftest.target_fp32)."""

import torch

import specdec_learn as sd


def full_forward(target, ids):
    with torch.no_grad():
        return target.model(torch.tensor([ids]), output_hidden_states=True)


def test_verify_rows_equal_full_forward_logits(target_fp32):
    ids = target_fp32.encode("Name three fruits.")
    drafts = [504, 1183, 28]
    state, _ = target_fp32.prefill(ids)
    out = target_fp32.verify(state, drafts)
    assert out.logits.shape == (len(drafts) + 1, target_fp32.vocab_size)
    ref = full_forward(target_fp32, ids + drafts).logits[0, len(ids) - 1 :]
    # The same fp32 sums in another order (a cache, then 4 rows, against one pass of all) differ by up to
    # ~1.4e-3 on logits of magnitude ~20. A wrong position, mask or cache row moves them by tenths or more.
    torch.testing.assert_close(out.logits, ref, atol=3e-3, rtol=1e-4)


def test_taps_are_hf_hidden_states_and_only_those(target_fp32):
    ids = target_fp32.encode("Count to five.")
    L = target_fp32.num_layers
    taps = (0, 2, L // 2, L - 3)  # embedding output and EAGLE-3's default layers
    state, pre = target_fp32.prefill(ids, taps)
    assert set(pre.hidden) == set(taps)  # only what was asked for
    ref = full_forward(target_fp32, ids).hidden_states
    for t in taps:
        torch.testing.assert_close(pre.hidden[t], ref[t][0, :-1], atol=1e-4, rtol=1e-4)
    # tap L is the last layer's output before the final norm
    out = target_fp32.verify(state, [], (L,))
    torch.testing.assert_close(target_fp32.final_norm(out.hidden[L]), ref[L][0, -1:], atol=1e-4, rtol=1e-4)


def test_commit_crops_cache_to_accepted_prefix(target_fp32):
    ids = target_fp32.encode("Say hello.")
    state, _ = target_fp32.prefill(ids)
    target_fp32.verify(state, [100, 200, 300])
    assert state.cache.get_seq_length() == len(ids) + 3
    target_fp32.commit(state, [100, 7])  # one draft accepted, then the target's own token
    assert state.ids == ids + [100, 7]
    assert state.cache.get_seq_length() == len(state.ids) - 1  # everything but `last`
    # the cropped cache gives the same logits as recomputing from scratch
    nxt = target_fp32.verify(state, [])
    ref = full_forward(target_fp32, state.ids).logits[0, -1]
    torch.testing.assert_close(nxt.logits[0], ref, atol=1e-4, rtol=1e-4)


def test_single_token_prompt_and_raw_ids(target):
    out = sd.generate(target, [1], max_new_tokens=5, chat=False)
    assert len(out.tokens) == 5
    ref = target.model.generate(torch.tensor([[1]]), max_new_tokens=5, do_sample=False)[0, 1:].tolist()
    assert out.tokens == ref


def test_chat_template_is_applied(target):
    ids = target.encode("Hi there")
    text = target.tokenizer.decode(ids)
    assert "<|im_start|>user\nHi there<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_pieces_show_what_each_token_writes(target):
    """Byte-level BPE names a leading space 'Ġ' and a newline 'Ċ'; pieces show '·' and '↵'."""
    ids = target.tokenizer.encode(" a\nb", add_special_tokens=False)
    assert "Ġa" in target.tokenizer.convert_ids_to_tokens(ids)
    assert "".join(target.pieces(ids)) == "·a↵b"



def verify_under(target, implementation, ids, drafts, parents=None):
    """Prefill `ids`, verify `drafts` with the model's attention set to `implementation`; the logits."""
    target.model.set_attn_implementation(implementation)
    state, _ = target.prefill(ids)
    return target.verify(state, drafts, parents=parents).logits


def test_grouped_sdpa_is_transformers_sdpa_without_the_copy():
    """The attention function alone: 9 query heads on 3 K/V heads, a verify pass's masks (a chain's, a tree's)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from specdec_learn.speedups import grouped_sdpa

    class Attention(torch.nn.Module):  # what the functions read of a layer
        num_key_value_groups = 3
        is_causal = True

    torch.manual_seed(0)
    rows, past = 5, 40
    chain = torch.ones(rows, past + rows, dtype=torch.bool).tril(past)[None, None]  # [1, 1, n, L]
    tree = chain.clone()
    tree[0, 0, 3, past + 2] = False  # a tree row that does not see an earlier row
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, rows, 9, 64, dtype=dtype).transpose(1, 2)  # [1, 9, n, 64], strided as in a model
        k, v = (torch.randn(1, 3, past + rows, 64, dtype=dtype) for _ in range(2))  # [1, 3, L, 64]
        for mask in (chain, tree, torch.zeros_like(chain, dtype=dtype).masked_fill(~tree, -torch.inf)):
            ours, _ = grouped_sdpa(Attention(), q, k, v, mask, scaling=0.125)
            theirs, _ = sdpa_attention_forward(Attention(), q, k, v, mask, scaling=0.125)
            assert ours.shape == (1, rows, 9, 64)
            torch.testing.assert_close(ours, theirs, atol=0, rtol=0)


def test_grouped_heads_verify_as_transformers_sdpa_does():
    """load's speed-ups set attend_grouped_heads on a CPU model (one not made row-invariant, whose attention is
    its own); a chain's or a tree's verify pass gives the same logits."""
    from conftest import tiny_target
    from specdec_learn.speedups import GROUPED, speed_up

    target = sd.load("smollm2-135m", dtype="fp32", device="cpu", invariant=False)
    assert target.model.config._attn_implementation == GROUPED
    assert target.model.config.num_attention_heads != target.model.config.num_key_value_heads
    tree = [-1, 0, 0, 1]  # node 0 continues `last`, nodes 1 and 2 both continue node 0, node 3 node 1
    small = tiny_target()  # 4 query heads, 2 K/V heads
    small.model.to(torch.bfloat16)
    assert small.model.config._attn_implementation == "sdpa"  # Target(model) leaves a model as it is
    speed_up(small.model)
    assert small.model.config._attn_implementation == GROUPED
    try:
        for model, prompt, drafts in ((target, target.encode("Name three fruits."), [504, 1183, 28, 30]),
                                      (small, [1, 5, 9, 33, 17, 8], [40, 41, 7, 99])):
            for parents in (None, tree):
                ours = verify_under(model, GROUPED, prompt, drafts, parents)
                theirs = verify_under(model, "sdpa", prompt, drafts, parents)
                # equal in every run seen here; the tolerance of test_verify_rows_equal_full_forward_logits (fp32
                # matmuls on a CPU do not promise the same bits from run to run), far below what a wrong mask moves
                torch.testing.assert_close(ours, theirs, atol=3e-3, rtol=1e-4)
    finally:
        target.model.set_attn_implementation(GROUPED)
