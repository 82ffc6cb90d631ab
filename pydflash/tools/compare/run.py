"""compare(): inventory the two files, then compare numbers one tensor at a time."""
from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .errors import BadInput
from .gguf_side import GGUFFile, GGUFTensor, dequantize_rows
from .metrics import ErrorStats, load_tolerances, tolerance_for
from .names import NameMap, is_generated, is_shared, name_map_for, to_gguf
from .report import Report, TensorResult
from .source import SafetensorsSource, SourceTensor
from .transforms import GEMMA_ARCHS, Transform, pick_transform, source_rows

# Elements per chunk: 1M values; with the float64 temporaries in ErrorStats that is
# ~40 MiB of working memory, whatever the tensor size.
CHUNK_ELEMS = 1 << 20


def compare(source: str | Path, gguf: str | Path, only: str | None = None,
            tolerance_file: str | Path | None = None, progress: bool | None = None) -> Report:
    """Compare an HF safetensors checkpoint with a GGUF. Raises BadInput on unreadable input."""
    tolerances = load_tolerances(tolerance_file)
    src = SafetensorsSource(source)
    gf = GGUFFile(gguf)
    nmap = name_map_for(gf.arch)
    report = Report(str(source), str(gguf), gf.arch)
    pairs = _inventory(src, gf, nmap, _matcher(only), report)
    if only and not pairs and not report.tensors:  # a typo in the pattern must not read as "result: OK"
        raise BadInput(f"--only {only!r} matches no tensor name in {source} or {gguf}")
    if progress is None:
        progress = sys.stderr.isatty()
    total = sum(int(np.prod(s.shape, dtype=np.int64)) for s, _ in pairs)
    with tqdm(total=total, unit="w", unit_scale=True, disable=not progress, leave=False) as bar:
        for s, g in pairs:
            bar.set_postfix_str(g.name, refresh=False)
            report.tensors.append(_compare_pair(src, s, g, gf, tolerances, bar))
    report.tensors.sort(key=lambda t: _natural(t.gguf_name or t.hf_name))
    _add_notes(report, nmap)
    return report


def _natural(name: str) -> list:
    """Sort key that puts blk.2 before blk.10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _matcher(only: str | None):
    if not only:
        return lambda *names: True
    pat = only if any(c in only for c in "*?[") else f"*{only}*"  # plain text = substring
    return lambda *names: any(n and fnmatch.fnmatchcase(n, pat) for n in names)


def _inventory(src: SafetensorsSource, gf: GGUFFile, nmap: NameMap, wanted, report: Report):
    """Fill the report's inventory rows; return the (source, gguf) pairs to compare."""
    pairs: list[tuple[SourceTensor, GGUFTensor]] = []
    claimed: set[str] = set()
    for hf_name in sorted(src.tensors):
        gname = to_gguf(hf_name, nmap)
        if not wanted(hf_name, gname):
            continue
        s = src.tensors[hf_name]
        if gname is not None and gname in gf.tensors:
            claimed.add(gname)
            pairs.append((s, gf.tensors[gname]))
            continue
        status = "unmapped" if gname is None else "shared" if is_shared(hf_name, nmap) else "missing_in_gguf"
        report.tensors.append(TensorResult(status, gname, hf_name, src_dtype=s.dtype, src_shape=list(s.shape)))
    for gname, g in gf.tensors.items():
        if gname in claimed or not wanted(gname):
            continue
        status = "generated" if is_generated(gname, nmap) else "extra_in_gguf"
        report.tensors.append(TensorResult(status, gname, gguf_type=g.qtype.name, gguf_shape=list(g.shape)))
    return pairs


def _compare_pair(src: SafetensorsSource, s: SourceTensor, g: GGUFTensor, gf: GGUFFile,
                  tolerances: dict[str, float], bar) -> TensorResult:
    res = TensorResult("ok", g.name, s.name, g.qtype.name, s.dtype, list(s.shape), list(g.shape))
    n = int(np.prod(s.shape, dtype=np.int64))
    tf = pick_transform(gf.arch, s.name, tuple(s.shape), g.shape, _heads(gf))
    if tf is None:
        res.status = "shape_mismatch"
        bar.update(n)
        return res
    res.transform = tf.describe()
    res.tolerance = tolerance_for(g.qtype.name, tolerances)
    try:
        stats = _stream(src.array(s), s.dtype, g, tf, bar)
    except NotImplementedError:  # gguf/quants.py dequantize() for a type it does not implement
        res.status = "unsupported"
        return res
    res.rel_rms, res.max_abs, res.cosine = stats.rel_rms, stats.max_abs, stats.cosine
    if not res.rel_rms <= res.tolerance:  # also catches NaN
        res.status = "flagged"
    return res


def _stream(arr: np.ndarray, dtype: str, g: GGUFTensor, tf: Transform, bar) -> ErrorStats:
    """Accumulate error stats over row chunks of the GGUF tensor."""
    src2d = arr.reshape(-1, arr.shape[-1]) if arr.ndim else arr.reshape(1, 1)
    n_rows, n_cols = g.n_rows, (g.shape[-1] if g.shape else 1)
    step = max(1, CHUNK_ELEMS // max(1, n_cols))
    stats = ErrorStats()
    for lo in range(0, n_rows, step):
        hi = min(n_rows, lo + step)
        got = dequantize_rows(g, lo, hi)
        want = source_rows(src2d, dtype, tf, lo, hi)
        stats.update(got, want)
        bar.update(got.size)
    return stats


def _heads(gf: GGUFFile) -> tuple[int, int] | None:
    """(n_head, n_head_kv) from GGUF metadata, for the llama q/k permutation."""
    n_head = gf.field(f"{gf.arch}.attention.head_count")
    if not isinstance(n_head, (int, np.integer)):
        return None
    n_kv = gf.field(f"{gf.arch}.attention.head_count_kv")
    return int(n_head), int(n_kv) if isinstance(n_kv, (int, np.integer)) else int(n_head)


def _add_notes(report: Report, nmap: NameMap) -> None:
    if nmap.note:
        report.notes.append(nmap.note)
    done = {t.transform for t in report.tensors if t.transform}
    if any("transposed" in d for d in done):
        report.notes.append("some GGUF tensors are stored transposed; compared against the transposed source")
    if any("permute" in d for d in done):
        report.notes.append("llama arch: q/k rows compared after conversion/llama.py LlamaModel.permute")
    if any("vocab trimmed" in d for d in done):
        report.notes.append("gemma: token_embd holds only the in-vocabulary rows (conversion/gemma.py); compared those")
    if report.arch in GEMMA_ARCHS:
        report.notes.append("gemma RMSNorm: GGUF stores w+1 (conversion/gemma.py); HF norms compared as w+1")
    if report.tensors and not any(t.rel_rms is not None for t in report.tensors):
        report.notes.append("no tensor pair was compared numerically")
