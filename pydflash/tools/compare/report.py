"""Report records and their two renderings: a readable table and JSON.

Status glossary (one per tensor):
  ok              numbers within the tolerance of the GGUF type
  flagged         rel RMS above the tolerance of the GGUF type
  unsupported     gguf-py cannot dequantize this type; numbers not compared
  shape_mismatch  both sides present, shapes differ beyond a transpose
  missing_in_gguf source tensor whose mapped GGUF name is absent
  extra_in_gguf   GGUF tensor no source tensor maps to
  unmapped        source tensor no name rule covers
  shared          source tensor the GGUF omits on purpose (drafter embeddings/head, tied lm_head)
  generated       GGUF tensor the converter creates without a source (rope_freqs, borrowed head)
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

FAILING = ("flagged", "shape_mismatch", "missing_in_gguf", "extra_in_gguf", "unmapped")
_INVENTORY = ("missing_in_gguf", "extra_in_gguf", "unmapped", "shape_mismatch", "shared", "generated", "unsupported")


@dataclass
class TensorResult:
    status: str
    gguf_name: str | None = None
    hf_name: str | None = None
    gguf_type: str | None = None
    src_dtype: str | None = None
    src_shape: list[int] | None = None
    gguf_shape: list[int] | None = None   # logical (row-major) shape; ggml ne is this reversed
    transform: str = ""                    # known transforms undone before comparing
    rel_rms: float | None = None
    max_abs: float | None = None
    cosine: float | None = None
    tolerance: float | None = None


@dataclass
class Report:
    source: str
    gguf: str
    arch: str
    tensors: list[TensorResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(t.status in FAILING for t in self.tensors) else 0

    def by_type(self) -> dict[str, dict]:
        groups: dict[str, dict] = {}
        for t in self.tensors:
            if t.rel_rms is None:
                continue
            g = groups.setdefault(t.gguf_type, {"count": 0, "flagged": 0, "max_rel_rms": 0.0,
                                                "sum_rel_rms": 0.0, "min_cosine": 1.0, "tolerance": t.tolerance})
            g["count"] += 1
            g["flagged"] += t.status == "flagged"
            g["max_rel_rms"] = max(g["max_rel_rms"], t.rel_rms)
            g["sum_rel_rms"] += t.rel_rms
            g["min_cosine"] = min(g["min_cosine"], t.cosine)
        for g in groups.values():
            g["mean_rel_rms"] = g.pop("sum_rel_rms") / g["count"]
        return dict(sorted(groups.items()))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.status] = out.get(t.status, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> dict:
        return {"arch": self.arch, "exit_code": self.exit_code, "counts": self.counts(),
                "by_type": self.by_type(), "notes": self.notes}


def to_json(r: Report) -> str:
    def clean(x):  # JSON has no inf/nan
        return None if isinstance(x, float) and not math.isfinite(x) else x
    tensors = [{k: clean(v) for k, v in asdict(t).items()} for t in r.tensors]
    doc = {"source": r.source, "gguf": r.gguf, "tensors": tensors, "summary": r.summary()}
    return json.dumps(doc, indent=2)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render_table(r: Report) -> str:
    lines = [f"source: {r.source}", f"gguf:   {r.gguf}  (arch {r.arch or '?'})", ""]
    compared = [t for t in r.tensors if t.rel_rms is not None or t.status == "unsupported"]
    if compared:
        w = max(len(t.gguf_name) for t in compared)
        lines.append(f"{'gguf tensor':<{w}}  {'type':<7} {'src':<5} {'rel_rms':>9} {'max_abs':>9} "
                     f"{'cosine':>9}  status   transform")
        for t in compared:
            lines.append(f"{t.gguf_name:<{w}}  {t.gguf_type:<7} {t.src_dtype:<5} {_fmt(t.rel_rms, '9.2e')} "
                         f"{_fmt(t.max_abs, '9.2e')} {_fmt(t.cosine, '9.6f')}  {t.status:<8} {t.transform}")
        lines.append("")
    lines += _inventory_lines(r) + _type_lines(r)
    lines += [f"note: {n}" for n in r.notes]
    verdict = "OK" if r.exit_code == 0 else "PROBLEMS FOUND"
    lines.append(f"result: {verdict} " + ", ".join(f"{k}={v}" for k, v in r.counts().items()))
    return "\n".join(lines)


def _inventory_lines(r: Report) -> list[str]:
    out = []
    for status in _INVENTORY:
        rows = [t for t in r.tensors if t.status == status]
        if not rows:
            continue
        out.append(f"{status} ({len(rows)}):")
        for t in rows:
            name = " <- ".join(n for n in (t.gguf_name, t.hf_name) if n)
            extra = ""
            if status == "shape_mismatch":
                extra = f"  source {t.src_shape} vs gguf {t.gguf_shape}"
            elif status == "unsupported":
                extra = f"  type {t.gguf_type} (gguf-py cannot dequantize it)"
            out.append(f"  {name}{extra}")
    return out + ([""] if out else [])


def _type_lines(r: Report) -> list[str]:
    groups = r.by_type()
    if not groups:
        return []
    out = [f"{'type':<7} {'count':>5} {'flagged':>7} {'mean_rel_rms':>12} {'max_rel_rms':>11} "
           f"{'tolerance':>9} {'min_cosine':>10}"]
    for name, g in groups.items():
        out.append(f"{name:<7} {g['count']:>5} {g['flagged']:>7} {g['mean_rel_rms']:>12.2e} "
                   f"{g['max_rel_rms']:>11.2e} {g['tolerance']:>9.2e} {g['min_cosine']:>10.6f}")
    return out + [""]
