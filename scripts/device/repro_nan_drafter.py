#!/usr/bin/env python3
"""Issue 12 item 2, the mechanism: a drafter whose logits are NaN makes CUDA's argmax return -1 (LLAMA_TOKEN_NULL).

The report: on the H200 a random drafter made every speculative step fail with `llama_decode failed with code -1`
and llama.cpp's `init: all entries in the batch must have the same content types`, while the CPU build ran the same
file. llama_batch_allocr::init reads an entry whose id is LLAMA_TOKEN_NULL (-1) as "no token", so one -1 among real
ids is exactly that error. CUDA's argmax returns -1 for a row with no comparable maximum (NaN / -inf logits); the
CPU argmax returns some index. A drafter that overflows on the GPU (f16 intermediates) gives such rows.

This script makes the overflow certain: bench.py's random drafter with its final norm scaled by 1e38 (the head's
input is then +-inf, and inf - inf sums give NaN logits), then runs the engine on the GPU twice:
  1. as shipped: Drafter._valid_prefix cuts each block at the first id outside the vocabulary (fb9f6ff), so the
     run completes, drafts nothing that could be wrong, and its output equals plain decoding;
  2. with that guard removed (monkeypatched here, never in the package): the -1 ids reach the target's batch.

    PYDFLASH_VERBOSE=1 python3 scripts/device/repro_nan_drafter.py --ngl -1 --out $OUT/repro_nan.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import traceback

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pydflash import api  # noqa: E402  (first: libllama must load before numpy, see pydflash/__init__.py)
import gguf  # noqa: E402
import numpy as np  # noqa: E402
from pydflash.config import EngineConfig  # noqa: E402
from pydflash.defaults import gemma_target  # noqa: E402
from pydflash.engine.drafter import Drafter  # noqa: E402
from pydflash.factory.for_target import write_random_drafter_for  # noqa: E402

PROMPTS = ["The history of the printing press begins", "def add(a, b):\n"]


def nan_drafter(src: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """A copy of src with output_norm.weight x 1e38 (all other tensors and metadata unchanged)."""
    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), "dflash")
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        w.add_key_value(name, field.contents(), vtype,
                        sub_type=field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        data = np.array(t.data)
        if t.name == "output_norm.weight":
            data = (data.astype(np.float32) * np.float32(1e38)).astype(data.dtype)
        w.add_tensor(t.name, data, raw_shape=list(reversed([int(x) for x in t.shape])), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def run(target, drafter, ngl: int, tokens: int) -> dict:
    cfg = EngineConfig(n_slots=2, n_ctx_slot=512, n_gpu_layers=ngl, adaptive=False, draft_max=15)
    try:
        with api.load(target, drafter, cfg) as llm:
            res = llm.generate_many([api.Request(llm.tokenize(p), max_tokens=tokens, ignore_eos=True)
                                     for p in PROMPTS])
            d = llm.engine.drafter
            return {"ok": True, "tokens": [r.tokens for r in res], "drafted": sum(r.stats.n_drafted for r in res),
                    "blocks_cut": d.n_invalid if d is not None else 0}
    except Exception as exc:
        return {"ok": False, "error": repr(exc), "traceback": traceback.format_exc()[-3000:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ngl", type=int, default=-1)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--out", default="repro_nan.json")
    args = ap.parse_args()
    target = gemma_target()
    work = pathlib.Path(target).parent
    random = write_random_drafter_for(target, work / "gemma3-random-drafter.gguf")
    bad = nan_drafter(random, work / "gemma3-nan-drafter.gguf")
    out = {"plain": run(target, None, args.ngl, args.tokens)}
    out["guarded"] = run(target, bad, args.ngl, args.tokens)
    Drafter._valid_prefix = lambda self, drafts: drafts  # the guard removed: what the report saw
    out["unguarded"] = run(target, bad, args.ngl, args.tokens)
    out["guarded_equals_plain"] = out["guarded"].get("tokens") == out["plain"].get("tokens")
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "tokens"} if isinstance(v, dict) else v)
                      for k, v in out.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
