"""The drafter evaluation suite (pydflash/train/eval_suite.py): its buckets and what it holds. The suite is run
against a drafter by scripts/bench/drafter_eval.py --suite."""

from pydflash.train import eval_suite as suite


def test_length_buckets_follow_the_issue():
    assert [suite.length_class(n) for n in (1, 15, 16, 128, 129)] == ["short", "short", "medium", "medium", "long"]
    assert suite.bucket("code", 12) == "code/short" and suite.bucket("chat", 200) == "chat/long"
    assert suite.bucket("repetition", 300) == "repetition"
    assert suite.target_for("code/long") == 4.5 and suite.target_for("chat/short") == 3.5
    assert suite.target_for("repetition") == 8.0


def test_held_out_rows_give_one_prompt_per_length():
    ps = suite.prompts(3)
    for kind in ("code", "prose"):
        for length, n in suite.LENGTHS.items():
            group = [p for p in ps if p.name.startswith(f"{kind} {length} ")]
            assert len(group) == 3 and all(len(p.prompt) == n for p in group)
            assert suite.length_class(n) == length
    # the repetition suite is always whole, and holds the five cases of the drafter suite's table
    rep = [p.name for p in ps if p.kind == "repetition"]
    assert len(rep) == len(suite.REPETITION)
    assert {"prose openers", "a b c repeated", "sentence x3", "three functions", "counting"} <= set(rep)


def test_chat_prompts_are_gemma_turns_and_listed_for_exclusion():
    chats = [p for p in suite.prompts() if p.kind == "chat"]
    assert chats and all(p.prompt.startswith("<start_of_turn>user\n") and
                         p.prompt.endswith("<end_of_turn>\n<start_of_turn>model\n") for p in chats)
    held = suite.texts()
    assert all(any(t in p.prompt for t in held) for p in chats)
    assert all(p.prompt in held for p in suite.prompts() if p.kind == "repetition")
