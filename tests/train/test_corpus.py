"""The drafter's prompt corpus builder (pydflash/train/corpus.py, corpus_synth.py): determinism, the mix of kinds and
lengths, the exact Gemma turn format, and what must stay out (eval_suite texts, held-out rows)."""

import gzip
import hashlib
import json
import random
import re

import pytest

from pydflash.server.chat import GEMMA, ChatTemplate
from pydflash.train import corpus, eval_suite
from pydflash.train import corpus_synth as synth
from pydflash.train.data import is_eval

N = 400
# a stand-in held-out row: the real ones need the target's vocabulary (tested below, marked real_model)
FAKE_HELDOUT = ("The quarterly harvest report lists barley, rye and spelt yields per valley, "
                "measured by the cooperative's own scales in late autumn of each year.")
TURN = r"<start_of_turn>user\n(?:(?!<start_of_turn>|<end_of_turn>).)+<end_of_turn>\n<start_of_turn>model\n"
CHAT_RE = re.compile(rf"(?:{TURN}(?:(?!<start_of_turn>|<end_of_turn>).)+<end_of_turn>\n)*{TURN}", re.S)


@pytest.fixture(scope="module")
def sources():
    return corpus.discover()


@pytest.fixture(scope="module")
def built(sources):
    return corpus.build(N, seed=0, sources=sources, heldout=[FAKE_HELDOUT])


def test_build_is_deterministic_per_seed(sources, built):
    again, _ = corpus.build(N, seed=0, sources=sources, heldout=[FAKE_HELDOUT])
    other, _ = corpus.build(N, seed=1, sources=sources, heldout=[FAKE_HELDOUT])
    assert again == built[0]
    assert [p["text"] for p in other] != [p["text"] for p in again]


def test_a_later_corpus_leaves_out_an_earlier_ones_prompts(sources, built):
    """A second corpus for later generation runs gives no prompt of the first again (bar a short opener that a
    small pool cannot avoid after 25 tries), and still the same mix."""
    earlier = [p["text"] for p in built[0]]
    later, _ = corpus.build(N, seed=1, sources=sources, heldout=[FAKE_HELDOUT], exclude=earlier)
    plain, _ = corpus.build(N, seed=1, sources=sources, heldout=[FAKE_HELDOUT])
    again = set(earlier)
    assert sum(p["text"] in again for p in plain) > 0  # without exclude the two builds share prompts
    assert sum(p["text"] in again for p in later) <= sum(p["text"] in again for p in plain) // 4
    assert [p["kind"] for p in later] == [p["kind"] for p in plain]


def test_every_kind_and_length_class(built):
    prompts, _ = built
    kinds = {k: sum(p["kind"] == k for p in prompts) for k in corpus.MIX}
    assert kinds == {k: round(N * share) for k, share in corpus.MIX.items()}
    for kind in corpus.MIX:
        assert {p["_class"] for p in prompts if p["kind"] == kind} == {"short", "medium", "long"}, kind
    share = {c: sum(p["_class"] == c for p in prompts) / N for c in corpus.LENGTHS}
    assert 0.2 < share["short"] < 0.4 and 0.35 < share["medium"] < 0.55 and 0.15 < share["long"] < 0.35
    assert len({p["source"] for p in prompts if p["kind"] == "code"}) >= 6  # many languages, not just Python
    assert all(len(p["text"]) < 6000 for p in prompts)  # ~1000 tokens at most


def test_chat_prompts_are_exact_gemma_turns(built):
    chats = [p["text"] for p in built[0] if p["kind"] == "chat"]
    assert all(CHAT_RE.fullmatch(t) for t in chats)
    assert any(t.count("<start_of_turn>user") > 1 for t in chats)  # some multi-turn
    assert not any(t.startswith("<bos>") for t in chats)
    # no turn markers (or other special-token text) in the other kinds: the server parses special tokens
    assert not any(corpus.SPECIAL_RE.search(p["text"]) for p in built[0] if p["kind"] != "chat")
    assert CHAT_RE.fullmatch(synth.conversation([("hi", "hello")], "bye"))
    assert not CHAT_RE.fullmatch(synth.turn("hi") + "extra")
    # what the server sends for those messages, whitespace included: its template trims each message
    server = ChatTemplate(GEMMA, "gemma")
    pattern = re.compile(r"<start_of_turn>(user|model)\n(.*?)<end_of_turn>\n", re.S)
    for t in chats:
        msgs = [{"role": "user" if r == "user" else "assistant", "content": c} for r, c in pattern.findall(t)]
        assert server.render(msgs) == t
    assert synth.turn("  code block\n\n") == server.render([{"role": "user", "content": "code block"}])


def test_no_eval_suite_text_leaks(built):
    held = eval_suite.texts()
    for p in built[0]:
        assert not any(t in p["text"] for t in held)
        assert not (len(p["text"]) >= 20 and any(p["text"] in t for t in held))
    leaks = corpus.Leaks(held)
    assert leaks("intro " + eval_suite.REPETITION["counting"] + " outro")
    assert leaks(eval_suite.CHAT_LONG[0][10:60]) and not leaks("1, 2, 3")  # short pieces of a text are fine


