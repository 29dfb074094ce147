"""The embedded model converts offline into the cache dir, and writes nowhere else."""

import json
import os
import subprocess
import sys


def test_conversion_writes_only_into_the_cache_dir(tmp_path):
    home, cwd, cache = tmp_path / "home", tmp_path / "cwd", tmp_path / "cache"
    for d in (home, cwd):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "HF_", "SPECDEC_"))}
    env.update(HOME=str(home), SPECDEC_CACHE=str(cache), HF_HUB_OFFLINE="1", MPLCONFIGDIR=str(cache / "mpl"))
    code = (
        "import specdec_learn as sd; t = sd.load('smollm2-135m', dtype='fp32');"
        "print(sd.generate(t, 'Say hi.', max_new_tokens=4).tokens)"
    )
    subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, check=True, capture_output=True, timeout=300)
    assert list(home.iterdir()) == [] and list(cwd.iterdir()) == []
    model_dir = cache / "models" / "smollm2-135m"
    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
    assert any(model_dir.glob("*.safetensors"))
    tokenizer_files = {p.name for p in model_dir.iterdir()}
    assert "tokenizer.json" in tokenizer_files
    assert "im_start" in (model_dir / "tokenizer_config.json").read_text() + "".join(
        p.read_text() for p in model_dir.glob("*.jinja")
    )


def test_one_gguf_reader_parses_a_file_once_and_puts_the_reader_back(tmp_path):
    """transformers parses a GGUF file three times in a conversion; within the block each file is parsed once."""
    import gguf
    import numpy as np

    from specdec_learn.models import gguf_says_add_bos, one_gguf_reader

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    parse = gguf.GGUFReader
    with one_gguf_reader():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and gguf_says_add_bos(path)
        assert first.tensors[0].name == "token_embd.weight"
    assert gguf.GGUFReader is parse and gguf.GGUFReader(path) is not first
