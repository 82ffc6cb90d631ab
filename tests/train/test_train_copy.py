"""The trainer's --copy-weight: which rows copy their prompt (pydflash/train/copying.py), and that the sampler draws
those W times as often as other rows while W = 1 keeps the sampler of earlier runs draw for draw (CPU, no model)."""
import numpy as np
import pytest

pytest.importorskip("torch")  # trainer.py imports it

from pydflash.train.copying import COPY_NGRAM, COPY_ROW_SHARE, copy_shares  # noqa: E402
from pydflash.train.trainer import Rows, main  # noqa: E402

PASSAGE = list(range(100, 130))  # 30 distinct tokens: no 8-gram of it repeats by chance
CUE = [7, 8]  # "Again:"


def rows_data(rows: list[tuple[list[int], list[int]]]) -> dict:
    """generate.py's ragged layout for (prompt, response) pairs."""
    lens = np.array([len(p) + len(r) for p, r in rows], np.int64)
    return {"tokens": np.array([t for p, r in rows for t in p + r], np.int32),
            "starts": np.r_[0, np.cumsum(lens)[:-1]].astype(np.int64), "lens": lens,
            "prompt_len": np.array([len(p) for p, _ in rows], np.int64),
            "kind": np.zeros(len(rows), np.int64), "index": np.arange(len(rows))}


def shares(rows, **kw) -> list[float]:
    d = rows_data(rows)
    return copy_shares(d["tokens"], d["starts"], d["lens"], d["prompt_len"], **kw).tolist()


def naive_share(prompt: list[int], response: list[int], n: int) -> float:
    """The definition, quadratic: a response token copies when it and the n before it stand in the prompt."""
    row, grams = prompt + response, {tuple(prompt[i:i + n + 1]) for i in range(len(prompt) - n)}
    hits = sum(tuple(row[i - n:i + 1]) in grams for i in range(max(len(prompt), n), len(row)))
    return hits / max(len(response), 1)


def test_copy_share_on_hand_made_rows():
    lead = PASSAGE[:COPY_NGRAM]
    assert shares([
        (PASSAGE + CUE + lead, PASSAGE[COPY_NGRAM:]),  # "Again:" and its opening: every next token copies
        (PASSAGE + CUE + lead, PASSAGE[8:18] + list(range(300, 310))),  # copies 10, then 10 new tokens
        (PASSAGE + CUE, PASSAGE[:20]),  # the first 8 copied tokens have no copied 8 tokens before them yet
        (PASSAGE + CUE, list(range(300, 320))),  # nothing of the prompt
        ([1, 2, 3], [1, 2, 3] * 8),  # a prompt shorter than an 8-gram: nothing to copy from
        ([5] + CUE, PASSAGE + PASSAGE),  # repeats its own response: only the prompt is a source
    ]) == [1.0, 0.5, 12 / 20, 0.0, 0.0, 0.0]
    # another row's prompt is no source: row 1 copies the passage that only row 0's prompt holds
    assert shares([(PASSAGE + CUE + lead, PASSAGE[8:]), (CUE + lead, PASSAGE[8:])]) == [1.0, 0.0]


def test_copy_share_matches_the_definition_and_chunking_changes_nothing():
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(60):  # three symbols: many repeated grams, most responses partly copying
        p = rng.integers(0, 3, int(rng.integers(1, 40))).tolist()
        rows.append((p, rng.integers(0, 3, int(rng.integers(0, 30))).tolist()))
    want = [naive_share(p, r, COPY_NGRAM) for p, r in rows]
    assert 0 < np.mean(want) < 1
    assert shares(rows) == pytest.approx(want, abs=1e-12)
    assert shares(rows, chunk_tokens=17) == pytest.approx(want, abs=1e-12)
    assert shares(rows, n=3) == pytest.approx([naive_share(p, r, 3) for p, r in rows], abs=1e-12)


N_COPY, N_PLAIN, ROW_LEN = 100, 300, 60


@pytest.fixture(scope="module")
def mixed():
    """100 copying and 300 plain rows of one length, interleaved at random."""
    rng = np.random.default_rng(0)
    rows = []
    for i in rng.permutation(N_COPY + N_PLAIN):
        fresh = (1000 + 40 * i + np.arange(30)).tolist()  # tokens no other row has
        if i < N_COPY:
            prompt = fresh + CUE[:1] + fresh[:COPY_NGRAM]
            rows.append((prompt, fresh[COPY_NGRAM:][:ROW_LEN - len(prompt)]))
        else:
            rows.append((fresh[:22], list(range(200, 238))))
    assert all(len(p) + len(r) == ROW_LEN for p, r in rows)
    return rows_data(rows)


