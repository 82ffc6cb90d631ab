"""Helpers for the tests that run z-lab's own code (``dflash`` 0.1.0 on torch): a tiny DFlashDraftModel saved as
z-lab saves its drafters, and its reference logits for one noise block. Not a test module; torch and dflash are
imported inside the functions, so a module importing this one still collects (and skips) without them."""

from __future__ import annotations

import numpy as np

from tests.helpers.compat_helpers import ANCHOR, CTX_TOKENS, target_tables

REL_TOL = 2e-3  # per position, of the largest |logit| (tests/compat/test_parity_reference.py: measured 5e-4 .. 7e-4)


def save_zlab_drafter(folder, p, seed: int = 0, n_layer: int = 1, **dflash_config):
    """A DFlashDraftModel for the tiny target of TinyPair ``p`` (its widths, layer count, mask token), saved with
    ``save_pretrained`` (model.safetensors + config.json). dflash_config entries override the defaults."""
    import torch
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    cfg = Qwen3Config(hidden_size=p.n_embd, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      intermediate_size=128, num_hidden_layers=n_layer, vocab_size=p.n_vocab, rms_norm_eps=1e-6,
                      rope_theta=1e6, max_position_embeddings=4096, tie_word_embeddings=False)
    cfg.architectures = ["DFlashDraftModel"]
    cfg.num_target_layers = p.n_layer
    cfg.block_size = 16
    cfg.dflash_config = {"mask_token_id": p.mask_token_id, "target_layer_ids": list(p.target_layer_ids),
                         "block_size": 16, **dflash_config}
    torch.manual_seed(seed)
    model = DFlashDraftModel(cfg)
    with torch.no_grad():  # HF's init (std 0.02) drafts one token everywhere; unit-gain weights, like the factory's
        for prm in model.parameters():
            if prm.ndim == 2:
                prm.normal_(0.0, prm.shape[1] ** -0.5)
            else:
                prm.copy_(1.0 + 0.1 * torch.randn_like(prm))
    model.save_pretrained(str(folder))
    return folder


def reference_logits(model_dir, target_path, hidden, scale: float | None = None):
    """(reference features [n, L*E], reference logits [B, V]) for the block [ANCHOR, MASK x (B-1)] after CTX_TOKENS.

    hidden: HF's output_hidden_states list as llama.cpp layer inputs (compat_helpers.block_logits(all_layers=True)).
    The noise is scaled by ``scale`` (None: the config's input_embedding_scale) and the logits capped by the
    config's final_logit_softcapping, as z-lab's dflash_generate and compute_logits do."""
    import torch
    from dflash import model as ref_model

    model = ref_model.DFlashDraftModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    if scale is None:
        scale = float(model.config.dflash_config.get("input_embedding_scale", 1.0))
    embd, head = target_tables(target_path)
    n, B = len(CTX_TOKENS), model.block_size
    block = [ANCHOR] + [model.mask_token_id] * (B - 1)
    with torch.inference_mode():
        target_hidden = ref_model.extract_context_feature([torch.from_numpy(h)[None] for h in hidden],
                                                          model.target_layer_ids)  # [1, n, L*E]
        noise = torch.from_numpy(np.array(embd[block]))[None] * scale  # [1, B, E]
        out = model(position_ids=torch.arange(n + B)[None], noise_embedding=noise, target_hidden=target_hidden)
        lm_head = torch.nn.Linear(head.shape[1], head.shape[0], bias=False)
        lm_head.weight.data = torch.from_numpy(np.array(head))
        logits = model.compute_logits(out, lm_head)[0]
    return target_hidden[0].numpy(), logits.numpy()


def rel_diff(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per position: max |ours - ref| / max |ref|."""
    return np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)
