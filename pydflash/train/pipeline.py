"""Stage 2 (one GPU): target responses, target features, drafter training, evaluation, export.

    python -m pydflash.train.pipeline --gguf TARGET.gguf --prompts prompts.npz --out OUTDIR \
        --gen-seconds 100 --train-seconds 330

Everything is time-budgeted so that one call fits a fixed slot of device time. Writes OUTDIR/
model.safetensors (bf16), config.json, metrics.json, eval.npz (held-out sequences + features-free
ids, for CPU evaluation with pydflash) and train.log.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch

from . import holdout
from .drafter import DFlashDrafter, DrafterConfig, draft_logits_loss
from .evaluate import evaluate
from .target import GemmaTarget, greedy_generate, load_gguf_weights, rms_norm

STOP_IDS = (1, 106)  # <eos>, <end_of_turn>
DEV = "cuda"


class Log:
    def __init__(self, path):
        self.f = open(path, "a")
        self.t0 = time.time()

    def __call__(self, *a):
        s = f"[{time.time() - self.t0:7.1f}s] " + " ".join(str(x) for x in a)
        print(s, flush=True)
        self.f.write(s + "\n")
        self.f.flush()


@torch.no_grad()
def generate(target, prompts: np.ndarray, n_new: int, batch: int, deadline: float, log) -> tuple:
    toks, lens = [], []
    for s in range(0, len(prompts), batch):
        if time.time() > deadline:
            break
        p = torch.from_numpy(prompts[s:s + batch]).long().to(DEV)
        t, n = greedy_generate(target, p, n_new, STOP_IDS)
        toks.append(t)
        lens.append(n)
        log(f"  generated {s + len(p)}/{len(prompts)} rows")
    return torch.cat(toks), torch.cat(lens)


@torch.no_grad()
def features(target, tokens: torch.Tensor, layer_ids, batch: int = 64, dtype=torch.bfloat16) -> torch.Tensor:
    """Teacher-forced outputs of the target layers, concatenated, ``batch`` rows per forward."""
    return _layer_outputs(target, tokens, layer_ids, batch, dtype, with_final=False)[0]


@torch.no_grad()
def features_and_teacher(target, tokens: torch.Tensor, layer_ids, batch: int = 64,
                         dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """features(), and the target's final hidden state after its output norm [B, L, n_embd] (its logits are that
    times the embedding matrix: the teacher of draft_logits_loss's top-k distillation), from the same forwards."""
    return _layer_outputs(target, tokens, layer_ids, batch, dtype, with_final=True)


def _layer_outputs(target, tokens, layer_ids, batch, dtype, with_final: bool):
    """(the feature layers' outputs concatenated, the normed final state or None); without the final state the
    forwards stop at the last feature layer."""
    last, d = target.cfg.n_layer - 1, target.cfg.n_embd
    out = torch.empty((*tokens.shape, len(layer_ids) * d), dtype=dtype, device=tokens.device)
    final = torch.empty((*tokens.shape, d), dtype=dtype, device=tokens.device) if with_final else None
    layers = tuple(layer_ids) + ((last,) if with_final else ())
    for s in range(0, tokens.shape[0], batch):
        _, f = target(tokens[s:s + batch], 0, layers_out=layers, logits="none")
        out[s:s + batch] = torch.cat([f[j] for j in layer_ids], dim=-1).to(dtype)
        if with_final:
            final[s:s + batch] = rms_norm(f[last], target.w["output_norm.weight"], target.cfg.rms_eps).to(dtype)
    return out, final


def train(model, embd, feats, tokens, valid, P, args, log):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    N, L = tokens.shape
    t0, step, hist = time.time(), 0, []
    last_save = t0
    lo = torch.full((args.rows,), P, device=DEV)
    while True:
        frac = (time.time() - t0) / args.train_seconds
        if frac >= 1.0:
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        rows = torch.randint(0, N, (args.rows,), device=DEV)
        vl = valid[rows]
        hi = (vl - 2).clamp(min=P)
        anchors = lo[:, None] + (torch.rand(args.rows, args.anchors, device=DEV) * (hi - lo + 1)[:, None]).long()
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss, st = draft_logits_loss(model, embd, feats[rows], tokens[rows], vl, anchors)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if time.time() - last_save > 120:
            save_drafter(model, args.out)
            last_save = time.time()
        if step % args.log_every == 0:
            acc = st["acc"].tolist()
            hist.append({"step": step, "loss": float(loss), "t": round(time.time() - t0, 1)})
            log(f"step {step} loss {float(loss):.4f} lr {lr:.2e} acc[1,2,4,8,15] "
                f"{acc[1]:.3f} {acc[2]:.3f} {acc[4]:.3f} {acc[8]:.3f} {acc[15]:.3f}")
    return step, hist


