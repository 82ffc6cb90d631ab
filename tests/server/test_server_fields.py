"""A field that changes the output is applied or refused, never accepted and ignored (server/fields.py), through a
real uvicorn and the real ``openai`` client: every refused field, at a value that would change the output, is a 400
whose ``param`` names it, on both endpoints; at its neutral value it is accepted and changes nothing; n_predict is
applied; docs/server.md's table says what the code does."""

from __future__ import annotations

import pathlib
import re

import openai
import pytest

from tests.helpers.server_util import REPO, Server, write_models_toml

from pydflash.server.fields import APPLIED, NO_EFFECT, REFUSED

# a value of each refused field that would change the output
CHANGING = {
    "suffix": "\n}\n",
    "functions": [{"name": "f", "parameters": {}}], "function_call": {"name": "f"},
    "mirostat": 2, "typical_p": 0.9, "tfs_z": 0.95, "top_n_sigma": 1.5, "xtc_probability": 0.5,
    "dry_multiplier": 0.8, "dynatemp_range": 0.5, "samplers": ["top_k", "temperature"], "n_probs": 3,
    "t_max_predict_ms": 100,
}
NEUTRAL = {"function_call": "none", "functions": [], "mirostat": 0, "suffix": "", "typical_p": 1}
# applied fields at values that change nothing: still the same text
APPLIED_NEUTRAL = {"n": 1, "best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "repeat_penalty": 1,
                   "repeat_last_n": 64, "logit_bias": {}, "grammar": "", "response_format": {"type": "text"},
                   "min_p": 0}
PROMPT = "the quick brown fox"
CHAT = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    pair = tiny("gemma3")
    cfg = write_models_toml(tmp_path_factory.mktemp("fields") / "models.toml", {
        "tiny": {"target": str(pair.target), "drafter": str(pair.drafter), "n_slots": 2, "n_ctx_slot": 256},
    })
    srv = Server(["--config", str(cfg)])
    yield srv
    srv.stop()


def test_every_refused_field_has_a_changing_value_here():
    assert set(CHANGING) == set(REFUSED)
    assert not any(REFUSED[f].accepts(v) for f, v in CHANGING.items())
    assert set(NEUTRAL) <= set(REFUSED) and all(REFUSED[f].accepts(v) for f, v in NEUTRAL.items())


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_a_refused_field_is_a_400_naming_it(server, field):
    client = server.openai()
    calls = [lambda extra: client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, extra_body=extra),
             lambda extra: client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4,
                                                          extra_body=extra)]
    for call in calls:
        with pytest.raises(openai.BadRequestError) as info:
            call({field: CHANGING[field]})
        err = info.value
        assert err.status_code == 400 and err.param == field, (err.param, err.body)
        assert err.type == "invalid_request_error" and field in err.message


def test_neutral_values_are_accepted_and_change_nothing(server):
    client = server.openai()

    def text(**extra):
        out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True, **extra})
        return out.choices[0].text

    plain = text()
    assert text(**NEUTRAL) == plain
    assert text(**APPLIED_NEUTRAL) == plain
    chat = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, temperature=0, n=1,
                                          presence_penalty=0, logit_bias={}, response_format={"type": "text"})
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_n_predict_is_applied(server):
    client = server.openai()
    out = client.completions.create(model="tiny", prompt=PROMPT, temperature=0,
                                    extra_body={"n_predict": 5, "ignore_eos": True})
    assert out.usage.completion_tokens == 5
    out = client.chat.completions.create(model="tiny", messages=CHAT, temperature=0,
                                         extra_body={"n_predict": 3, "ignore_eos": True})
    assert out.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=PROMPT, extra_body={"n_predict": 0})
    assert info.value.param == "n_predict"


def doc_table() -> dict[str, str]:
    """docs/server.md's field table: field -> its status column."""
    text = pathlib.Path(REPO, "docs", "server.md").read_text(encoding="utf-8")
    start = text.index("## Request fields")
    rows = re.findall(r"^\| `([a-z_]+)` \| (applied|refused|no effect) \|", text[start:], flags=re.M)
    return dict(rows)


def test_the_docs_table_says_what_the_code_does():
    expected = {**{f: "applied" for f in APPLIED}, **{f: "refused" for f in REFUSED},
                **{f: "no effect" for f in NO_EFFECT}}
    assert doc_table() == expected
