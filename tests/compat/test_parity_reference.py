"""Our GGUF drafter path against the PyTorch reference (z-lab ``dflash`` 0.1.0, DFlashDraftModel).

Same tiny F32 weights in both layouts (factory: drafter.gguf and drafter-hf/), same target features, same noise
block [anchor, MASK x 15] right after a 12-token context. The reference gets:
- its features through its own ``extract_context_feature`` (hidden_states[id + 1]) from the target's layer inputs,
  so a layer-offset slip in our GGUF (``dflash.target_layers`` = HF id + 1) fails here;
- its noise embeddings as ``embedding[block] * input_embedding_scale`` from its config.json, exactly as
  ``dflash_generate`` does, so our inherited scale must be applied exactly once.

Tolerance: logits agree to ~6e-4 of the position's largest logit (measured: qwen3 4.8e-4, gemma3 6.5e-4), not to
F32 rounding; llama.cpp's default F16 K/V cache is the likely cause. A wrong scale is off by 0.53-1.08.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity needs torch (pip install -e .[parity])")
ref_model = pytest.importorskip(
    "dflash.model", reason="parity needs z-lab dflash 0.1.0 with transformers (pip install --no-deps dflash==0.1.0)"
)

from transformers.utils import logging as hf_logging  # noqa: E402

from tests.helpers.compat_helpers import block_logits  # noqa: E402
from tests.helpers.zlab_helpers import REL_TOL, rel_diff  # noqa: E402
from tests.helpers.zlab_helpers import reference_logits as zlab_reference_logits  # noqa: E402
from pydflash.pair import load_pair  # noqa: E402

hf_logging.disable_progress_bar()


def reference_logits(p, hidden, scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(reference features, reference logits [B, V]) of a factory pair's drafter-hf/; scale=None takes
    input_embedding_scale from config.json."""
    return zlab_reference_logits(p.config_json.parent, p.target, hidden, scale)


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def ours(request, tiny):
    p = tiny(request.param)
    pair = load_pair(p.target, p.drafter)  # gemma3: the scale comes from inheritance (drafter.gguf has no key)
    try:
        feats, logits, hidden = block_logits(pair, all_layers=True)
    finally:
        pair.close()
    return p, feats, logits, hidden


def test_reference_selects_the_same_target_features(ours):
    p, feats, _, hidden = ours
    ref_feats, _ = reference_logits(p, hidden)
    assert np.array_equal(ref_feats, feats), "dflash.target_layers is not HF target_layer_ids + 1"


def test_drafter_logits_match_reference(ours):
    p, _, logits, hidden = ours
    _, ref = reference_logits(p, hidden)
    rel = rel_diff(logits, ref)
    print(f"{p.arch}: max abs {np.abs(logits - ref).max():.3g}, max rel {rel.max():.3g} over {len(rel)} positions")
    assert rel.max() < REL_TOL, f"positions over tolerance: {np.flatnonzero(rel >= REL_TOL).tolist()}"
    assert (logits.argmax(axis=1) == ref.argmax(axis=1)).all()


@pytest.mark.parametrize("stored_scale, label", [(64.0, "scaled twice"), (1.0, "not scaled")])
def test_parity_catches_a_wrong_gemma_scale(tiny, stored_scale, label):
    """A drafter applying sqrt(E)^2 (or nothing) on a gemma3 target fails the comparison above by far."""
    p = tiny("gemma3", embedding_scale_key=stored_scale)
    pair = load_pair(p.target, p.drafter, allow_scale_mismatch=True)
    try:
        _, logits, hidden = block_logits(pair, all_layers=True)
    finally:
        pair.close()
    _, ref = reference_logits(p, hidden)
    rel = rel_diff(logits, ref)
    print(f"{label}: rel diff per position {rel.min():.3g} .. {rel.max():.3g}")
    assert rel.min() > 50 * REL_TOL, f"{label}: parity did not notice (min rel {rel.min():.3g})"
    # and it is the scale alone: the reference with the same wrong scale agrees again
    _, ref_wrong = reference_logits(p, hidden, scale=stored_scale)
    assert rel_diff(logits, ref_wrong).max() < REL_TOL
