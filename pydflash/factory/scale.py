"""A random-weight target and DFlash drafter of a real shape (factory/shapes.py), quantized as users run them.

    python -m pydflash.factory.scale OUT_DIR --shape qwen3-4b [--quant Q4_K_M,Q8_0] [--seed 0] [--tmp-dir DIR]
    python -m pydflash.factory.scale OUT_DIR --shape gemma4-31b --direct [--quant Q4_K_M]

    OUT_DIR/
      target-q4_k_m.gguf   the target, one file per --quant: llama.cpp's own K-quant mix (pure=False, what
      target-q8_0.gguf     llama-quantize makes: e.g. Q6_K for the tied embedding and some FFN-down rows at Q4_K_M)
      drafter-q8_0.gguf    z-lab's drafter in llama.cpp's dflash layout, Q8_0 but fc (kept F16, as
                           pydflash-convert-drafter --quantize Q8_0 keeps it; docs/byo-pair.md)
      manifest.json        shape, seed, files and sizes, seconds per stage; written last: it marks a complete set

Both are first written in F16, tensor by tensor (factory/stream.py), into a staging folder on the same disk
(OUT_DIR/.f16-<shape>-<seed>, or under --tmp-dir; Qwen3-4B: 8.0 GB for the target), quantized from there by the
pinned build through the library (pydflash.native.quantize, compat.drafter_quant), and the staging folder is
deleted. ``--f16-only`` stops after the F16 files: numpy alone, no libllama, so that it can run while llama.cpp is
still being built, and the full call then only quantizes. A second call with the same parameters finds the manifest
and writes nothing. The weights are the seeded draws of factory/weights.py.

``--direct`` (the default for gemma4-31b, whose F16 target alone is 61 GB) writes each target straight at its type
(factory/direct.py: every tensor drawn on all cores, quantized by ggml with llama.cpp's mix, written; no F16 file):
other draws than the staged path's, the same types. The drafter is staged in F16 as before (3 GB at that size).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import drafter as D
from . import weights as W
from .direct import FILE_TYPES as DIRECT_TYPES
from .direct import draw, write_quantized
from .shapes import SHAPES, ScaleShape
from .stream import planned_bytes, write_streamed
from .tokenizer import build_padded_vocab

log = logging.getLogger(__name__)

SCALE_VERSION = 1  # bump when the bytes written for the same parameters change
DIRECT_BY_DEFAULT = ("gemma4-31b",)  # shapes whose F16 target would not fit a device's disk beside its quantization
DRAFTER_QUANT = "Q8_0"
# quantized size over F16 size, a bound for the disk check (Q8_0 is 8.5 bits of 16; Q4_K_M ~4.9, its Q6_K parts more)
QUANT_SHARE = {"Q8_0": 0.54, "Q4_K_M": 0.36}
# pydflash.native.quantize.FTYPES' keys, spelled out: importing pydflash.native loads libllama, which --f16-only
# must not need
QUANTS = ("F32", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_S")


@dataclass(frozen=True)
class ScalePair:
    out_dir: Path
    shape: str
    targets: dict  # quant -> target GGUF path
    drafter: Path
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # HF ids; the drafter GGUF stores these + 1
    n_vocab: int


def target_file(quant: str) -> str:
    return f"target-{quant.lower()}.gguf"


def drafter_file() -> str:
    return f"drafter-{DRAFTER_QUANT.lower()}.gguf"


def _pair(out_dir: Path, shape: ScaleShape, quants: tuple[str, ...]) -> ScalePair:
    d = shape.drafter()
    return ScalePair(out_dir, shape.name, {q: out_dir / target_file(q) for q in quants}, out_dir / drafter_file(),
                     shape.mask_id, d.target_layer_ids, shape.n_vocab)


def _params(shape: ScaleShape, quants: tuple[str, ...], seed: int, direct: bool = False) -> dict:
    params = {"scale_version": SCALE_VERSION, "shape": shape.name, "target": asdict(shape.target),
              "drafter": asdict(shape.drafter()), "n_vocab": shape.n_vocab, "quants": list(quants), "seed": seed}
    if direct:  # other draws than the staged path's: a pair written one way is never taken for the other
        params["direct"] = True
    return json.loads(json.dumps(params))  # as the manifest reads back (tuples as lists)


def _cached(out_dir: Path, params: dict) -> bool:
    try:
        manifest = json.loads((out_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    sizes = manifest.get("sizes", {})
    return manifest.get("params") == params and all(
        (out_dir / f).is_file() and (out_dir / f).stat().st_size == n for f, n in sizes.items())


def _check_disk(stage: Path, need: int, what: str) -> None:
    """Refuse before writing anything when the staged F16 file and the outputs (need bytes) cannot fit (both folders
    on one disk)."""
    free = shutil.disk_usage(stage).free
    if free < need * 1.05:
        raise OSError(f"{stage}: {free / 1e9:.1f} GB free, {what} need ~{need / 1e9:.1f} GB")


def _f16_dir(out_dir: Path, shape: ScaleShape, seed: int, tmp_dir: str | Path | None) -> Path:
    return Path(tmp_dir or out_dir) / f".f16-{shape.name}-{seed}"


def write_f16(out_dir: str | Path, shape: str | ScaleShape = "qwen3-4b", seed: int = 0, quants=("Q4_K_M",),
              tmp_dir: str | Path | None = None, direct: bool = False) -> tuple[Path | None, Path, dict]:
    """(F16 target, F16 drafter, seconds) in the staging folder, written or found complete (params.json last).
    direct: the drafter alone (the targets are written at their types later), the target None."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    stage = _f16_dir(Path(out_dir), shape, seed, tmp_dir)
    t16, d16, done = stage / "target-f16.gguf", stage / "drafter-f16.gguf", stage / "params.json"
    params = _params(shape, (), seed, direct)
    if done.is_file() and json.loads(done.read_text()) == params and (direct or t16.is_file()) and d16.is_file():
        return None if direct else t16, d16, {}
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    vocab = build_padded_vocab(shape.n_vocab, shape.mask_id)
    dspec = shape.drafter()
    t_plan = shape.target_plan()
    seconds = {}
    targets = sum(_quantized_bytes(t_plan, q) for q in quants)
    if direct:  # no F16 target: the F16 drafter beside the targets at their types
        _check_disk(stage, planned_bytes(D.drafter_plan(dspec), "f16") + targets, "the F16 drafter and the targets")
        t16 = None
    else:
        _check_disk(stage, planned_bytes(t_plan, "f16") + targets, "the F16 target and its quantizations")
        t0 = time.perf_counter()
        # independent streams: the target's weights never depend on the drafter's shape
        write_streamed(t16, shape.target.arch, lambda w: shape.add_target_keys(w, vocab, "f16"),
                       t_plan, W.rng_for(seed, 100, 0), "f16")
        seconds["target_f16"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_streamed(d16, "dflash", lambda w: D.add_drafter_keys(w, dspec, vocab, "f16"), D.drafter_plan(dspec),
                   W.rng_for(seed, 100, 1), "f16", rename=lambda n: D.gguf_name(n, "upstream"))
    seconds["drafter_f16"] = time.perf_counter() - t0
    done.write_text(json.dumps(params) + "\n")
    return t16, d16, seconds


def _quantized_bytes(plan: list[W.Planned], quant: str) -> int:
    """A bound on a target's size at quant (QUANT_SHARE of its F16 size; the disk check's figure)."""
    return int(planned_bytes(plan, "f16") * QUANT_SHARE.get(quant, 1.0))


def uses_direct(shape: str | ScaleShape, direct: bool | None) -> bool:
    name = shape if isinstance(shape, str) else shape.name
    return name in DIRECT_BY_DEFAULT if direct is None else direct


def write_scale_pair(out_dir: str | Path, shape: str | ScaleShape = "qwen3-4b", quants=("Q4_K_M",), seed: int = 0,
                     tmp_dir: str | Path | None = None, n_threads: int = 0, direct: bool | None = None) -> ScalePair:
    """Write (or reuse) shape's target at each quant and its Q8_0 drafter under out_dir; see the module docstring.
    direct: each target written straight at its type (None: where DIRECT_BY_DEFAULT names the shape)."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    quants = tuple(quants)
    direct = uses_direct(shape, direct)
    for q in quants:
        if q not in (DIRECT_TYPES if direct else QUANTS):
            raise ValueError(f"unknown quantization {q!r}; choose from {tuple(DIRECT_TYPES) if direct else QUANTS}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pair = _pair(out_dir, shape, quants)
    params = _params(shape, quants, seed, direct)
    if _cached(out_dir, params):
        log.info("%s pair cached in %s", shape.name, out_dir)
        return pair
    (out_dir / "manifest.json").unlink(missing_ok=True)

    # here, not at the top: importing pydflash.native loads libllama (see QUANTS)
    from ..compat.drafter_quant import quantize_drafter
    from ..native.quantize import quantize

    t16, d16, seconds = write_f16(out_dir, shape, seed, quants, tmp_dir, direct)
    stage = d16.parent
    threads = n_threads or os.cpu_count() or 1
    vocab = build_padded_vocab(shape.n_vocab, shape.mask_id) if direct else None  # the targets' keys, written here
    try:
        for q in quants:
            t0 = time.perf_counter()
            if direct:
                write_quantized(stage / target_file(q), shape.target.arch,
                                lambda w: shape.add_target_keys(w, vocab, "f16"), shape.target_plan(), q,
                                lambda i, p: draw(p, seed, i, threads), threads)
            else:
                quantize(t16, stage / target_file(q), q, pure=False, n_threads=n_threads)
            os.replace(stage / target_file(q), pair.targets[q])  # same disk: a rename
            seconds[f"target_{q}"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        quantize_drafter(d16, stage / drafter_file(), DRAFTER_QUANT, n_threads=n_threads)
        os.replace(stage / drafter_file(), pair.drafter)
        seconds["drafter_q8_0"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(stage, ignore_errors=True)

    dspec = shape.drafter()
    files = [target_file(q) for q in quants] + [drafter_file()]
    manifest = {"params": params, "sizes": {f: (out_dir / f).stat().st_size for f in files},
                "seconds": {k: round(v, 1) for k, v in seconds.items()},
                "target_params": shape.target_params, "target_layer_ids": list(dspec.target_layer_ids),
                "drafter_target_layers": list(dspec.layer_inputs)}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    log.info("wrote the %s pair to %s in %.0f s", shape.name, out_dir, sum(seconds.values()))
    return pair


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pydflash.factory.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-4b")
    ap.add_argument("--quant", default="Q4_K_M", help="comma-separated target types (Q4_K_M, Q8_0, ...)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp-dir", type=Path, default=None, help="the F16 staging folder's parent (default: OUT_DIR)")
    ap.add_argument("--threads", type=int, default=0, help="quantizer threads (0: all cores)")
    ap.add_argument("--f16-only", action="store_true",
                    help="write only the F16 staging files (no libllama needed); a later call quantizes them")
    ap.add_argument("--direct", action=argparse.BooleanOptionalAction, default=None,
                    help="write each target straight at its type, no F16 target file (default: for gemma4-31b)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("pydflash").setLevel(logging.INFO)
    quants = [q.strip() for q in a.quant.split(",") if q.strip()]
    direct = uses_direct(a.shape, a.direct)
    if a.f16_only:
        if _cached(a.out_dir, _params(SHAPES[a.shape], tuple(quants), a.seed, direct)):  # nothing to stage
            print(f"{a.shape} pair already in {a.out_dir}")
            return 0
        t16, d16, seconds = write_f16(a.out_dir, a.shape, a.seed, quants, a.tmp_dir, direct)
        staged = f"{t16} ({t16.stat().st_size / 1e9:.2f} GB), " if t16 else ""
        print(f"F16 staging files: {staged}{d16}; seconds {seconds or 'cached'}")
        return 0
    pair = write_scale_pair(a.out_dir, a.shape, quants, a.seed, a.tmp_dir, a.threads, direct)
    for q, path in pair.targets.items():
        print(f"target {q}: {path} ({path.stat().st_size / 1e9:.2f} GB)")
    print(f"drafter: {pair.drafter} ({pair.drafter.stat().st_size / 1e9:.2f} GB) mask={pair.mask_token_id} "
          f"target_layer_ids={list(pair.target_layer_ids)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
