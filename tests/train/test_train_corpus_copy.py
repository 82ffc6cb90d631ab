"""The corpus's copy-once prompts (corpus_synth.copy_once, ``corpus.py --copy-once``): a passage seen once, a cue
and the passage's opening, so that the target copies text it has seen once. Off by default: the pinned seed-0 and
seed-1 corpora (scripts/dev/prepare_carry.sh) must build as before, and no kind's count may move."""
import random

import pytest

from pydflash.train import corpus
from pydflash.train import corpus_synth as synth

N = 300
HELDOUT = ["The quarterly harvest report lists barley, rye and spelt yields per valley."]


class FakeFeed:
    def __init__(self, text: str):
        self.text = text

    def code(self, chars):
        return "py", "    " + self.text[:int(chars)]

    def prose(self, chars):
        return "\n" + self.text[:int(chars)]


def test_copy_once_is_a_passage_a_cue_and_its_opening():
    # words without digits (est_tokens counts each digit a token)
    text = " ".join("w" + chr(97 + i % 26) + chr(97 + i // 26) for i in range(400))
    rng = random.Random(0)
    seen = set()
    for _ in range(60):
        label, prompt, ratio = synth.copy_once(rng, FakeFeed(text), 80)
        code = label == "synthetic-copy-code"
        seen.add(label)
        cue = next(c for c in synth.COPY_CUES if f"\n{c}\n" in prompt or f"\n{c} " in prompt)
        body, tail = prompt.rsplit("\n" + cue, 1)
        lead = tail[1:]
        assert tail[0] == "\n" or (not code and tail[0] == " ")  # code's opening on a line of its own
        assert (("    " if code else "") + text).startswith(body.rstrip("\n"))  # the passage, seen once
        assert body.startswith(lead) and 3 <= len(lead.split()) <= 8  # then its opening
        assert 60 < synth.est_tokens(prompt, ratio) < 110  # about the tokens asked for
    assert seen == {"synthetic-copy-code", "synthetic-copy-prose"}
    assert synth.copy_once(random.Random(0), FakeFeed("too short"), 80)[1] == ""  # the build draws again


@pytest.fixture(scope="module")
def sources():
    return corpus.discover()


def test_copy_once_takes_the_long_repetition_prompts_only_when_asked(sources):
    plain, _ = corpus.build(N, seed=0, sources=sources, heldout=HELDOUT)
    off, _ = corpus.build(N, seed=0, sources=sources, heldout=HELDOUT, copy_once=0.0)
    assert off == plain and not any(p["source"].startswith("synthetic-copy") for p in plain)
    every, _ = corpus.build(N, seed=0, sources=sources, heldout=HELDOUT, copy_once=1.0)
    assert [p["kind"] for p in every] == [p["kind"] for p in plain]  # the mix does not move
    planned = corpus.plan(N, random.Random(0))  # build's first draws: the same plan
    copies = [p["source"].startswith("synthetic-copy") for p in every]
    assert copies == [k == "repetition" and t >= synth.COPY_ONCE_MIN_TOKENS for k, t in planned]
    assert sum(copies) > 20 and all(p["_class"] != "short" for p, c in zip(every, copies) if c)
    some, _ = corpus.build(N, seed=0, sources=sources, heldout=HELDOUT, copy_once=synth.COPY_ONCE_SHARE)
    share = sum(p["source"].startswith("synthetic-copy") for p in some) / sum(copies)
    assert 0.1 < share < 0.55
