"""Our format readers against vLLM's own config code (runs in .venv-vllm, like the other test_vllm_* files).

No engine starts: these call the functions vLLM uses to read a drafter's config, on the configs our
readers and writers handle, so a disagreement in what a checkpoint means shows up here.
"""

import json

import pytest
import torch

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")


CASES = [  # (Qwen3Config kwargs, top-level extra, dflash_config extra)
    (dict(layer_types=["full_attention", "full_attention"]), {}, {}),
    (dict(layer_types=["sliding_attention", "sliding_attention"], use_sliding_window=True, sliding_window=4), {}, {}),
    (dict(layer_types=["full_attention", "full_attention"]), {}, {"use_swa": True, "swa_window_size": 8}),
    (dict(layer_types=["sliding_attention", "sliding_attention"], use_sliding_window=True, sliding_window=4), {},
     {"causal": False}),
    (dict(layer_types=["full_attention", "full_attention"]), {"is_causal": True}, {}),
    (dict(layer_types=["sliding_attention", "sliding_attention"], sliding_window=4), {}, {}),  # window nulled
]


@pytest.mark.parametrize("qwen, top, sub", CASES)
def test_dflash_layer_attention_equals_vllms(tmp_path, qwen, top, sub):
    """formats/zlab.layer_attention vs vLLM's model_executor/models/qwen3_dflash._resolve_layer_attention:
    the same (window, causal) per layer, or both refuse."""
    from transformers import Qwen3Config
    from vllm.model_executor.models.qwen3_dflash import _resolve_layer_attention

    from specdec_learn.formats.zlab import layer_attention

    hf = Qwen3Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, vocab_size=64, **qwen)
    hf.dflash_config = {"mask_token_id": 5, "target_layer_ids": [0, 2], **sub}
    for key, value in top.items():
        setattr(hf, key, value)
    d = {**hf.to_dict(), "architectures": ["DFlashDraftModel"], "block_size": 4, "num_target_layers": 4}
    (tmp_path / "config.json").write_text(json.dumps(d))
    cfg = _read_config_only(tmp_path)  # what our z-lab reader makes of the file
    try:
        want = [_resolve_layer_attention(hf, i) for i in range(2)]
    except ValueError:
        with pytest.raises(ValueError, match="no window"):
            layer_attention(cfg, 0)
        return
    assert [layer_attention(cfg, i) for i in range(2)] == want


def _read_config_only(path):
    """read_dflash needs weights to exist; write an empty placeholder, read the config, remove it."""
    from safetensors.torch import save_file

    from specdec_learn.formats.zlab import read_dflash

    save_file({"x": torch.zeros(1)}, path / "model.safetensors")
    cfg, _ = read_dflash(path)
    (path / "model.safetensors").unlink()
    return cfg


def test_vllm_reads_our_speculators_dspark_folder(tmp_path):
    """vLLM's speculators reader (transformers_utils/configs/speculators/base.py + algos.py update_dspark)
    validates our config (it needs speculators_config.verifier.name_or_path) and maps it to the fields
    its DSpark model reads: the taps as target_layer_ids = aux - 1, the heads, the mask id."""
    from transformers import Qwen3Config
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    from specdec_learn.drafters.dspark import DSparkModel, save_dspark

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids, cfg.num_target_layers = 5, 7, [-1, 1, 2], 4
    cfg.markov_rank, cfg.markov_head_type, cfg.num_anchors = 4, "vanilla", 16
    cfg.enable_confidence_head, cfg.confidence_head_with_markov = True, True
    save_dspark(DSparkModel(cfg, 32), tmp_path, dtype=torch.float32, verifier="Qwen/Qwen3-8B")
    d = json.loads((tmp_path / "config.json").read_text())
    assert SpeculatorsConfig.extract_vllm_speculative_config(d) == {"method": "dspark", "num_speculative_tokens": 5}
    hf = SpeculatorsConfig.extract_transformers_pre_trained_config(d)
    assert hf["target_layer_ids"] == [-1, 1, 2] and hf["sample_from_anchor"] is True
    assert (hf["markov_rank"], hf["block_size"], hf["mask_token_id"]) == (4, 5, 7)
