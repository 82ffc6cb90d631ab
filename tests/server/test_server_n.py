"""``n`` choices per prompt through a real uvicorn and the real ``openai`` client: n indexed choices (streamed
too, each finished once), seeded choices that differ from each other, the prompt's prefill shared
(the others reuse the first choice's prompt from the prompt cache), usage summed, n capped at the slots, best_of
only equal to n."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.server_util import Server, write_models_toml

from pydflash.server.choices import choice_seed

CHAT = [{"role": "user", "content": "hello"}]
N_SLOTS = 3


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    cfg = write_models_toml(tmp_path_factory.mktemp("n") / "models.toml", {
        "tiny": {"target": str(pair.target), "drafter": str(pair.drafter), "n_slots": N_SLOTS, "n_ctx_slot": 512},
    })
    srv = Server(["--config", str(cfg)])
    yield srv
    srv.stop()


def _tokens(choice) -> list[int]:
    return choice.model_extra["tokens"]


def test_n_seeded_choices_differ(server):
    """Each choice is its own request with its own seed (choice_seed). The same text again is not asserted: the
    engine promises it only with the same batch composition, and choice 1 joins choice 0's batch after its first
    token, at a time the scheduler decides (docs/sampling.md, Seeds)."""
    client = server.openai()
    out = client.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=12, n=2, seed=7,
                                    temperature=1.0, extra_body={"ignore_eos": True, "return_tokens": True})
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage.completion_tokens == 24
    assert _tokens(out.choices[0]) != _tokens(out.choices[1])


def test_choice_seeds_are_the_seed_then_distinct_mixes():
    assert choice_seed(7, 0) == 7 and choice_seed(None, 3) is None
    seeds = [choice_seed(7, j) for j in range(8)]
    assert len(set(seeds)) == 8 and seeds == [choice_seed(7, j) for j in range(8)]
    assert all(0 <= s < 2**32 for s in seeds)


def test_the_others_reuse_the_first_choices_prompt(server):
    client = server.openai()
    prompt = " ".join(f"word{i}" for i in range(120))  # past one cache block, new to the server
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, n=3, temperature=1.0,
                                    extra_body={"return_tokens": True})
    n_prompt = out.usage.prompt_tokens  # counted once
    assert len(out.choices) == 3 and n_prompt > 64
    cached = out.model_extra["timings"]["cache_n"]  # over every choice; the first had nothing cached
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    assert cached >= 2 * (n_prompt - 40), (cached, n_prompt)  # each other reused all but the last partial block


def test_chat_n_streams_interleaved_choices(server):
    client = server.openai()
    stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, n=2, temperature=1.0,
                                            stream=True, stream_options={"include_usage": True})
    text, finished, usage = {0: "", 1: ""}, [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason is not None:
                finished.append(c.index)
    assert sorted(finished) == [0, 1]
    assert usage.completion_tokens >= 2
    full = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, n=2, temperature=1.0)
    assert [c.index for c in full.choices] == [0, 1]


def test_n_past_the_slots_and_best_of_are_400s(server):
    client = server.openai()
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, n=N_SLOTS + 1)
    assert info.value.param == "n"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, n=2, best_of=3)
    assert info.value.param == "best_of" and "score" in info.value.message
    out = client.completions.create(model="tiny", prompt="x", max_tokens=2, n=2, best_of=2)
    assert len(out.choices) == 2
