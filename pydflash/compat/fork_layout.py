"""Fork-era DFlash drafter GGUFs (before upstream support) and their one-time conversion to upstream layout.

Fork layout (../shared/DFLASH_NOTES.md section 4):
- architecture ``dflash-draft``, keys ``dflash-draft.*``;
- tensors ``dflash_fc.weight`` and ``dflash_hidden_norm.weight``;
- ``blk.N.post_attention_norm`` is the pre-FFN norm;
- ``dflash-draft.target_layer_ids`` holds raw HF layer ids (the "late", post-layer-output convention).

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

from ..errors import ModelLoadError

log = logging.getLogger(__name__)

FORK_ARCH = "dflash-draft"
UPSTREAM_ARCH = "dflash"
CONVERTER_VERSION = "1"

_TENSOR_RENAMES = [
    (re.compile(r"^dflash_fc\.(weight|scale)$"), r"fc.\1"),
    (re.compile(r"^dflash_hidden_norm\.weight$"), "enc.output_norm.weight"),
    (re.compile(r"^blk\.(\d+)\.post_attention_norm\.weight$"), r"blk.\1.ffn_norm.weight"),
]


def upstream_tensor_name(name: str) -> str:
    for pattern, repl in _TENSOR_RENAMES:
        if pattern.match(name):
            return pattern.sub(repl, name)
    return name


def upstream_key(key: str) -> str:
    if key == "general.architecture":
        return key
    if key.startswith(FORK_ARCH + "."):
        rest = key[len(FORK_ARCH) + 1 :]
        return f"{UPSTREAM_ARCH}.target_layers" if rest == "target_layer_ids" else f"{UPSTREAM_ARCH}.{rest}"
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


def convert_cached(src: pathlib.Path, meta: dict | None = None) -> pathlib.Path:
    dst = _cache_path(src)
    if dst.exists():
        return dst
    tmp = dst.with_suffix(".tmp")
    convert(src, tmp)
    tmp.replace(dst)  # atomic: a concurrent loader sees either nothing or the whole file
    log.info("converted fork-era drafter %s -> %s", src.name, dst)
    return dst


def convert(src: pathlib.Path, dst: pathlib.Path) -> None:
    reader = gguf.GGUFReader(str(src), "r")
    arch = reader.fields["general.architecture"].contents()
    if arch != FORK_ARCH:
        raise ModelLoadError(f"{src} is '{arch}', not a fork-era '{FORK_ARCH}' drafter")
    writer = gguf.GGUFWriter(str(dst), UPSTREAM_ARCH)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer emits its own header and architecture
        key = upstream_key(name)
        value = field.contents()
        if name == f"{FORK_ARCH}.target_layer_ids":
            value = [int(v) + 1 for v in value]  # raw HF ids -> layer-input indices
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for t in reader.tensors:
        # raw_shape is in ggml order (ne0 first); GGUFWriter expects numpy order
        writer.add_tensor(upstream_tensor_name(t.name), t.data, raw_shape=list(reversed([int(x) for x in t.shape])),
                          raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