def save_drafter(model, out):
    from safetensors.torch import save_file
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(model.config.to_hf_config(), f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-new", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=768)
    ap.add_argument("--gen-seconds", type=float, default=100)
    ap.add_argument("--train-seconds", type=float, default=330)
    ap.add_argument("--eval-per-kind", type=int, default=40)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--target-layers", default="1,4,8,12,15")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--anchors", type=int, default=20)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-train-rows", type=int, default=0, help="0: as many as the time allows")
    args = ap.parse_args(argv)
    global DEV
    DEV = args.device
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train.log"))
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t_start = time.time()

    cfg, w = load_gguf_weights(args.gguf, threads=16)
    target = GemmaTarget(cfg, w, dtype=torch.float32, device=DEV)
    del w
    log("target loaded", cfg)
    z = np.load(args.prompts)
    P = int(z["train_code"].shape[1])
    rng = np.random.default_rng(args.seed)
    train_p = np.concatenate([z["train_code"], z["train_prose"]])
    train_kind = np.r_[np.zeros(len(z["train_code"])), np.ones(len(z["train_prose"]))]
    perm = rng.permutation(len(train_p))
    train_p, train_kind = train_p[perm], train_kind[perm]
    held = holdout.held_token_rows(train_p, args.gguf)  # evaluation and benchmark prompts are never trained on
    train_p, train_kind = train_p[~held], train_kind[~held]
    log(f"dropped {int(held.sum())} training prompts holding an evaluation or benchmark prompt")
    if args.max_train_rows:
        train_p, train_kind = train_p[: args.max_train_rows], train_kind[: args.max_train_rows]
    ev = {k: z[f"eval_{k}"][: args.eval_per_kind] for k in ("code", "prose")}

    # 1. responses: the target's own greedy continuations
    t0 = time.time()
    ev_tok = {k: generate(target, v, args.n_new, args.gen_batch, float("inf"), log) for k, v in ev.items()}
    tr_tok, tr_len = generate(target, train_p, args.n_new, args.gen_batch, time.time() + args.gen_seconds, log)
    gen_s = time.time() - t0
    n_rows = tr_tok.shape[0]
    resp_tokens = int((tr_len - P).sum())
    log(f"generated {n_rows} train rows, {resp_tokens} response tokens, "
        f"{int(n_rows * P)} prompt tokens in {gen_s:.0f}s")

    # 2. target features (outputs of the target layers), bf16 on the GPU
    layer_ids = [int(x) for x in args.target_layers.split(",")]
    t0 = time.time()
    tr_feat = features(target, tr_tok, layer_ids)
    ev_feat = {k: features(target, v[0], layer_ids) for k, v in ev_tok.items()}
    log(f"features {tuple(tr_feat.shape)} in {time.time() - t0:.0f}s")

    # 3. drafter
    dcfg = DrafterConfig(hidden_size=cfg.n_embd, num_hidden_layers=args.layers, intermediate_size=args.ff,
                         vocab_size=cfg.n_vocab, num_target_layers=cfg.n_layer,
                         target_layer_ids=tuple(layer_ids), input_embedding_scale=math.sqrt(cfg.n_embd))
    model = DFlashDrafter(dcfg).to(DEV)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"drafter params {n_params / 1e6:.2f}M")
    embd = target.embd.to(torch.bfloat16)
    target.w.clear()                       # free the f32 target (features are done)
    target.embd = None
    if DEV == "cuda":
        torch.cuda.empty_cache()
    steps, hist = train(model, embd, tr_feat, tr_tok, tr_len, P, args, log)

    # 4. held-out evaluation (greedy DFlash, simulated exactly)
    model.eval()
    metrics = {"drafter_params": n_params, "train_rows": n_rows, "train_response_tokens": resp_tokens,
               "train_prompt_tokens": int(n_rows * P), "prompt_len": P, "n_new": args.n_new,
               "gen_seconds": round(gen_s, 1), "train_seconds": args.train_seconds, "train_steps": steps,
               "loss_history": hist, "args": vars(args)}
    with torch.autocast(DEV, dtype=torch.bfloat16):
        for k, (tok, ln) in ev_tok.items():
            r = evaluate(model, embd, ev_feat[k], tok, [P] * tok.shape[0], ln.tolist(), dcfg.block_size)
            metrics[f"eval_{k}"] = r
            log(f"eval {k}: {r}")
        # training-distribution check on a few training rows
        r = evaluate(model, embd, tr_feat[:40], tr_tok[:40], [P] * 40, tr_len[:40].tolist(), dcfg.block_size)
        metrics["train_subset"] = r
        log(f"train subset: {r}")

    # 5. export (z-lab layout); GGUF conversion happens on CPU from these files
    save_drafter(model, args.out)
    np.savez_compressed(os.path.join(args.out, "eval.npz"),
                        **{f"{k}_tokens": v[0].cpu().numpy().astype(np.int32) for k, v in ev_tok.items()},
                        **{f"{k}_len": v[1].cpu().numpy() for k, v in ev_tok.items()}, prompt_len=P)
    metrics["total_seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    log("done", metrics["total_seconds"])


if __name__ == "__main__":
    main()
