"""Deterministic tiny GGUF models for tests: a target (llama | qwen3 | gemma3 | gemma4) and a
matching DFlash drafter in upstream, fork-era and z-lab safetensors layouts.

    from pydflash.factory import write_tiny_pair
    pair = write_tiny_pair(tmp_path, arch="gemma3", seed=0)
    pair.target, pair.drafter, pair.mask_token_id, pair.target_layer_ids

Nothing here touches the native library; it only writes files with gguf-py and safetensors. The one exception is
pydflash.factory.scale (random-weight pairs of real shapes, e.g. Qwen3-4B, for speed runs), which quantizes them
through libllama.
"""

from .pair import FACTORY_VERSION, TinyPair, write_tiny_pair
from .targets import ALL_ARCHS, ARCHS
from .tokenizer import TinyVocab, build_vocab

__all__ = ["ALL_ARCHS", "ARCHS", "FACTORY_VERSION", "TinyPair", "TinyVocab", "build_vocab", "write_tiny_pair"]
