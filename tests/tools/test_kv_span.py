"""scripts/bench/kv_span.py: the KV span every step attends over, read from llama.cpp's own log."""

import json

from pydflash.factory import write_tiny_pair
from tests.helpers.bench import load_bench

kv_span = load_bench("kv_span")


def test_only_the_marked_part_counts_and_spans_pad_to_256():
    lines = ["find_slot: stream[0], n =   900, used =   10, head = 0, size = 4096, n_swa = 0",
             kv_span.BEGIN,
             "llama_kv_cache::find_slot: stream[0], n =   300, used =   250, head = 3, size = 4096, n_swa = 0",
             "unrelated line n = 5, used = 5",
             "find_slot: stream[1], n =   257, used =   200, head = 9, size = 4096, n_swa = 0",
             kv_span.END,
             "find_slot: stream[0], n =  4000, used = 3000, head = 0, size = 4096, n_swa = 0"]
    ns, used = kv_span.spans(lines)
    assert (ns, used) == ([300, 257], [250, 200])
    s = kv_span.summarize(ns, used)
    assert s["ubatches"] == 2 and s["padded_span_mean"] == 512 and s["span"]["mean"] == 278.5
    # without markers (a server's log) every line counts
    assert kv_span.spans(lines[:1] + lines[2:3])[0] == [900, 300]


def test_a_run_reads_each_variants_spans_from_llama_cpp(tmp_path):
    """The whole path: llama.cpp's debug lines reach the log (PYDFLASH_VERBOSE lets them past patches/0010), each
    variant runs in its own process, and the cache off keeps nothing while the settled cache keeps prompts."""
    pair = write_tiny_pair(str(tmp_path / "pair"), arch="llama", seed=0)
    out = tmp_path / "span.json"
    assert kv_span.main(["--run", "--variants", "off,settled", "--clients", "4", "--requests", "8", "--tokens", "12",
                         "--target", str(pair.target), "--drafter", str(pair.drafter), "--ctx", "256",
                         "--out", str(out)]) == 0
    res = json.loads(out.read_text())["variants"]
    for v in ("off", "settled"):
        r = res[v]
        assert r["ubatches"] > 8 and r["steps"] > 0, (v, r)
        assert r["span"]["mean"] >= r["used"]["mean"] > 0
        assert r["padded_span_mean"] >= r["span"]["mean"]
    assert res["off"]["kept_cells_mean"] == 0 and res["settled"]["kept_cells_mean"] > 0
