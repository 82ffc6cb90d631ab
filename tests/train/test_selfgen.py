"""Self-generated training rows (pydflash/train/selfgen.py) end to end on the tiny factory pair: sampled documents
cut into prompts, greedy answers, stored top-k (topk.py), and the trainer reading both unchanged."""

import json
import random

import numpy as np
import pytest

from tests.helpers.oracle import Oracle
from pydflash.train import selfgen
from pydflash.train.generate import KINDS, load_shards
from pydflash.train.selfgen_seeds import FOLLOWUPS_FROM, KIND_OF, WEIGHTS, seed


def test_plans_are_reproducible_and_in_range():
    a, b = selfgen.plan(17, 0, 4), selfgen.plan(17, 0, 4)
    assert a == b and selfgen.plan(18, 0, 4) != a
    plans = [selfgen.plan(i, 0, 4) for i in range(300)]
    cuts = [c for p in plans for c in p.cuts]
    assert min(cuts) >= selfgen.MIN_PROMPT and max(cuts) <= selfgen.MAX_PROMPT
    assert np.median(cuts) < 64 and max(cuts) > 256  # log-uniform: mostly short, some long
    assert all(0.7 <= p.temperature <= 1.0 for p in plans)
    assert {p.family for p in plans} == set(WEIGHTS)
    rng = random.Random(0)
    chat = [t for f, t in (seed(rng) for _ in range(200)) if KIND_OF[f] == "chat"]
    assert chat and all(t.startswith("<start_of_turn>user\n") for t in chat)


def test_turn_ends_cut_after_each_opened_model_turn():
    sot, model = 9, [7, 8]
    toks = [2, 9, 5, 3, 1, 9, 7, 8, 4, 4, 1, 9, 5, 3, 1, 9, 7, 8, 6]
    assert selfgen.turn_ends(toks, sot, model) == [8, 18]


def _selfgen(tiny, out, *extra):
    selfgen.main(["--target", str(tiny("gemma3").target), "--out", str(out), "--slots", "4", "--n-new", "8",
                  "--cuts", "2", "--threads", "1", "--skip", "3", "--stop", "9", "--shard-rows", "5", *extra])
    return out


@pytest.fixture(scope="module")
def shards(tiny, tmp_path_factory):
    return _selfgen(tiny, tmp_path_factory.mktemp("selfgen"))


@pytest.fixture(scope="module")
def stream_shards(tiny, tmp_path_factory):
    """The same documents with a KV stream per slot (the GPU harness's default: a 128-slot step attends over its
    own slot's cells, not the whole pool): 4 slots for ~25 requests, so every slot is reused several times."""
    return _selfgen(tiny, tmp_path_factory.mktemp("selfgen_streams"), "--kv-streams")


@pytest.mark.parametrize("which", ["shards", "stream_shards"])
def test_rows_are_cut_prompts_answered_greedily(tiny, which, request):
    shards = request.getfixturevalue(which)
    summary = json.loads((shards / "generate.json").read_text())
    assert summary["next_skip"] == 9 and summary["docs"] == 6 and summary["rows"] >= 6
    d = load_shards(str(shards))
    assert sorted(set(d["index"].tolist())) <= list(range(3, 9))
    assert (d["lens"] - d["prompt_len"] == 8).all()
    oracle = Oracle(tiny("gemma3").target)
    try:
        for s, n, p, k, i in zip(d["starts"], d["lens"], d["prompt_len"], d["kind"], d["index"]):
            row = d["tokens"][s:s + n].tolist()
            plan = selfgen.plan(int(i), 0, 2)
            assert KINDS[k] == KIND_OF[plan.family] and selfgen.MIN_PROMPT <= p <= selfgen.MAX_PROMPT
            assert row[0] == oracle.llm.engine.model.bos
            oracle.check(row[:p], row[p:])  # the target's greedy answer, past its end of text too
    finally:
        oracle.close()