def test_heldout_filter_matches_64_chars_at_any_offset():
    h = corpus.Heldout([FAKE_HELDOUT])
    for off in (0, 1, 17, 31, 32, 40):
        assert h.hits("x" * off + FAKE_HELDOUT[5:5 + 64] + " tail"), off
    assert not h.hits("x" * 3 + FAKE_HELDOUT[5:5 + 63] + "#")
    # runs of braces and spaces are in thousands of files: not a leak of the row
    assert not corpus.Heldout(["    }\n" * 30]).hits("foo\n" + "    }\n" * 30)


def training_path(folder, name: str):
    """A path in folder that the corpus' train/eval split (a hash of the path, 1 in 40 to eval) keeps for training:
    tmp_path varies by run, and a test file that hashed to eval was dropped before the held-out filter saw it."""
    stem, suffix = name.rsplit(".", 1)
    return next(p for p in (folder / f"{stem}{i}.{suffix}" for i in range(200)) if not is_eval(str(p)))


def test_heldout_source_file_is_dropped(tmp_path):
    marker = "zebra_quokka_marker"
    planted = training_path(tmp_path, "planted.py")
    planted.write_text("".join(f"def {marker}_{i}(x):\n    return x + {i}\n\n" for i in range(40))
                       + "# " + FAKE_HELDOUT[3:90] + "\n")
    clean = training_path(tmp_path, "clean.py")
    clean.write_text("".join(f"def keep_{i}(x):\n    return x * {i}\n\n" for i in range(40)))
    doc = training_path(tmp_path, "doc.md")
    doc.write_text("# Notes\n\n" + "".join(f"Item {i} of the list is described here at length. " for i in range(60)))
    srcs = [corpus.Source("py", "code", 1.0, 3.5, "test", [str(planted), str(clean)]),
            corpus.Source("md", "prose", 1.0, 3.6, "test", [str(doc)])]
    prompts, info = corpus.build(120, seed=0, sources=srcs, heldout=[FAKE_HELDOUT])
    texts = [p["text"] for p in prompts]
    assert info["dropped_files"] == 1
    assert not any(marker in t for t in texts)
    assert any("keep_" in t for t in texts)
    # without the held-out row the planted file is used: the test can tell
    prompts, _ = corpus.build(120, seed=0, sources=srcs, heldout=[])
    assert any(marker in p["text"] for p in prompts)


def test_written_file_and_manifest(built, tmp_path):
    prompts, info = built
    out = tmp_path / "p.jsonl.gz"
    sha = corpus.write(prompts, str(out))
    assert sha == hashlib.sha256(out.read_bytes()).hexdigest() == corpus.write(prompts, str(tmp_path / "q.gz"))
    rows = [json.loads(line) for line in gzip.open(out, "rt")]
    assert rows == [{k: p[k] for k in ("kind", "source", "text")} for p in prompts]
    man = corpus.manifest(prompts, info, N, 0, sha)
    assert sum(man["kind"].values()) == sum(man["length"].values()) == N
    assert set(man["licenses"]) >= {p["source"] for p in prompts if p["kind"] in ("code", "prose")}


def test_windows_start_at_line_starts():
    rng = random.Random(0)
    text = "".join(f"line {i} " + "word " * (i % 7) + "\n" for i in range(300))
    for _ in range(50):
        w = corpus.window(text, 120, rng)
        assert w.startswith("line ") and text.find(w) >= 0 and text[text.find(w) - 1] == "\n"


@pytest.mark.real_model
def test_heldout_rows_decode_to_text():
    from pydflash.defaults import gemma_target
    from pydflash.native.handles import Model

    texts = corpus.heldout_texts()
    assert len(texts) == 80 and all(len(t) > 300 for t in texts)
    ids = [int(t) for t in __import__("numpy").load(eval_suite.HELDOUT)["code_tokens"][0] if int(t) != 2]
    model = Model(gemma_target())
    retok = model.tokenize(texts[0], add_special=False)  # tokenizing is not unique; the text round-trips
    assert model.detokenize(retok).decode() == texts[0] and abs(len(retok) - len(ids)) <= len(ids) // 10
    assert texts[0].startswith(model.detokenize(ids[:20]).decode())


def test_values_are_the_same_in_every_process():
    """Faker's multi-locale proxy and its it_IT cities once made builds differ between runs: the same seed must
    give the same values in processes with different string hashing."""
    import os
    import subprocess
    import sys

    code = ("import random, hashlib; from pydflash.train import corpus_synth as s\n"
            "v = s.Vocab(random.Random(0), ['alpha', 'beta', 'gamma'], 0)\n"
            "print(hashlib.sha256('|'.join(v.name() + v.city() + v.word() for _ in range(3000)).encode())"
            ".hexdigest())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2)}
    assert len(outs) == 1
