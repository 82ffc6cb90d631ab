"""pydflash.train.dedup: a corpus loses exactly the prompts that committed data already answered."""

from __future__ import annotations

import gzip
import json

from pydflash.native import Model
from pydflash.train import dedup
from pydflash.train.generate import ShardWriter


def test_dedup_drops_answered_prompts_only(tiny, tmp_path):
    p = tiny("gemma3")
    texts = [("prose", "the quick brown fox"), ("chat", "<start_of_turn>user\nhi<end_of_turn>\n"),
             ("code", "def f(x):\n    return x"), ("prose", "a new prompt nobody answered")]
    m = Model(p.target)
    tok = [m.tokenize(t, add_special=True, parse_special=k == "chat") for k, t in texts]
    m.close()
    shards = tmp_path / "data" / "run" / "g0"
    shards.mkdir(parents=True)
    w = ShardWriter(str(shards), rows_per_shard=100)
    for i in range(3):  # the first three were answered: their prompt, then a response
        w.add(tok[i] + [5, 6, 7], len(tok[i]), 0, i)
    w.flush()
    corpus = tmp_path / "corpus.jsonl.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as f:
        for k, t in texts + [("chat", "<start_of_turn>user\nthe quick brown fox<end_of_turn>\n")]:
            f.write(json.dumps({"kind": k, "source": "test", "text": t}) + "\n")
    out = tmp_path / "out.jsonl.gz"
    assert dedup.main(["--corpus", str(corpus), "--data", str(tmp_path / "data"), "--out", str(out),
                       "--target", str(p.target)]) == 0
    kept = [json.loads(x)["text"] for x in gzip.open(out, "rt", encoding="utf-8")]
    assert kept == ["a new prompt nobody answered", "<start_of_turn>user\nthe quick brown fox<end_of_turn>\n"]
