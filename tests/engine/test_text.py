"""Incremental detokenization and stop strings, pure."""

from pydflash.engine.text import TextStream


def run(pieces, stops=()):
    ts = TextStream(stops)
    out = [ts.push(p) for p in pieces]
    out.append(ts.finish())
    return out, ts


def test_plain_text_passes_through():
    out, ts = run([b"hel", b"lo", b" world"])
    assert "".join(out) == "hello world" == ts.text


def test_stop_string_spanning_tokens_is_never_partly_emitted():
    out, ts = run([b"abc ST", b"O", b"P tail"], stops=["STOP"])
    assert "".join(out) == "abc "
    assert ts.stopped
    for chunk in out:
        assert "S" not in chunk  # "ST" and "STO" were held back, then dropped


def test_held_back_prefix_released_when_it_diverges():
    out, _ = run([b"ab S", b"x"], stops=["STOP"])
    assert out[0] == "ab "
    assert out[1] == "Sx"


def test_earliest_of_several_stops_wins():
    out, ts = run([b"one two three"], stops=["three", "two"])
    assert "".join(out) == "one "


def test_multibyte_utf8_split_across_tokens_comes_out_whole():
    euro = "€".encode()  # 3 bytes
    out, _ = run([b"x", euro[:1], euro[1:2], euro[2:] + b"y"])
    assert out[1] == "" and out[2] == ""
    assert "".join(out) == "x€y"


def test_invalid_bytes_are_flushed_not_stalled():
    out, _ = run([b"a\xff", b"b", b"\xe2\x82"])  # \xff invalid; trailing incomplete sequence at the end
    text = "".join(out)
    assert text.startswith("a\ufffdb")
    assert text.endswith("\ufffd")


def test_nothing_after_stop():
    ts = TextStream(["END"])
    assert ts.push(b"xEND") == "x"
    assert ts.push(b"more") == ""
    assert ts.finish() == ""


def test_a_stop_completed_by_the_final_flush_is_cut_too():
    """Incomplete bytes at the end become U+FFFD only in finish(); a stop string holding one (the soak cut such
    stops from plain decoding's own text) ends the text there, as it would mid-stream."""
    out, ts = run([b"ab", b"\xe2\x82"], stops=["b\ufffd"])
    assert "".join(out) == "a" == ts.text
    assert ts.stopped
