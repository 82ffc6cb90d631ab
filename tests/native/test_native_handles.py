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


def test_per_sequence_streams_decode_like_the_pool(tiny):
    """ContextParams(kv_unified=False), the alternative to the pool: several sequences
    decode to the same greedy picks, each in its own stream."""
    p = tiny("llama")
    model = Model(p.target)
    tokens = [(i * 7 + 3) % (model.n_vocab - 16) + 8 for i in range(12)]
    picks = {}
    for unified in (True, False):
        ctx = Context(model, ContextParams(n_ctx=4 * 32, n_batch=32, n_ubatch=32, n_seq_max=4, n_outputs_max=4,
                                           kv_unified=unified))
        b = TokenBatch(32)
        for s in range(4):
            b.clear()
            b.add(tokens[s:s + 6], 0, s, False)
            ctx.decode(b)
        b.clear()
        for s in range(4):
            b.add([tokens[s + 6]], 6, s, True)
        ctx.decode(b)
        picks[unified] = ctx.picks(range(4))
        assert [ctx.seq_pos_max(s) for s in range(4)] == [6] * 4
        ctx.close()
    assert picks[True] == picks[False]


def test_ctrl_c_inside_the_log_callback_is_not_lost(tiny, monkeypatch, capfd):
    """A KeyboardInterrupt raised while llama.cpp is inside our log callback (a Ctrl-C landing there; seen in the
    CLI's Ctrl-C test) cannot cross ctypes, which printed "Exception ignored" and dropped it: the decode that was
    running raises it when it returns."""
    import sys

    from pydflash.native import _lib

    monkeypatch.setattr(sys, "unraisablehook", _lib._keep_interrupts)  # pytest puts its own in for each test

    class Interrupting:
        def append(self, _msg):
            raise KeyboardInterrupt

    model = Model(tiny("qwen3").target)
    ctx = Context(model, ContextParams(n_ctx=64, n_batch=16, n_ubatch=16))
    b = TokenBatch(16)
    b.add([5, 6, 7], 0, 0, True)
    monkeypatch.setattr(_lib, "recent_errors", Interrupting())
    real = _lib.C.llama_decode

    def decode_that_logs(*args):  # llama.cpp calls our callback in the middle of a decode
        _lib._log(_lib.GGML_LOG_LEVEL_ERROR, b"an error line\n", None)  # through ctypes, as llama.cpp calls it
        return real(*args)

    monkeypatch.setattr(_lib.C, "llama_decode", decode_that_logs)
    with pytest.raises(KeyboardInterrupt):
        ctx.decode(b)
    assert "Exception ignored" not in capfd.readouterr().err
    assert not _lib.interrupted
    monkeypatch.setattr(_lib.C, "llama_decode", real)
    b.clear()
    b.add([8], 3, 0, True)
    ctx.decode(b)  # nothing left pending: the next call runs
    ctx.close()


def test_step_bookkeeping_keeps_the_gil_and_forwards_release_it():
    """The calls a step makes dozens of times (rollbacks, picks, feature rows) hold the GIL: in a server worker the
    event loop's thread would otherwise take it at each one, and the engine thread waits up to the switch interval
    to get it back. A forward must still let that thread run (it sends the streams meanwhile)."""
    import ctypes

    from pydflash.native import _lib

    keeps = [_lib.memory_seq_rm, _lib.memory_seq_pos_max, _lib.memory_seq_pos_min, _lib.sampler_accept,
             _lib.vocab_is_eog,
             _lib.get_sampled_token_ith, _lib.get_sampled_tokens, _lib.embeddings_layer_inp_addr,
             _lib.llama_set_embeddings_layer_inp]
    pythonapi = ctypes._FUNCFLAG_PYTHONAPI
    assert all(fn._flags_ & pythonapi for fn in keeps)
    assert not any(fn._flags_ & pythonapi for fn in (_lib.C.llama_decode, _lib.C.llama_synchronize))
