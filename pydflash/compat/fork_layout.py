"""Fork-era DFlash drafter GGUFs (before upstream support) and their one-time conversion to upstream layout.

Fork layout (docs/compat.md, fork-era GGUFs; pydflash/factory/drafter.py writes one):
- architecture ``dflash-draft``; model hparams under ``dflash-draft.*`` (embedding_length, attention.*, ...);
- DFlash keys under ``dflash-draft.dflash.*``: block_size, target_layer_ids (raw HF ids, the "late",
  post-layer-output convention), mask_token_id, n_target_layers, n_target_features. Older files spell the
  layer key ``dflash-draft.target_layer_ids``;
- tensors ``dflash_fc.weight``, ``dflash_hidden_norm.weight``, and ``blk.N.post_attention_norm`` as the pre-FFN
  norm.

Why convert rather than alias the architecture in a llama.cpp patch: the differences are names and one index
convention, all of which a metadata/tensor rewrite expresses exactly, while an alias would have to teach the
loader two tensor namings and the +1 layer convention inside C++. The rewrite copies tensor bytes untouched
(quantized or not), so the converted drafter computes exactly what the original weights say. It is cached next to
the source file (or in ~/.cache/pydflash when that folder is read-only), keyed by the source's size and mtime.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import re

import gguf
import numpy as np

from ..errors import ModelLoadError
from .gguf_meta import GGUFMeta, read_metadata

log = logging.getLogger(__name__)

FORK_ARCH = "dflash-draft"
UPSTREAM_ARCH = "dflash"
CONVERTER_VERSION = "2"
MASK_KEY = "tokenizer.ggml.mask_token_id"
GEMMA_FORK_MASK = 4  # Gemma's "<mask>"; fork drafters for Gemma relied on it without storing it

_TENSOR_RENAMES = [
    (re.compile(r"^dflash_fc\.(weight|scale)$"), r"fc.\1"),
    (re.compile(r"^dflash_hidden_norm\.weight$"), "enc.output_norm.weight"),
    (re.compile(r"^blk\.(\d+)\.post_attention_norm\.weight$"), r"blk.\1.ffn_norm.weight"),
]
_LAYER_KEYS = (f"{FORK_ARCH}.dflash.target_layer_ids", f"{FORK_ARCH}.target_layer_ids")
_FORK_DFLASH = f"{FORK_ARCH}.dflash."
_KEPT_DFLASH = {"block_size"}  # fork dflash.* keys upstream knows under the same name; the rest are dropped


def upstream_tensor_name(name: str) -> str:
    for pattern, repl in _TENSOR_RENAMES:
        if pattern.match(name):
            return pattern.sub(repl, name)
    return name


def upstream_key(key: str) -> str | None:
    """Upstream spelling of a fork key; None for keys upstream does not know (dropped)."""
    if key in _LAYER_KEYS:
        return f"{UPSTREAM_ARCH}.target_layers"
    if key.startswith(_FORK_DFLASH):
        rest = key[len(_FORK_DFLASH) :]
        return f"{UPSTREAM_ARCH}.{rest}" if rest in _KEPT_DFLASH else None
    if key.startswith(FORK_ARCH + "."):
        return f"{UPSTREAM_ARCH}.{key[len(FORK_ARCH) + 1 :]}"
    return key


def _cache_path(src: pathlib.Path) -> pathlib.Path:
    st = src.stat()
    tag = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:{CONVERTER_VERSION}".encode()).hexdigest()[:12]
    name = f"{src.stem}.upstream-{tag}.gguf"
    if os.access(src.parent, os.W_OK):
        return src.parent / name
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "pydflash"
    cache.mkdir(parents=True, exist_ok=True)
    return cache / name


def convert_cached(src: pathlib.Path) -> pathlib.Path:
    dst = _cache_path(src)
    if dst.exists():
        return dst
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    try:
        convert(src, tmp)
        tmp.replace(dst)  # atomic: a concurrent loader sees either nothing or the whole file
    finally:
        tmp.unlink(missing_ok=True)
    log.info("converted fork-era drafter %s -> %s", src.name, dst)
    return dst


def upstream_kv(meta: GGUFMeta) -> list[tuple[str, object, object, object]]:
    """(key, value, type, element type) for the converted file, in source order."""
    out = []
    for key, value in meta.kv.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue  # the writer emits its own header, architecture and alignment
        new = upstream_key(key)
        if new is None:
            log.debug("dropping fork key %s", key)
            continue
        vtype, etype = meta.types[key]
        if key in _LAYER_KEYS:
            value = [int(v) + 1 for v in value]  # raw HF ids -> layer-input indices
            vtype, etype = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32
        out.append((new, value, gguf.GGUFValueType(vtype), gguf.GGUFValueType(etype) if etype is not None else None))
    if MASK_KEY not in meta.kv:
        out.append((MASK_KEY, _fork_mask(meta), gguf.GGUFValueType.UINT32, None))
    return out


def _fork_mask(meta: GGUFMeta) -> int:
    stored = meta.get(f"{_FORK_DFLASH}mask_token_id")
    if stored is not None:
        return int(stored)
    tokens = meta.get("tokenizer.ggml.tokens") or []
    if "<mask>" in tokens:
        return tokens.index("<mask>")
    log.warning("fork drafter %s names no mask token; assuming Gemma's id %d", meta.path.name, GEMMA_FORK_MASK)
    return GEMMA_FORK_MASK


def convert(src: pathlib.Path, dst: pathlib.Path) -> None:
    meta = read_metadata(src)
    if meta.arch != FORK_ARCH:
        raise ModelLoadError(f"{src} is '{meta.arch}', not a fork-era '{FORK_ARCH}' drafter")
    if not any(k in meta.kv for k in _LAYER_KEYS):
        raise ModelLoadError(f"{src}: fork drafter has none of {', '.join(_LAYER_KEYS)}")
    writer = gguf.GGUFWriter(str(dst), UPSTREAM_ARCH)
    for key, value, vtype, etype in upstream_kv(meta):
        writer.add_key_value(key, value, vtype, sub_type=etype)
    raw = np.memmap(src, np.uint8, "r")
    for t in meta.tensors.values():
        # bytes as stored, shaped [.., row bytes]: GGUFWriter derives the element shape from raw_dtype
        rows = int(np.prod(t.dims[1:]))
        data = raw[t.offset : t.offset + t.nbytes].reshape(*reversed(t.dims[1:]), t.nbytes // rows)
        writer.add_tensor(upstream_tensor_name(t.name), data, raw_dtype=gguf.GGMLQuantizationType(t.ggml_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
