"""The worker tokenizes with its own vocabulary-only copy of the target's tokenizer: the same tokens as the engine's
model, and a request reaches the engine once (its submit), never for tokenizing or an echo."""

from __future__ import annotations

import asyncio
import json

import pytest

from pydflash.native import Model
from pydflash.server.preset import Preset
from pydflash.server.tokenizer import Tokenizer

TEXTS = ["hello world", "<start_of_turn>user\nhi<end_of_turn>\n", "ünïcödé 日本語 " * 20, " leading space", ""]


@pytest.fixture(scope="module")
def pair(tiny):
    return tiny("gemma3")


def test_the_worker_tokenizer_is_the_engine_models(pair):
    tok, model = Tokenizer(str(pair.target)), Model(pair.target)
    try:
        async def both(text, add_special, parse_special):
            return await tok.tokenize(text, add_special, parse_special), model.tokenize(text, add_special,
                                                                                         parse_special)

        for text in TEXTS:
            for flags in [(True, False), (False, False), (True, True), (False, True)]:
                mine, theirs = asyncio.run(both(text, *flags))
                assert mine == theirs, (text, flags)
        ids = model.tokenize("the quick brown fox", True)
        assert tok.echo_text(ids) == model.detokenize(ids).decode("utf-8", "replace")
        assert tok.detokenize(ids) == model.detokenize_text(ids).decode("utf-8", "replace")
        with pytest.raises(Exception, match="outside the vocabulary"):
            tok.detokenize([tok.n_vocab])
    finally:
        tok.close()
        model.close()


def test_a_request_reaches_the_engine_once(pair):
    """Through the worker app (in-process, as a Ray replica runs it): a string prompt with echo, a chat and
    /tokenize make one submit each and no engine call at all."""
    from pydflash.server.ray.inprocess_worker import InProcessWorker

    async def main():
        worker = await InProcessWorker.load(Preset(name="tiny", target=str(pair.target), drafter=str(pair.drafter),
                                                   n_slots=2, n_ctx_slot=256))
        engine = worker.engine
        seen = {"call": 0, "submit": 0}
        call, submit = engine.call, engine.submit

        async def counted_call(fn, *args):
            seen["call"] += 1
            return await call(fn, *args)

        def counted_submit(req, sink):
            seen["submit"] += 1
            submit(req, sink)

        engine.call, engine.submit = counted_call, counted_submit

        async def post(path, body) -> dict:
            parts = [p async for p in worker.call(path, json.dumps(body).encode())]
            assert parts[0].status == 200, parts
            return json.loads(b"".join(parts[1:]))

        try:
            out = await post("/v1/completions", {"prompt": "hello there", "max_tokens": 4, "temperature": 0,
                                                 "echo": True})
            assert out["choices"][0]["text"].lstrip().startswith("hello there")  # the pieces: a leading space
            assert seen == {"call": 0, "submit": 1}
            await post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            tokens = (await post("/tokenize", {"content": "hello there"}))["tokens"]
            assert (await post("/detokenize", {"tokens": tokens}))["content"] == "hello there"
            assert seen == {"call": 0, "submit": 2}
            # special-token text is that token, in /tokenize and in a completion's prompt, as llama-server reads
            # it (a Gemma-format transcript's "<start_of_turn>" is one token, not seven pieces)
            eos = 2  # "</s>" in the factory vocabulary (pydflash/factory/tokenizer.py)
            special = (await post("/tokenize", {"content": "the</s>of"}))["tokens"]
            plain = (await post("/tokenize", {"content": "the</s>of", "parse_special": False}))["tokens"]
            assert eos in special and eos not in plain and len(plain) > len(special)
            out = await post("/v1/completions", {"prompt": "the</s>of", "max_tokens": 1, "temperature": 0})
            assert out["usage"]["prompt_tokens"] == len(special) + 1  # and BOS
        finally:
            worker.close()

    asyncio.run(main())
