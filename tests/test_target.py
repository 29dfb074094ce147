"""Target on the real model: verify = a full forward, taps = HF hidden states, crop keeps the cache exact."""

import torch

import specdec_learn as sd


def full_forward(target, ids):
    with torch.no_grad():
        return target.model(torch.tensor([ids]), output_hidden_states=True)


def test_verify_rows_equal_full_forward_logits(target):
    ids = target.encode("Name three fruits.")
    drafts = [504, 1183, 28]
    state, _ = target.prefill(ids)
    out = target.verify(state, drafts)
    assert out.logits.shape == (len(drafts) + 1, target.vocab_size)
    ref = full_forward(target, ids + drafts).logits[0, len(ids) - 1 :]
    # The same fp32 sums in another order (a cache, then 4 rows, against one pass of all): differences of
    # 1.4e-3 on logits of magnitude ~20 were seen once here (2026-12-01). A wrong position, mask or cache
    # row moves them by tenths or more.
    torch.testing.assert_close(out.logits, ref, atol=3e-3, rtol=1e-4)


def test_taps_are_hf_hidden_states_and_only_those(target):
    ids = target.encode("Count to five.")
    L = target.num_layers
    taps = (0, 2, L // 2, L - 3)  # embedding output and EAGLE-3's default layers
    state, pre = target.prefill(ids, taps)
    assert set(pre.hidden) == set(taps)  # only what was asked for
    ref = full_forward(target, ids).hidden_states
    for t in taps:
        torch.testing.assert_close(pre.hidden[t], ref[t][0, :-1], atol=1e-4, rtol=1e-4)
    # tap L is the last layer's output before the final norm
    out = target.verify(state, [], (L,))
    torch.testing.assert_close(target.final_norm(out.hidden[L]), ref[L][0, -1:], atol=1e-4, rtol=1e-4)


def test_commit_crops_cache_to_accepted_prefix(target):
    ids = target.encode("Say hello.")
    state, _ = target.prefill(ids)
    target.verify(state, [100, 200, 300])
    assert state.cache.get_seq_length() == len(ids) + 3
    target.commit(state, [100, 7])  # one draft accepted, then the target's own token
    assert state.ids == ids + [100, 7]
    assert state.cache.get_seq_length() == len(state.ids) - 1  # everything but `last`
    # the cropped cache gives the same logits as recomputing from scratch
    nxt = target.verify(state, [])
    ref = full_forward(target, state.ids).logits[0, -1]
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