def test_topk_pass_and_training_with_stored_distillation(tiny, shards, tmp_path):
    from pydflash.train import topk, trainer

    target = str(tiny("gemma3").target)
    topk.main(["--target", target, "--data", str(shards), "--k", "4", "--rows", "3", "--threads", "1"])
    d = load_shards(str(shards))
    resp = d["lens"] - d["prompt_len"]
    assert d["topk_ids"].shape == (int(resp.sum()), 4) and (np.diff(d["topk_logp"].astype(np.float32)) <= 0).all()
    # the stored best token is the greedy answer: the response itself (ties aside: tiny random weights have none here)
    firsts = np.concatenate([d["tokens"][s + p:s + n] for s, n, p in zip(d["starts"], d["lens"], d["prompt_len"])])
    assert (d["topk_ids"][:, 0] == firsts).mean() > 0.95
    # the trainer reads the shards unchanged (weight 0 is its hard-label loss: test_train_distill.py)
    trainer.main(["--gguf", target, "--data", str(shards), "--out", str(tmp_path), "--device", "cpu",
                  "--max-steps", "2", "--layers", "1", "--target-layers", "0,1", "--holdout", "0.2",
                  "--anchors", "2", "--eval-per-kind", "1", "--distill-stored", "0.5"])
    assert json.loads((tmp_path / "train.json").read_text())["train_steps"] == 2


def test_a_document_with_follow_ups_sends_its_user_turns(tiny, tmp_path):
    """A multi-turn document: the target answers the first user turn until its turn ends (or TURN_TOKENS), then
    each follow-up user turn is appended and answered in turn, so the document holds a conversation (the runs
    before had no second user turn). Its rows are prompts cut from that document, answered greedily."""
    i = next(i for i in range(FOLLOWUPS_FROM, FOLLOWUPS_FROM + 200) if selfgen.plan(i, 0, 2).turns)
    doc = selfgen.plan(i, 0, 2)
    # the documents of the runs before follow-ups existed keep their plans: none has a follow-up turn
    assert not any(selfgen.plan(j, 0, 4).turns for j in range(FOLLOWUPS_FROM))
    later = [selfgen.plan(j, 0, 4) for j in range(FOLLOWUPS_FROM, FOLLOWUPS_FROM + 400)]
    answers = [p for p in later if p.family == "chat_answer"]
    assert 0.6 < sum(bool(p.turns) for p in answers) / len(answers) < 0.9
    assert 1 <= len(doc.turns) <= 2 and all(t.startswith("<end_of_turn>") and t.endswith("<start_of_turn>model\n")
                                             for t in doc.turns)
    selfgen.main(["--target", str(tiny("gemma3").target), "--out", str(tmp_path), "--slots", "2", "--n-new", "4",
                  "--cuts", "2", "--threads", "1", "--skip", str(i), "--stop", str(i + 1)])
    summary = json.loads((tmp_path / "generate.json").read_text())
    # a turn that would not fit the 512-token prompts is not sent (the tiny tokenizer spells Gemma's markup out in
    # characters, 16 tokens for <start_of_turn>: here the second one does not fit)
    assert summary["docs"] == 1 and 1 <= summary["turns_sent"] <= len(doc.turns)
    # the tiny target never ends a turn: each answer runs to TURN_TOKENS before the next user turn
    assert summary["doc_tokens"] > selfgen.TURN_TOKENS * summary["turns_sent"]


def test_training_holds_out_documents_of_the_named_folders(tiny, shards, stream_shards, tmp_path, capsys):
    from pydflash.train import trainer

    args = ["--gguf", str(tiny("gemma3").target), "--data", f"{shards},{stream_shards}", "--out", str(tmp_path),
            "--device", "cpu", "--max-steps", "1", "--layers", "1", "--target-layers", "0,1", "--holdout", "0.3",
            "--anchors", "2", "--eval-per-kind", "1"]
    trainer.main([*args, "--holdout-from", "selfgen_streams"])
    assert "held-out rows from 1 of 2 folders, whole documents" in (tmp_path / "train.log").read_text()
    with pytest.raises(SystemExit) as e:  # a name no folder has: one line, before the target loads
        trainer.main([*args, "--holdout-from", "no-such-run"])
    assert e.value.code == 2 and "--holdout-from 'no-such-run'" in capsys.readouterr().err
