"""The frozen evaluation set (pydflash/train/eval_fresh.py): unchanged, its kinds and counts, chat prompts in
Gemma's turn format."""

import collections
import hashlib

import pytest

from pydflash.train import eval_fresh

# Written here as well as in eval_fresh.py and the model card: editing the file and the constant together still fails
FROZEN_SHA256 = "1a2613ef2aaeb10fdc9294ee840e2b7a6b4f21119d5c2b4aeb6537897751a3e0"


def test_the_file_is_the_frozen_one():
    assert hashlib.sha256(eval_fresh.PATH.read_bytes()).hexdigest() == FROZEN_SHA256 == eval_fresh.SHA256
    card = (eval_fresh.PATH.parents[1] / "models" / "MODEL_CARD.md").read_text()
    assert FROZEN_SHA256 in card


def test_a_changed_file_is_refused(tmp_path, monkeypatch):
    edited = tmp_path / eval_fresh.PATH.name
    edited.write_bytes(eval_fresh.PATH.read_bytes() + b"\n")
    monkeypatch.setattr(eval_fresh, "PATH", edited)
    with pytest.raises(ValueError, match="changed"):
        eval_fresh.load(edited)


def test_kinds_counts_and_chat_format():
    rows = eval_fresh.load()
    assert len(rows) >= 100 and all(set(r) == {"kind", "source", "text"} for r in rows)
    kinds = collections.Counter(r["kind"] for r in rows)
    assert set(kinds) == set(eval_fresh.KINDS) and kinds["repetition"] == 10
    assert min(kinds.values()) >= 10
    langs = {r["source"].rsplit(", ", 1)[1] for r in rows if r["kind"] == "code"}
    assert len(langs) >= 8
    chats = [r["text"] for r in rows if r["kind"] == "chat"]
    assert all(c.startswith("<start_of_turn>user\n") and c.endswith("<end_of_turn>\n<start_of_turn>model\n")
               for c in chats)
    assert sum(c.count("<start_of_turn>user\n") > 1 for c in chats) >= 5  # multi-turn conversations
    assert len({r["text"] for r in rows}) == len(rows)


def test_the_report_table_has_a_row_per_kind():
    kinds = {k: {"prompts": 3, "tau": 2.5} for k in eval_fresh.KINDS}
    t = eval_fresh.table({"modes": {"fixed": {"kinds": kinds}, "adaptive": {"kinds": kinds}}})
    assert t.count("\n") == 1 + len(eval_fresh.KINDS) and "| repetition | 3 | 2.50 | 2.50 | >= 9 |" in t