def draws_per_row(rows: Rows, seed: int, n_batches: int = 4000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    count = np.zeros(len(rows.data["lens"]))
    for _ in range(n_batches):
        idx = rows.batch(rng, token_budget=8 * ROW_LEN, max_rows=64)
        assert len(idx) == 8 and len(set(idx)) == 8  # the budget still sizes batches; no row twice in one
        np.add.at(count, idx, 1)
    return count


@pytest.mark.parametrize("weight", [1.0, 4.0])
def test_copying_rows_are_drawn_weight_times_as_often(mixed, weight):
    rows = Rows(mixed, max_len=1280, holdout=0.0, seed=0, copy_weight=weight)
    copying = rows.copy_share >= COPY_ROW_SHARE
    assert copying.sum() == N_COPY and set(rows.copy_share.round(6)) == {0.0, 1.0}
    count = draws_per_row(rows, seed=3)
    per_copy, per_plain = count[rows.train[copying]].mean(), count[rows.train[~copying]].mean()
    # ~8,000 (W=1) or ~18,000 (W=4) copying draws: the ratio's noise is a few percent
    assert weight * 0.85 < per_copy / per_plain < weight * 1.15
    share = weight * N_COPY / (weight * N_COPY + N_PLAIN)
    assert rows.copy_stats()["copy_draw_share"] == pytest.approx(share, abs=1e-4)
    assert np.array_equal(count, draws_per_row(rows, seed=3))  # deterministic under the seed


def legacy_batch(order, sorted_lens, rng, token_budget, max_rows):
    """The sampler before --copy-weight (trainer.Rows.batch of commit a6a437a), verbatim."""
    j = int(rng.integers(len(order)))
    n = int(max(1, min(max_rows, token_budget // max(int(sorted_lens[j]), 1))))
    lo = max(0, min(j - n // 2, len(order) - n))
    return order[lo:lo + n].tolist()


def test_weight_one_keeps_the_old_sampler_draw_for_draw():
    rng = np.random.default_rng(0)
    rows = []
    for i, n in enumerate(rng.integers(10, 400, size=300)):  # every other row's response copies its prompt
        prompt = rng.integers(0, 50000, n // 2).tolist()
        rows.append((prompt, prompt[:n - n // 2] if i % 2 else rng.integers(0, 50000, n - n // 2).tolist()))
    data = rows_data(rows)
    lens = data["lens"]
    rows = Rows(data, max_len=256, holdout=0.1, seed=0)
    assert 0 < (rows.copy_share >= COPY_ROW_SHARE).sum() < len(rows.train)  # both kinds of rows are there
    cut = np.minimum(lens[rows.train], 256)
    order, sorted_lens = rows.train[np.argsort(cut, kind="stable")], np.sort(cut)
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(200):
        assert rows.batch(a, 2048, 32) == legacy_batch(order, sorted_lens, b, 2048, 32)


def test_copy_weight_must_be_positive():
    with pytest.raises(SystemExit) as e:
        main(["--gguf", "x.gguf", "--data", "d", "--out", "o", "--copy-weight", "0"])
    assert e.value.code == 2


def test_a_source_weight_draws_its_folders_rows_that_many_times_as_often(mixed):
    # the fixture's rows split into two "folders" by parity; folder 1 weighs 3, and the copy weight 2 multiplies in
    source = np.arange(len(mixed["lens"])) % 2
    rows = Rows(mixed, max_len=1280, holdout=0.0, seed=0, copy_weight=2.0, source_weight=np.where(source, 3.0, 1.0))
    assert len(rows.groups) == 4  # (copying, plain) x (weight 3, weight 1)
    count = draws_per_row(rows, seed=4, n_batches=8000)
    copying = rows.copy_share >= COPY_ROW_SHARE
    mean = {(c, s): count[rows.train[(copying == c) & (source[rows.train] == s)]].mean()
            for c in (True, False) for s in (0, 1)}
    for c in (True, False):
        assert 2.6 < mean[(c, 1)] / mean[(c, 0)] < 3.4
    for s in (0, 1):
        assert 1.7 < mean[(True, s)] / mean[(False, s)] < 2.3
    w = np.where(copying, 2.0, 1.0) * np.where(source[rows.train], 3.0, 1.0)
    assert rows.draw_share(source[rows.train] == 1) == pytest.approx(w[source[rows.train] == 1].sum() / w.sum())


def test_source_weights_name_a_folder_and_a_positive_weight():
    from pydflash.train.trainer import source_weights
    folders = ["gguf_data/2026-12-01/c0", "gguf_data/2026-12-06-h-selfgen/p0", "gguf_data/2026-12-06-g-selfgen/p1"]
    assert source_weights("", folders) == [1.0, 1.0, 1.0]
    assert source_weights("selfgen=0.5", folders) == [1.0, 0.5, 0.5]
    assert source_weights("h-selfgen=2,selfgen=0.5", folders) == [1.0, 2.0, 0.5]  # the first pattern that matches
    for bad in ("selfgen", "selfgen=0", "selfgen=x", "=2", "nowhere=2"):
        with pytest.raises(ValueError):
            source_weights(bad, folders)
    with pytest.raises(SystemExit) as e:
        main(["--gguf", "x.gguf", "--data", ",".join(folders), "--out", "o", "--source-weight", "nowhere=2"])
    assert e.value.code == 2
