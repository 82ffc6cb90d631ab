"""Constrained output (grammar, json_schema) under speculation.

- the schema converter: a supported schema becomes GBNF, an unsupported one is an InvalidRequest naming
  json_schema; an unparsable grammar is refused before anything is queued;
- the tiny llama pair: GBNF and json_schema outputs match (parse, validate) in greedy, sample-and-match and
  rejection modes, and greedy speculation gives plain decoding's tokens;
- the real Gemma-3-270M pair (real_model): a json_schema answer parses and validates, a banned token stays out,
  and acceptance with and without a constraint (printed; docs/sampling.md has the figures).
"""

from __future__ import annotations

import json
import re

import pytest

from pydflash.engine.request import Request
from pydflash.errors import InvalidRequest

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
# bounded, so that even a random model reaches the end
GBNF = 'root ::= word (" " word){0,3} " = " [0-9]{1,3} "."\nword ::= [a-z]{1,6}'
GBNF_RE = re.compile(r"[a-z]{1,6}( [a-z]{1,6}){0,3} = [0-9]{1,3}\.")


def test_a_schema_becomes_gbnf_and_bad_ones_are_refused():
    r = Request("x", json_schema=SCHEMA)
    assert r.on_host and "root ::=" in r._gbnf
    assert Request("x", json_schema=json.dumps(SCHEMA))._gbnf == r._gbnf
    for bad in ({"type": "nope"}, {"not": {"type": "string"}}, {"$ref": "https://example.com/s.json"}, "[1, 2",
                ["a"]):
        with pytest.raises(InvalidRequest, match="json_schema"):
            Request("x", json_schema=bad)
    for bad in ("", 3):
        with pytest.raises(InvalidRequest, match="grammar"):
            Request("x", grammar=bad)
    with pytest.raises(InvalidRequest, match="ignore_eos"):
        Request("x", grammar=GBNF, ignore_eos=True)


@pytest.fixture(scope="module")
def llms(tiny):
    from pydflash import api
    from pydflash.config import EngineConfig

    p = tiny("llama")
    cfg = dict(n_slots=4, n_ctx_slot=256, adaptive=False)
    with api.load(p.target, config=EngineConfig(draft_max=0, **cfg)) as plain, \
            api.load(p.target, p.drafter, config=EngineConfig(draft_max=4, **cfg)) as spec:
        yield plain, spec


def test_an_unparsable_grammar_is_refused_before_queueing(llms):
    _, spec = llms
    with pytest.raises(InvalidRequest, match="grammar"):
        spec.engine.submit(Request("x", grammar="root ::= undefined-rule"))
    with pytest.raises(InvalidRequest, match="grammar"):
        spec.engine.submit(Request("x", grammar='root ::= "unterminated'))
    assert not spec.engine.queue


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.9, sampling_mode="match"),
                                dict(temperature=0.9, sampling_mode="rejection")], ids=["greedy", "match", "rejection"])
def test_outputs_follow_the_grammar(llms, kw):
    """A tiny random model left alone never writes either shape; constrained, each stopped answer matches."""
    import jsonschema

    plain, spec = llms
    for seed in range(3):
        g = spec.generate("x", max_tokens=120, grammar=GBNF, seed=seed, **kw)
        assert g.finish_reason == "stop" and GBNF_RE.fullmatch(g.text), g.text
        j = spec.generate("x", max_tokens=200, json_schema=SCHEMA, seed=seed, **kw)
        assert j.finish_reason == "stop", j.text
        jsonschema.validate(json.loads(j.text), SCHEMA)
        assert j.stats.n_drafted > 0
    free = plain.generate("x", max_tokens=40)
    assert not GBNF_RE.fullmatch(free.text)


def test_greedy_speculation_equals_plain_decoding_under_a_grammar(llms):
    plain, spec = llms
    for kw in (dict(grammar=GBNF), dict(json_schema=SCHEMA), dict(json_schema=SCHEMA, repeat_penalty=1.3)):
        want = plain.generate("the cat", max_tokens=120, **kw)
        got = spec.generate("the cat", max_tokens=120, **kw)
        assert got.tokens == want.tokens and got.stats.n_drafted > 0


# --- the real Gemma-3-270M pair ---------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                   "city": {"type": "string", "maxLength": 20}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PROMPT = "Alice is 31 and lives in Paris. As JSON with fields name, age and city:\n"


@pytest.fixture(scope="module")
def gemma(gemma_path):
    from pydflash import api
    from pydflash.config import EngineConfig
    from pydflash.defaults import SHIPPED_DRAFTER

    with api.load(gemma_path, SHIPPED_DRAFTER, config=EngineConfig(n_slots=1, n_ctx_slot=512)) as llm:
        yield llm


@pytest.mark.real_model
def test_gemma_json_schema_answer_validates(gemma):
    import jsonschema

    r = gemma.generate(PROMPT, max_tokens=64, json_schema=PERSON)
    assert r.finish_reason == "stop", r.text
    doc = json.loads(r.text)
    jsonschema.validate(doc, PERSON)
    assert r.stats.n_drafted > 0
    print(f"\njson_schema: {r.text!r} drafted {r.stats.n_drafted} accepted {r.stats.n_accepted}")


@pytest.mark.real_model
def test_gemma_logit_bias_removes_a_token(gemma):
    prompt = "def fib(n):\n"
    free = gemma.generate(prompt, max_tokens=24)
    banned = free.tokens[0]
    got = gemma.generate(prompt, max_tokens=24, logit_bias={banned: -100})
    assert banned not in got.tokens and got.tokens != free.tokens


@pytest.mark.real_model
def test_gemma_acceptance_with_and_without_a_constraint(gemma):
    """Measured, not gated beyond "drafts are accepted": the numbers go into docs/sampling.md."""
    prompts = [PROMPT, "Bob is 45 and lives in Rome. As JSON with fields name, age and city:\n",
               "Carol, 27, from Oslo. As JSON with fields name, age and city:\n"]
    rows = {}
    for name, kw in {"free": {}, "json_schema": dict(json_schema=PERSON)}.items():
        drafted = accepted = steps = tokens = 0
        for p in prompts:
            r = gemma.generate(p, max_tokens=48, **kw)
            drafted, accepted = drafted + r.stats.n_drafted, accepted + r.stats.n_accepted
            steps, tokens = steps + r.stats.n_steps, tokens + len(r.tokens)
        rows[name] = (accepted / max(drafted, 1), tokens / max(steps, 1))
        print(f"\n{name}: acceptance {rows[name][0]:.3f}, tokens per step {rows[name][1]:.2f} "
              f"({accepted}/{drafted} drafts, {tokens} tokens)")
    assert rows["json_schema"][0] > 0


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pydflash.cli.speculative", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_json_schema_and_bad_control_flags(tiny, tmp_path):
    p = tiny("llama")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    r = _cli("-m", str(p.target), "-md", str(p.drafter), "-p", "x", "-n", "200", "--json-schema-file", str(schema),
             "--repeat-penalty", "1.2", "-l", "5-inf", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(SCHEMA["required"]) <= set(json.loads(out["text"]))
    for bad in (["-l", "5x"], ["--min-p", "3"], ["--grammar", "root ::= nope"], ["--json-schema", '{"type": "zz"}'],
                ["-l", "99999-inf"]):
        r = _cli("-m", str(p.target), "-p", "x", "-n", "4", *bad)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
