"""write_tiny_pair: one target + its drafter (three layouts) in a directory, cached.

    out_dir/
      target.gguf            target in llama.cpp layout (arch llama | qwen3 | gemma3 | gemma4)
      drafter.gguf           DFlash drafter, upstream layout (arch "dflash")
      drafter-fork.gguf      same weights, fork-era layout (arch "dflash-draft")
      drafter-hf/model.safetensors, drafter-hf/config.json   same weights, z-lab layout
      manifest.json          params + their hash; written last, so it marks a complete set

A second call with the same parameters finds a matching manifest and rewrites nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from . import weights as W
from .drafter import (
    DrafterSpec, drafter_spec, drafter_weights, write_drafter_fork_gguf, write_drafter_gguf,
    write_drafter_hf,
)
from . import gemma4, targets
from .targets import ALL_ARCHS, TargetSpec
from .tokenizer import TinyVocab, build_vocab

log = logging.getLogger(__name__)

# Bump when the bytes written for the same parameters change, so caches are rebuilt.
FACTORY_VERSION = 1

_FILES = {
    "target": "target.gguf",
    "drafter": "drafter.gguf",
    "drafter_fork": "drafter-fork.gguf",
    "safetensors": "drafter-hf/model.safetensors",
    "config_json": "drafter-hf/config.json",
}
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class TinyPair:
    out_dir: Path
    target: Path
    drafter: Path
    drafter_fork: Path
    safetensors: Path
    config_json: Path
    arch: str
    seed: int
    dtype: str
    n_embd: int
    n_layer: int  # target layers
    n_vocab: int
    bos_id: int
    eos_id: int
    mask_token_id: int
    block_size: int
    drafter_layers: int
    target_layer_ids: tuple[int, ...]  # raw HF ids; upstream GGUF stores these + 1
    embedding_scale: float  # what the drafter's noise embeddings need (sqrt(n_embd) for gemma3 and gemma4)
    embedding_scale_key: float | None  # what drafter.gguf carries as dflash.embedding_scale
    tied_output: bool  # target has no output.weight (head = token_embd)
    logit_softcap: float | None = None  # the target's final logit softcap (gemma4: 30), inherited by the drafter

    @property
    def target_layer_inputs(self) -> tuple[int, ...]:
        return tuple(i + 1 for i in self.target_layer_ids)

    @property
    def n_embd_features(self) -> int:
        """Floats per token in a drafter feature-injection batch."""
        return len(self.target_layer_ids) * self.n_embd


def _params(arch: str, seed: int, drafter_layers: int, dtype: str, embedding_scale_key: float | None,
            tied_output: bool) -> dict:
    return {
        "factory_version": FACTORY_VERSION, "arch": arch, "seed": seed, "drafter_layers": drafter_layers,
        "dtype": dtype, "embedding_scale_key": embedding_scale_key, "tied_output": tied_output,
    }


def _hash(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()


def _is_cached(out_dir: Path, digest: str) -> bool:
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("hash") != digest:
        return False
    sizes = manifest.get("sizes", {})
    # a size check catches files truncated or replaced after the manifest was written
    return all((out_dir / rel).is_file() and (out_dir / rel).stat().st_size == sizes.get(rel)
               for rel in _FILES.values())


def _default_spec(arch: str, tied_output: bool) -> TargetSpec:
    if arch == gemma4.GEMMA4:
        return gemma4.default_spec(tied_output)
    return targets.default_spec(arch, tied_output=tied_output)


def _make_pair(out_dir: Path, spec: TargetSpec, dspec: DrafterSpec, vocab: TinyVocab, seed: int,
               dtype: str, scale_key: float | None) -> TinyPair:
    paths = {k: out_dir / rel for k, rel in _FILES.items()}
    return TinyPair(
        out_dir=out_dir, **paths, arch=spec.arch, seed=seed, dtype=dtype, n_embd=spec.n_embd,
        n_layer=spec.n_layer, n_vocab=dspec.n_vocab, bos_id=vocab.bos_id,
        eos_id=vocab.eos_id, mask_token_id=dspec.mask_token_id, block_size=dspec.block_size,
        drafter_layers=dspec.n_layer, target_layer_ids=dspec.target_layer_ids,
        embedding_scale=spec.embedding_scale, embedding_scale_key=scale_key, tied_output=spec.tied_output,
        logit_softcap=spec.logit_softcap,
    )


def write_tiny_pair(
    out_dir: str | Path,
    arch: str = "qwen3",
    seed: int = 0,
    drafter_layers: int = 1,
    dtype: str = "f32",
    embedding_scale_key: float | None = None,
    tied_output: bool = False,
) -> TinyPair:
    """Write (or reuse) a deterministic tiny target + DFlash drafter under out_dir.

    embedding_scale_key: None writes no dflash.embedding_scale into drafter.gguf (the
    default: compat supplies it for Gemma via kv_overrides); a float writes that value.
    tied_output: write no output.weight, as real Gemma checkpoints do (llama.cpp then uses
    token_embd as the head, and so does the drafter through ctx_other). Off by default
    because tiny tied models loop sooner (see targets.default_spec).
    """
    if arch not in ALL_ARCHS:
        raise ValueError(f"arch must be one of {ALL_ARCHS}, got {arch!r}")
    W.check_dtype(dtype)
    if embedding_scale_key is not None:
        embedding_scale_key = float(embedding_scale_key)

    out_dir = Path(out_dir)
    vocab = build_vocab()
    spec = _default_spec(arch, bool(tied_output))
    dspec = drafter_spec(spec, drafter_layers, vocab)
    pair = _make_pair(out_dir, spec, dspec, vocab, seed, dtype, embedding_scale_key)

    params = _params(arch, seed, drafter_layers, dtype, embedding_scale_key, bool(tied_output))
    digest = _hash(params)
    if _is_cached(out_dir, digest):
        log.debug("tiny pair cached in %s", out_dir)
        return pair

    (out_dir / MANIFEST).unlink(missing_ok=True)  # incomplete until rewritten below

    # separate streams: target weights never depend on drafter parameters
    layout = gemma4 if arch == gemma4.GEMMA4 else targets  # gemma4 has its own tensors and keys
    t_tensors = layout.target_weights(spec, W.rng_for(seed, ALL_ARCHS.index(arch), 0), vocab.n_vocab, dtype)
    d_tensors = drafter_weights(dspec, W.rng_for(seed, ALL_ARCHS.index(arch), 1), dtype)

    # Write into a private staging dir, then os.replace each file: a concurrent reader (or a
    # second pytest worker writing the same pair) never sees a half-written model file.
    stage = out_dir / f".stage-{os.getpid()}"
    tmp = {k: stage / rel for k, rel in _FILES.items()}
    tmp["config_json"].parent.mkdir(parents=True, exist_ok=True)
    try:
        layout.write_target(tmp["target"], spec, vocab, t_tensors, dtype)
        write_drafter_gguf(tmp["drafter"], dspec, vocab, d_tensors, dtype, embedding_scale_key)
        write_drafter_fork_gguf(tmp["drafter_fork"], dspec, vocab, d_tensors, dtype)
        write_drafter_hf(tmp["safetensors"], tmp["config_json"], dspec, d_tensors, dtype)
        for key, src in tmp.items():
            dst = getattr(pair, key)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    finally:
        shutil.rmtree(stage, ignore_errors=True)

    manifest = {
        "hash": digest,
        "params": params,
        "sizes": {rel: (out_dir / rel).stat().st_size for rel in _FILES.values()},
        "pair": {k: (str(v.relative_to(out_dir)) if isinstance(v, Path) else v)
                 for k, v in asdict(pair).items() if k != "out_dir"},
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    log.info("wrote tiny %s pair (seed %d) to %s", arch, seed, out_dir)
    return pair
