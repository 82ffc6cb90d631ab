"""Train (or keep training) the drafter on responses the GGUF target generated (``generate.py``).

    python -m pydflash.train.trainer --gguf TARGET.gguf --data DIR[,DIR...] --out OUT \
        --init pydflash/models --seconds 500 [--layers 4]

Unlike ``pipeline.py`` (fixed 96-token prompts, responses and features from the PyTorch port, all held in GPU
memory), rows here have any prompt length (3 to ~1,000 tokens) and their tokens are the GGUF's own. Features are
computed batch by batch by the PyTorch port (teacher-forced over the GGUF's tokens), so the data can outgrow GPU
memory: 20 M tokens of features would take 128 GB.

- Batches draw rows of similar length (sorted buckets) and size themselves to a token budget, so a batch of
  short chat turns and one of 1,000-token files cost about the same.
- Anchors sit only in the response: prompt text is human-written, and the drafter's job is to guess the target.
- ``--init DIR`` continues from a drafter (``model.safetensors`` + ``config.json``, z-lab layout). With
  ``--layers`` above its depth, the new layers start as the identity (zero output projections), so training
  starts from the old drafter's function instead of from noise. ``--keep-layers 0,1,2`` instead keeps only those
  layers of the initial drafter, in order: a shallower drafter costs less per block (docs/drafter.md's cost bar: a
  15-draft block under 30 % of a 16-token verify).
- ``--copy-weight W`` draws copying rows (half or more of the response continues 8-grams of the prompt:
  ``copying.py``) W times as often as others of their length: the drafter does not copy text seen once
  (docs/drafter.md). 1 (the default) samples as before.
- ``--source-weight PATTERN=W`` draws the rows of the data folders whose path contains PATTERN W times as often as
  others of their length: the self-generated runs' prompts are the target's own sampled text, a user's are
  written by people (the corpus runs' prompts), and this sets how much each kind weighs.
- Rows whose prompt holds an evaluation or benchmark prompt are dropped (``holdout.py``).
- A slice of the rows (``--holdout``) is never trained on; the simulated greedy tau on it is logged for the
  starting weights and the result, per kind.
- ``--distill-topk K`` adds top-k logit distillation: the port's final state gives the target's distribution over
  its K likeliest tokens at each label, and ``--distill-weight`` of each position's loss is the cross-entropy on it.
  ``--distill-stored W`` instead mixes in the KL to the GGUF target's own top-k, stored in the shards by ``topk.py``
  (``distill.py``): (1 - W) hard-label cross-entropy + W KL. Both are off by default until a held-out run shows they
  raise tau.
  ``--schedule constant`` keeps the peak LR after the warmup (two cosine continuations of version 4, at 5e-4 and
  1.5e-4, first lost held-out tau: docs/drafter.md).

Writes OUT/model.safetensors (bf16), OUT/config.json, OUT/train.json (metrics, loss history, args).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch

from . import holdout as keep_out
from .copying import COPY_NGRAM, COPY_ROW_SHARE, copy_shares
from .distill import dense_soft
from .drafter import DFlashDrafter, DrafterConfig, draft_logits_loss
from .evaluate import evaluate
from .generate import KINDS, load_shards
from .pipeline import Log, features, features_and_teacher, save_drafter
from .target import GemmaTarget, load_gguf_weights

PAD = 0


class Bucket:
    """Rows in length order: a batch is a window of similar lengths around a random pick."""

    def __init__(self, idx: np.ndarray, lens: np.ndarray):
        self.order = idx[np.argsort(lens, kind="stable")]
        self.sorted_lens = np.sort(lens)

    def batch(self, rng: np.random.Generator, token_budget: int, max_rows: int) -> list[int]:
        """Rows of similar length around a random pick: as many as fit the token budget."""
        j = int(rng.integers(len(self.order)))
        n = int(max(1, min(max_rows, token_budget // max(int(self.sorted_lens[j]), 1))))
        lo = max(0, min(j - n // 2, len(self.order) - n))
        return self.order[lo:lo + n].tolist()


def split_documents(data: dict, keep: np.ndarray, hold_from: np.ndarray, share: float) -> tuple[np.ndarray, np.ndarray]:
    """Held-out rows drawn only where ``hold_from`` is set (rows of the folders named by ``--holdout-from``), whole
    documents at a time: a self-generated document is cut into several prompts, the longer ones holding the
    shorter ones' text, so a row split would train on what it then checks. About ``share`` of the eligible rows
    (in ``keep``'s shuffled order, so the seed picks the documents); every other row trains."""
    doc = data["source"].astype(np.int64) << 40 | data["index"].astype(np.int64)
    docs, first, rows = np.unique(doc[keep[hold_from[keep]]], return_index=True, return_counts=True)
    by_draw = np.argsort(first)  # documents in the shuffled order of their first row
    n_docs = int(np.searchsorted(np.cumsum(rows[by_draw]), int(rows.sum() * share)))
    out = np.isin(doc[keep], docs[by_draw[:n_docs]]) & hold_from[keep]
    return keep[out], keep[~out]


class Rows:
    """The ragged rows of a data folder, split into train / holdout, bucketed by length.

    ``copy_weight`` W: a copying row (a COPY_ROW_SHARE or more of its response copies its prompt) is drawn W times as
    often as another row of its length. ``source_weight`` (one weight per row, from its folder: ``--source-weight``)
    multiplies in. Rows of one weight then get a length order of their own, and a batch comes from one order, picked
    in proportion to its rows' total weight: weighting only the pick around which a window is cut would draw the
    pick's neighbours of other weights as often, and weighted rows would gain only where they happen to cluster.
    Every weight 1 keeps the one order of all rows, the sampler of every earlier run, draw for draw; the copy weight
    alone keeps the sampler of the runs that used it."""

    def __init__(self, data: dict, max_len: int, holdout: float, seed: int, copy_weight: float = 1.0,
                 drop: np.ndarray | None = None, hold_from: np.ndarray | None = None,
                 source_weight: np.ndarray | None = None):
        resp = data["lens"] - data["prompt_len"]
        ok = (resp >= 3) & (data["prompt_len"] + 2 < max_len)
        if drop is not None:  # rows whose prompt holds an evaluation or benchmark prompt (holdout.py)
            ok &= ~drop
        keep = np.flatnonzero(ok)
        rng = np.random.default_rng(seed)
        rng.shuffle(keep)
        self.data, self.max_len = data, max_len
        if hold_from is None:  # every row may be held out, row by row: the split of every earlier run
            n_hold = int(len(keep) * holdout)
            self.holdout, self.train = keep[:n_hold], keep[n_hold:]
        else:
            self.holdout, self.train = split_documents(data, keep, hold_from, holdout)
        lens = np.minimum(data["lens"][self.train], max_len)
        self.all = Bucket(self.train, lens)
        # shares of the rows as trained (cut at max_len), computed once: ~13 s for 30 M tokens on two cores
        self.resp_lens = lens - data["prompt_len"][self.train]
        self.copy_share = copy_shares(data["tokens"], data["starts"][self.train], lens, data["prompt_len"][self.train])
        copying = self.copy_share >= COPY_ROW_SHARE
        self.copy_weight = copy_weight
        src = np.ones(len(self.train)) if source_weight is None else np.asarray(source_weight, float)[self.train]
        self.weight = np.where(copying, copy_weight, 1.0) * src  # each training row's draw weight
        # one length order per (copying, weight) group, copying groups first (with the copy weight alone: the
        # copying and the plain order, as before); the chance that a batch comes from a group is its share of the
        # total weight, which is also the share of draws that go to its rows
        self.groups: list[Bucket] = []
        mass = []
        for is_copy in (True, False):
            for w in sorted(set(self.weight[copying == is_copy].tolist()), reverse=True):
                sel = (copying == is_copy) & (self.weight == w)
                self.groups.append(Bucket(self.train[sel], lens[sel]))
                mass.append(w * int(sel.sum()))
        total = sum(mass)
        self.p_group = np.cumsum(mass) / total if total else np.ones(len(mass))
        self.uniform = bool(np.all(self.weight == 1.0))

    def row(self, i: int) -> tuple[np.ndarray, int]:
        s, n = int(self.data["starts"][i]), int(min(self.data["lens"][i], self.max_len))
        return self.data["tokens"][s:s + n], int(self.data["prompt_len"][i])

    def batch(self, rng: np.random.Generator, token_budget: int, max_rows: int) -> list[int]:
        """Rows of similar length around a random pick: as many as fit the token budget."""
        if self.uniform:
            return self.all.batch(rng, token_budget, max_rows)
        g = min(int(np.searchsorted(self.p_group, rng.random(), side="right")), len(self.groups) - 1)
        return self.groups[g].batch(rng, token_budget, max_rows)

    def draw_share(self, rows: np.ndarray) -> float:
        """The share of row draws that go to ``rows`` (a mask over the training rows)."""
        total = float(self.weight.sum())
        return float(self.weight[rows].sum()) / total if total else 0.0

    def copy_stats(self) -> dict:
        """How much of the training data copies its prompt, and how often copying rows are drawn."""
        copying = self.copy_share >= COPY_ROW_SHARE
        resp = max(int(self.resp_lens.sum()), 1)
        return {"copy_rows": int(copying.sum()), "copy_row_share": round(int(copying.sum()) / max(len(copying), 1), 4),
                "copy_row_response_token_share": round(int(self.resp_lens[copying].sum()) / resp, 4),
                "copied_token_share": round(float((self.copy_share * self.resp_lens).sum()) / resp, 4),
                "copy_weight": self.copy_weight, "copy_draw_share": round(self.draw_share(copying), 4)}


def pad(rows: list[tuple[np.ndarray, int]], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    L = max(len(t) for t, _ in rows)
    tok = np.full((len(rows), L), PAD, dtype=np.int64)
    for i, (t, _) in enumerate(rows):
        tok[i, :len(t)] = t
    lens = torch.tensor([len(t) for t, _ in rows], device=device)
    starts = torch.tensor([p for _, p in rows], device=device)
    return torch.from_numpy(tok).to(device), lens, starts


def source_weights(spec: str, folders: list[str]) -> list[float]:
    """Each folder's draw weight from ``--source-weight PATTERN=W,...``: the first pattern its path contains, else 1.
    A pattern that names no folder, or a weight that is not above 0, is an error (a typo would train unweighted)."""
    pairs = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        pattern, eq, w = item.rpartition("=")
        try:
            weight = float(w)
        except ValueError:
            weight = -1.0
        if not eq or not pattern or not weight > 0:
            raise ValueError(f"{item!r} is not PATTERN=W with W above 0")
        if not any(pattern in f for f in folders):
            raise ValueError(f"{pattern!r} is in no --data folder's path")
        pairs.append((pattern, weight))
    return [next((w for p, w in pairs if p in f), 1.0) for f in folders]


def init_files(path: str) -> tuple[str, str]:
    """(weights, config.json) of a drafter: a z-lab folder, or a .safetensors file with ``<stem>.config.json`` beside
    it (how pydflash/models ships them)."""
    if os.path.isdir(path):
        return os.path.join(path, "model.safetensors"), os.path.join(path, "config.json")
    stem = path[: -len(".safetensors")] if path.endswith(".safetensors") else path
    cfg = stem + ".config.json"
    return path, cfg if os.path.exists(cfg) else os.path.join(os.path.dirname(path), "config.json")


def keep_only(sd: dict, keep: list[int]) -> dict:
    """The state dict with only the layers in ``keep``, renumbered 0.. in that order; everything outside the layers
    (fc, the norms) as it is."""
    out = {k: v for k, v in sd.items() if not k.startswith("layers.")}
    for new, old in enumerate(keep):
        prefix = f"layers.{old}."
        out.update({f"layers.{new}." + k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
    return out


def load_init(path: str, layers: int, device, keep: list[int] | None = None) -> DFlashDrafter:
    from safetensors.torch import load_file
    weights, config = init_files(path)
    with open(config) as f:
        hf = json.load(f)
    cfg = DrafterConfig.from_hf_config(hf)
    sd = load_file(weights)
    if keep:
        if layers and layers != len(keep):
            raise ValueError(f"--layers {layers} differs from --keep-layers' {len(keep)} layers")
        if len(set(keep)) != len(keep) or not all(0 <= i < cfg.num_hidden_layers for i in keep):
            raise ValueError(f"--keep-layers {keep}: distinct layers of the initial drafter's "
                             f"0..{cfg.num_hidden_layers - 1}")
        sd = keep_only(sd, keep)
        cfg = DrafterConfig(**{**cfg.__dict__, "num_hidden_layers": len(keep)})
    old = cfg.num_hidden_layers
    if layers and layers != old:
        if layers < old:
            raise ValueError(f"--layers {layers} is below the initial drafter's {old} (--keep-layers drops layers)")
        cfg = DrafterConfig(**{**cfg.__dict__, "num_hidden_layers": layers})
    model = DFlashDrafter(cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or any(not k.startswith("layers.") for k in missing):
        raise ValueError(f"{path}: weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    for layer in model.layers[old:]:  # new layers: the identity at the start (the residual passes through)
        torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
        torch.nn.init.zeros_(layer.mlp.down_proj.weight)
    return model.to(device)


def scratch_config(target_cfg, args, layer_ids) -> DrafterConfig:
    """A new drafter's shape: the target's width, vocabulary and layers; depth and attention heads from the
    arguments (more heads of the same total width let one head match the anchor's token against the context's,
    what version 4 fails at: docs/drafter.md)."""
    d = DrafterConfig()
    return DrafterConfig(
        hidden_size=target_cfg.n_embd, num_hidden_layers=args.layers or d.num_hidden_layers,
        vocab_size=target_cfg.n_vocab,
        num_attention_heads=args.heads or d.num_attention_heads,
        num_key_value_heads=args.kv_heads or d.num_key_value_heads, head_dim=args.head_dim or d.head_dim,
        num_target_layers=target_cfg.n_layer, target_layer_ids=tuple(layer_ids),
        input_embedding_scale=math.sqrt(target_cfg.n_embd))


def feature_dtype(device) -> torch.dtype:
    """bf16 on a GPU (the drafter trains under bf16 autocast there), f32 on a CPU (no autocast)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def holdout_eval(model, embd, target, rows: Rows, layer_ids, n_per_kind: int, device) -> dict:
    out = {}
    kinds = rows.data["kind"][rows.holdout]
    for k, name in enumerate(KINDS):
        idx = rows.holdout[kinds == k][:n_per_kind]
        if not len(idx):
            continue
        steps = committed = 0
        for i in idx:
            tok, lens, starts = pad([rows.row(int(i))], device)
            f = features(target, tok, layer_ids, dtype=feature_dtype(device))
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                r = evaluate(model, embd, f, tok, starts.tolist(), lens.tolist(), model.config.block_size)
            steps, committed = steps + r["steps"], committed + r["committed"]
        # each step commits its accepted drafts + 1 bonus token
        out[name] = {"sequences": len(idx), "tau": round(committed / max(steps, 1), 3),
                     "acceptance_rate": round((committed - steps) / max(steps * (model.config.block_size - 1), 1), 4)}
    return out


def mean_tau(result: dict) -> float:
    """One number to pick checkpoints by: held-out tau averaged over kinds (each kind counts alike)."""
    return float(np.mean([r["tau"] for r in result.values()])) if result else 0.0


class Best:
    """The best weights by held-out tau, saved to OUT as they are found. Many epochs over a few million tokens can
    overfit a drafter of 11-14 M parameters; the held-out check every ``--eval-every`` seconds keeps the weights of
    the best point, not of wherever the time budget ended."""

    def __init__(self, out: str, tau: float, result: dict):
        self.out, self.tau, self.result, self.step = out, tau, result, 0

    def offer(self, model, step: int, result: dict, log) -> None:
        tau = mean_tau(result)
        if tau > self.tau:
            self.tau, self.result, self.step = tau, result, step
            save_drafter(model, self.out)
            log(f"step {step}: held-out tau {tau:.3f}, the best so far: saved")
        else:
            log(f"step {step}: held-out tau {tau:.3f} (best {self.tau:.3f} at step {self.step})")


def train(model, embd, target, rows: Rows, layer_ids, args, log, device, best: Best):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = np.random.default_rng(args.seed)
    t0, step, hist, last_eval = time.time(), 0, [], time.time()
    tokens_seen = 0
    while True:
        frac = (time.time() - t0) / args.seconds
        if frac >= 1.0 or (args.max_steps and step >= args.max_steps):
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup)
        if args.schedule == "cosine":
            lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1)))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = rows.batch(rng, args.token_budget, args.max_rows)
        tok, lens, starts = pad([rows.row(i) for i in idx], device)
        # padding sits after each row's end, so the causal mask keeps it out of every real position's features
        if args.distill_topk:
            f, teacher = features_and_teacher(target, tok, layer_ids, dtype=feature_dtype(device))
        else:
            f, teacher = features(target, tok, layer_ids, dtype=feature_dtype(device)), None
        soft = None
        if args.distill_stored:
            soft = dense_soft(rows.data, [(i, int(rows.data["prompt_len"][i]), len(rows.row(i)[0])) for i in idx],
                              tok.shape[1], device)
        hi = (lens - 2).clamp(min=0)
        anchors = starts[:, None] + (torch.rand(len(idx), args.anchors, device=device)
                                     * (hi - starts + 1).clamp(min=1)[:, None]).long()
        anchors = torch.minimum(anchors, hi[:, None])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            # a smaller head chunk with distillation: the teacher's logits take as much memory again
            loss, st = draft_logits_loss(model, embd, f, tok, lens, anchors,
                                         head_chunk=8192 if teacher is None else 4096, teacher=teacher,
                                         topk=args.distill_topk, alpha=args.distill_weight,
                                         soft=soft, soft_weight=args.distill_stored)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += int(lens.sum())
        if time.time() - last_eval > args.eval_every:
            model.eval()
            best.offer(model, step, holdout_eval(model, embd, target, rows, layer_ids, args.eval_per_kind, device), log)
            model.train()
            last_eval = time.time()
        if step % args.log_every == 0:
            acc = st["acc"].tolist()
            hist.append({"step": step, "loss": round(loss.item(), 4), "t": round(time.time() - t0, 1)})
            log(f"step {step} loss {loss.item():.4f} lr {lr:.2e} rows {len(idx)} L {tok.shape[1]} "
                f"acc[1,2,4,8,15] {acc[1]:.3f} {acc[2]:.3f} {acc[4]:.3f} {acc[8]:.3f} {acc[-1]:.3f}")
    return step, hist, tokens_seen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--data", required=True, help="folder(s) of generate.py shards, comma-separated")
    ap.add_argument("--out", required=True)
    ap.add_argument("--init", default="",
                    help="drafter to continue from: a folder (model.safetensors + config.json) or a .safetensors file")
    ap.add_argument("--layers", type=int, default=0, help="drafter depth (0: the init's, or 3 from scratch)")
    ap.add_argument("--keep-layers", default="",
                    help="with --init: keep only these layers of it, e.g. 0,1,2 (a shallower, cheaper drafter)")
    ap.add_argument("--heads", type=int, default=0, help="from scratch: attention heads (0: 4)")
    ap.add_argument("--kv-heads", type=int, default=0, help="from scratch: key/value heads (0: 2)")
    ap.add_argument("--head-dim", type=int, default=0, help="from scratch: width of a head (0: 128)")
    ap.add_argument("--seconds", type=float, default=500)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                    help="after the warmup: cosine decay to a tenth, or the peak LR throughout (gentler to continue)")
    ap.add_argument("--distill-topk", type=int, default=0,
                    help="top-k logit distillation: the target's distribution over its k likeliest tokens (0: off)")
    ap.add_argument("--distill-weight", type=float, default=0.5,
                    help="share of the distillation term in each position's loss (the rest: the hard label)")
    ap.add_argument("--distill-stored", type=float, default=0.0,
                    help="weight of the KL to the target's stored top-k (topk.py: the GGUF's own probabilities) "
                         "against the hard label's cross-entropy (0: off)")
    ap.add_argument("--token-budget", type=int, default=24576, help="row tokens per step (prompt + response)")
    ap.add_argument("--max-rows", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=16, help="draft blocks per row")
    ap.add_argument("--copy-weight", type=float, default=1.0,
                    help=f"draw copying rows ({COPY_ROW_SHARE * 100:.0f}%%+ of the response continues "
                         f"{COPY_NGRAM}-grams of the prompt) this many times as often as others (1: uniform)")
    ap.add_argument("--source-weight", default="",
                    help="PATTERN=W[,PATTERN=W...]: draw the rows of every --data folder whose path contains PATTERN "
                         "W times as often as others of their length (the first pattern that matches; e.g. "
                         "selfgen=0.5 draws the human-written prompts' runs twice as often as the self-generated)")
    ap.add_argument("--max-len", type=int, default=1280)
    ap.add_argument("--holdout", type=float, default=0.02)
    ap.add_argument("--holdout-from", default="",
                    help="hold out whole documents, only from the --data folders whose path has this in it "
                         "(selfgen: prompts of the target's own distribution pick the checkpoint); default: any row")
    ap.add_argument("--eval-every", type=float, default=150, help="seconds between held-out checks (best kept)")
    ap.add_argument("--eval-per-kind", type=int, default=24)
    ap.add_argument("--target-layers", default="1,4,8,12,15")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    if args.init and (args.heads or args.kv_heads or args.head_dim):
        ap.error("--heads, --kv-heads and --head-dim shape a drafter from scratch; --init's config fixes them")
    if args.keep_layers and not args.init:
        ap.error("--keep-layers picks layers of --init's drafter")
    if args.copy_weight <= 0:
        ap.error("--copy-weight must be above 0")
    folders = args.data.split(",")
    try:
        folder_weight = source_weights(args.source_weight, folders)
    except ValueError as e:
        ap.error(f"--source-weight: {e}")
    named = [i for i, d in enumerate(folders) if args.holdout_from and args.holdout_from in d]  # --holdout-from's
    if args.holdout_from and not named:
        ap.error(f"--holdout-from {args.holdout_from!r}: no folder of --data has it in its path")
    if not 0 <= args.distill_stored <= 1 or (args.distill_stored and args.distill_topk):
        ap.error("--distill-stored is a weight in [0, 1], and excludes --distill-topk (the port's teacher)")
    device = torch.device(args.device)
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train.log"))
    torch.manual_seed(args.seed)
    # TF32 for the frozen target's features: their error vs llama.cpp (0.6-3 %, docs/drafter.md) already dwarfs it
    torch.backends.cuda.matmul.allow_tf32 = True
    t_start = time.time()

    cfg, w = load_gguf_weights(args.gguf, threads=16)
    target = GemmaTarget(cfg, w, dtype=torch.float32, device=device)
    del w
    embd = target.embd.to(feature_dtype(device))
    log(f"target loaded on {device}")
    layer_ids = [int(x) for x in args.target_layers.split(",")]
    data = load_shards(args.data)
    if args.distill_stored and "topk_ids" not in data:
        raise ValueError(f"--distill-stored: the shards of {args.data} carry no top-k (python -m pydflash.train.topk)")
    # the committed runs predate the frozen evaluation set: its prompts (and the benchmark's) are dropped here too
    drop = keep_out.held_token_rows((data["tokens"][s:s + p] for s, p in zip(data["starts"], data["prompt_len"])),
                                    args.gguf)
    log(f"dropped {int(drop.sum())} rows whose prompt holds an evaluation or benchmark prompt")
    hold_from = None
    if named:  # the held-out check on the folders named, whole documents (split_documents)
        hold_from = np.isin(data["source"], named)
        log(f"held-out rows from {len(named)} of {len(folders)} folders, whole documents")
    rows = Rows(data, args.max_len, args.holdout, args.seed, args.copy_weight, drop, hold_from,
                np.asarray(folder_weight)[data["source"]])
    resp = int((data["lens"][rows.train] - data["prompt_len"][rows.train]).sum())
    log(f"rows: {len(rows.train)} train ({resp} response tokens), {len(rows.holdout)} held out")
    copy = rows.copy_stats()
    log(f"copying rows ({COPY_ROW_SHARE:.0%}+ of the response continues {COPY_NGRAM}-grams of the prompt): "
        f"{copy['copy_rows']} ({copy['copy_row_share']:.1%} of rows, {copy['copy_row_response_token_share']:.1%} "
        f"of response tokens); {copy['copied_token_share']:.1%} of all response tokens copy; "
        f"--copy-weight {args.copy_weight:g}: ~{copy['copy_draw_share']:.1%} of row draws go to copying rows")
    if args.source_weight:
        src = data["source"][rows.train]
        for n, folder in enumerate(folders):
            log(f"--source-weight: {folder} weight {folder_weight[n]:g}, {int((src == n).sum())} rows, "
                f"~{rows.draw_share(src == n):.1%} of row draws")

    if args.init:
        keep = [int(x) for x in args.keep_layers.split(",")] if args.keep_layers else None
        model = load_init(args.init, args.layers, device, keep)
    else:
        model = DFlashDrafter(scratch_config(cfg, args, layer_ids)).to(device)
    if list(model.config.target_layer_ids) != layer_ids:
        raise ValueError(f"--target-layers {layer_ids} differ from the drafter's {model.config.target_layer_ids}")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"drafter: {model.config.num_hidden_layers} layers, {n_params / 1e6:.2f} M parameters")

    model.eval()
    before = holdout_eval(model, embd, target, rows, layer_ids, args.eval_per_kind, device)
    log(f"held-out tau before: {before}")
    # the starting point counts as a candidate: if training never beats it, OUT holds the initial weights
    save_drafter(model, args.out)
    best = Best(args.out, mean_tau(before), before)
    model.train()
    steps, hist, seen = train(model, embd, target, rows, layer_ids, args, log, device, best)
    model.eval()
    end = holdout_eval(model, embd, target, rows, layer_ids, args.eval_per_kind, device)
    best.offer(model, steps, end, log)
    after = best.result
    log(f"held-out tau at the end: {end}; kept (step {best.step}): {after}")
    metrics = {"drafter_params": n_params, "layers": model.config.num_hidden_layers,
               "train_rows": int(len(rows.train)), "train_response_tokens": resp, "copy": copy,
               "train_steps": steps, "row_tokens_seen": seen, "holdout_before": before, "holdout_after": after,
               "holdout_end": end, "kept_step": best.step,
               "loss_history": hist, "total_seconds": round(time.time() - t_start, 1), "args": vars(args)}
    with open(os.path.join(args.out, "train.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    log("done", metrics["total_seconds"])


if __name__ == "__main__":
    main()
