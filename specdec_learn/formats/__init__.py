"""Checkpoint formats: how the published drafters are laid out on disk.

A method file (``drafters/<method>.py``) holds the network and the drafter; how
its weights are named and configured on disk lives here, one module per
published layout, so a student reads the paper's network without wading
through key renaming first:

    io.py            generic: config.json, *.safetensors, strict loading, atomic folder writes
    speculators.py   vllm-project/speculators: EAGLE-3 (``eagle3``) and DSpark (``dspark``)
    zlab.py          z-lab's DFlash (``DFlashDraftModel``)
    deepspec.py      deepseek-ai/DeepSpec's DSpark (``Qwen3DSparkModel``)
    mtp.py           native MTP layers inside a target checkpoint (Qwen3.5 / Qwen3-Next
                     ``mtp.*``, DeepSeek-V3 ``model.layers.{L+j}.*``, MoE experts split/fused)
    hf_assistant.py  transformers' ``gemma4_assistant`` (Gemma 4's MTP drafter)

Each module translates between files and (a config, tensors under the names
our networks use). It never builds a network and never imports a drafter:
drafters import formats, not the other way round.
"""
