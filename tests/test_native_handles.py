"""Native owners and typed errors: no abort, no leak, recoverable KV-full."""

from __future__ import annotations

import pytest

from pydflash.errors import KVSlotFull, ModelLoadError
from pydflash.native import Context, ContextParams, Model, ModelParams, TokenBatch


def test_kv_full_is_typed_and_recoverable(tiny):
    model = Model(tiny("qwen3").target)
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=256, n_ubatch=256))
    b = TokenBatch(256)
    b.add([5] * 200, 0, 0, False)
    ctx.decode(b)
    b.clear()
    b.add([6] * 100, 200, 0, False)  # 300 cells > 256
    with pytest.raises(KVSlotFull) as exc:
        ctx.decode(b)
    assert exc.value.code == 1
    assert ctx.seq_pos_max(0) == 199  # the failed batch left nothing behind
    ctx.seq_rm(0, 100)  # make room: the caller can recover
    b.clear()
    b.add([6] * 100, 100, 0, True)
    ctx.decode(b)
    assert ctx.seq_pos_max(0) == 199


def test_oversized_batch_raises_instead_of_aborting(tiny):
    model = Model(tiny("qwen3").target)
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=32, n_ubatch=32))
    b = TokenBatch(64)
    b.add([5] * 40, 0, 0, False)
    with pytest.raises(ValueError, match="n_batch"):
        ctx.decode(b)


def test_close_order_and_idempotence(tiny):
    model = Model(tiny("qwen3").target)
    ctx = Context(model, ContextParams(n_ctx=64))
    ctx.close()
    ctx.close()
    model.close()
    model.close()
    with pytest.raises(ModelLoadError):
        model.ptr  # noqa: B018


def test_kv_override_reaches_the_model(tiny):
    p = tiny("qwen3")
    model = Model(p.target, ModelParams(kv_overrides={"tokenizer.ggml.eos_token_id": 7}))
    assert model.eos == 7 and model.is_eog(7)


def test_bad_params_are_value_errors():
    with pytest.raises(ValueError):
        ContextParams(n_batch=8, n_ubatch=16)
    with pytest.raises(ValueError):
        ModelParams(n_gpu_layers=-2)
