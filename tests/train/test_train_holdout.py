"""Evaluation and benchmark prompts kept out of training data by hash (pydflash/train/holdout.py), on every path."""

import json

from pydflash.train import eval_fresh, holdout

ORDINARY = [
    "def area(width, height):\n    return width * height\n",
    "The weather in the mountains changes quickly, so pack a warm layer even in summer.",
    "<start_of_turn>user\nWhat is the tallest mountain in Africa?<end_of_turn>\n<start_of_turn>model\n",
    "|------|------|-------|\n| a | b | c |\n",
    "Left and right are relative directions; north and south are not.",
]


def test_no_prompt_is_a_benchmark_or_suite_prompt():
    rows = eval_fresh.load()
    others = holdout.Holdout(holdout.protected_texts()[len(rows):])  # everything protected but this set
    assert [r["text"][:60] for r in rows if others.hits(r["text"])] == []


def test_a_planted_eval_prompt_is_dropped_and_ordinary_text_kept():
    h = holdout.default()
    rows = eval_fresh.load()
    for r in rows:
        planted = "Some text a user wrote first.\n\n" + r["text"] + " and then more of their own words."
        assert h.hits(planted), r["text"][:60]
    assert [t for t in ORDINARY if h.hits(t)] == []


def test_near_copies_are_caught():
    h = holdout.default()
    text = next(r["text"] for r in eval_fresh.load() if r["source"].endswith("a song refrain"))
    # spacing, case and one changed word do not hide it
    edited = "  " + text.upper().replace("willows", "poplars").replace("\n", "\n\n")
    assert h.hits(edited)
    # a training prompt cut out of an evaluation prompt's middle
    assert h.hits(text[40:200])


def test_bench_prompts_and_chat_turns_are_protected():
    h = holdout.default()
    bench = [json.loads(line)["prompt"] for line in holdout.BENCH_PROMPTS.read_text().splitlines()]
    chat = json.loads(holdout.BENCH_CHAT.read_text())
    turn = chat["conversations"][0]["turns"][2]
    assert all(h.hits("Intro. " + b) for b in bench)
    assert h.hits(f"<start_of_turn>user\n{turn}<end_of_turn>\n<start_of_turn>model\n")
    assert h.hits(chat["system"][300:1500])


def test_short_protected_texts_need_the_whole_text():
    h = holdout.Holdout(["Snow fell all night."])
    assert h.hits("It was cold. snow   fell all NIGHT. We stayed in.")
    assert not h.hits("Snow fell all morning.") and not h.hits("Snow fell.")


def test_generate_skips_a_planted_eval_prompt(tiny, tmp_path):
    """generate.py, on the tiny factory pair: the corpus line holding an evaluation prompt is never answered."""
    import gzip

    from pydflash.train.generate import load_shards, main as generate_main

    planted = "Notes:\n" + next(r["text"] for r in eval_fresh.load() if r["kind"] == "prose")
    texts = ["hello world", planted, "the cat sat"]
    src = tmp_path / "p.jsonl.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"kind": "prose", "source": "t", "text": t}) + "\n")
    out = tmp_path / "gen"
    generate_main(["--target", str(tiny("gemma3").target), "--prompts", str(src), "--out", str(out),
                   "--slots", "2", "--n-new", "4", "--threads", "1"])
    assert json.loads((out / "generate.json").read_text())["held_out"] == 1
    assert sorted(load_shards(str(out))["index"].tolist()) == [0, 2]


def test_token_rows_are_checked_through_the_gguf_pieces(tiny):
    """The trainer's path (no llama.cpp there): prompts as token ids, detokenized from the GGUF's own pieces."""
    from pydflash.native import Model

    pair = tiny("gemma3")
    planted = "Intro: " + next(r["text"] for r in eval_fresh.load() if r["kind"] == "code")
    model = Model(pair.target)
    try:
        rows = [model.tokenize(t, add_special=True, parse_special=False) for t in (ORDINARY[1], planted, ORDINARY[3])]
    finally:
        model.close()
    assert holdout.held_token_rows(rows, str(pair.target)).tolist() == [False, True, False]
