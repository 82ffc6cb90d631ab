"""Check the torch Gemma-3 target against llama.cpp on CPU before training on it.

- greedy continuations of the same prompts, token-by-token agreement (strict: position-wise);
- teacher-forced argmax agreement on llama.cpp's own sequences;
- layer-input features at the drafter's target layers (relative L2 error and cosine).

    python -m pydflash.train.verify --gguf MODEL.gguf --prompts prompts.npz
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch


def run(gguf: str, prompts: np.ndarray, n_new: int, layer_ids: tuple[int, ...], log=print) -> dict:
    from .llamacpp_ref import LlamaRef
    from .target import GemmaTarget, greedy_generate, load_gguf_weights

    ref = LlamaRef(gguf)
    cfg, w = load_gguf_weights(gguf)
    tgt = GemmaTarget(cfg, w, dtype=torch.float32)
    del w
    torch.set_grad_enabled(False)

    ref_out = [ref.greedy([int(t) for t in p], n_new) for p in prompts]
    t_out, _ = greedy_generate(tgt, torch.from_numpy(prompts).long(), n_new)
    t_out = t_out[:, prompts.shape[1]:].numpy()
    r = np.asarray(ref_out)
    strict = float((r == t_out).mean())
    prefix = [int(np.argmin(np.r_[r[i] == t_out[i], False])) for i in range(len(r))]

    # teacher forcing on llama.cpp's sequences; features of the first sequences
    tf_hits, tf_total, feat_err = 0, 0, {}
    for i, p in enumerate(prompts):
        seq = [int(t) for t in p] + ref_out[i]
        lids = tuple(j + 1 for j in layer_ids) if i < 4 else ()
        fr = ref.features(seq, lids)
        lg, feats = tgt(torch.tensor([seq]), 0, layers_out=layer_ids)
        am = lg[0].argmax(-1).numpy()
        tf_hits += int((am[:-1] == fr["argmax"][:-1]).sum())
        tf_total += len(seq) - 1
        for j in layer_ids if i < 4 else ():
            a, b = fr[j + 1], feats[j][0].numpy()
            rel = float(np.linalg.norm(a - b) / np.linalg.norm(a))
            cos = float(np.mean((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))))
            e = feat_err.setdefault(j, {"rel_l2": [], "cos": []})
            e["rel_l2"].append(rel)
            e["cos"].append(cos)
    res = {
        "n_prompts": len(prompts), "n_new": n_new,
        "greedy_strict_agreement": strict,
        "greedy_mean_common_prefix": float(np.mean(prefix)),
        "teacher_forced_argmax_agreement": tf_hits / tf_total,
        "features": {str(j): {k: float(np.mean(v)) for k, v in e.items()} for j, e in feat_err.items()},
    }
    log(json.dumps(res, indent=1))
    ref.close()
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompts", required=True, help="npz from pydflash.train.prepare (eval_code/eval_prose)")
    ap.add_argument("--n", type=int, default=10, help="prompts per kind")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--n-new", type=int, default=32)
    ap.add_argument("--layers", default="1,4,8,12,15")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    z = np.load(a.prompts)
    pr = np.concatenate([z["eval_code"][: a.n, : a.prompt_len], z["eval_prose"][: a.n, : a.prompt_len]])
    res = run(a.gguf, pr, a.n_new, tuple(int(x) for x in a.layers.split(",")))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
