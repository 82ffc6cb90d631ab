"""CPU-only checks of the drafter training code (skipped without torch)."""
import math

import pytest

torch = pytest.importorskip("torch")

from pydflash.train.drafter import DFlashDrafter, DrafterConfig, block_mask, draft_logits_loss, position_weights  # noqa: E402
from pydflash.train.evaluate import accept_table, walk  # noqa: E402


def tiny(n_layers=2):
    torch.manual_seed(0)
    c = DrafterConfig(hidden_size=32, num_hidden_layers=n_layers, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, intermediate_size=64, vocab_size=50, num_target_layers=8,
                      target_layer_ids=(1, 3, 5), block_size=4, mask_token_id=4, input_embedding_scale=math.sqrt(32))
    return c, DFlashDrafter(c).eval()


def test_block_mask_sees_prefix_and_own_block():
    mask, q_pos = block_mask(torch.tensor([[3, 6]]), ctx_len=8, block=4)
    assert q_pos.tolist() == [[3, 4, 5, 6, 6, 7, 8, 9]]
    m = mask[0, 0]
    assert m[0, :8].tolist() == [True] * 3 + [False] * 5          # context < anchor 3
    assert m[4, :8].tolist() == [True] * 6 + [False] * 2          # context < anchor 6
    assert m[0, 8:].tolist() == [True] * 4 + [False] * 4          # own block only, non-causal
    assert m[7, 8:].tolist() == [False] * 4 + [True] * 4


def test_position_weights():
    w = position_weights(16)
    assert w[0] == 0 and abs(w[1] - 1) < 1e-6 and abs(w[8] - math.exp(-1)) < 1e-6


def test_batched_anchors_match_one_block_at_a_time():
    """Many anchors in one masked forward == the decode-time forward of a single block."""
    c, m = tiny()
    L = 12
    embd = torch.randn(c.vocab_size, c.hidden_size)
    feats = torch.randn(1, L, 3 * c.hidden_size)
    tokens = torch.randint(5, c.vocab_size, (1, L))
    anchors = torch.tensor([[4, 7]])
    with torch.no_grad():
        ctx = m.fuse(feats)
        mask, q_pos = block_mask(anchors, L, c.block_size)
        ids = torch.full((1, 2, c.block_size), c.mask_token_id)
        ids[:, :, 0] = tokens[0, anchors[0]]
        noise = torch.nn.functional.embedding(ids.view(1, -1), embd) * c.input_embedding_scale
        k_pos = torch.cat([torch.arange(L)[None], q_pos], 1)
        many = m(noise, ctx, q_pos, k_pos, mask)
        for b, a in enumerate(anchors[0].tolist()):
            n = noise[:, b * c.block_size:(b + 1) * c.block_size]
            qp = torch.arange(a, a + c.block_size)[None]
            one = m(n, ctx[:, :a], qp, torch.cat([torch.arange(a)[None], qp], 1), None)
            torch.testing.assert_close(one, many[:, b * c.block_size:(b + 1) * c.block_size], atol=1e-5, rtol=1e-4)


def test_loss_backward_and_walk():
    c, m = tiny()
    m.train()
    embd = torch.randn(c.vocab_size, c.hidden_size)
    feats = torch.randn(2, 16, 3 * c.hidden_size)
    tokens = torch.randint(5, c.vocab_size, (2, 16))
    loss, st = draft_logits_loss(m, embd, feats, tokens, torch.tensor([16, 12]), torch.tensor([[6, 9], [6, 8]]))
    loss.backward()
    assert torch.isfinite(loss) and m.fc.weight.grad is not None and st["acc"].shape == (c.block_size,)
    m.eval()
    tab = accept_table(m, embd, feats[:1], tokens[:1], start=6, valid_len=16)
    steps, committed, acc = walk(tab, 6, 16)
    assert committed == 16 - 1 - 6 and 1 <= steps <= committed and acc == committed - steps


def test_topk_distillation_reads_the_target_where_each_label_was_predicted():
    """draft_logits_loss's teacher is the target's final state: its logits at position p - 1 are the target's
    distribution for the token at p. A teacher whose logits at p - 1 put (almost) all mass on tokens[p] makes the
    top-1 distillation term the hard label's cross-entropy, so any weight gives the plain loss back; a teacher read
    one position off does not. Weight 0, or no teacher, is the plain loss."""
    c, m = tiny()
    torch.manual_seed(1)
    embd = torch.nn.functional.normalize(torch.randn(c.vocab_size, c.hidden_size), dim=-1)
    feats = torch.randn(2, 16, 3 * c.hidden_size)
    tokens = torch.randint(5, c.vocab_size, (2, 16))
    lens, anchors = torch.tensor([16, 12]), torch.tensor([[6, 9], [6, 8]])
    plain, _ = draft_logits_loss(m, embd, feats, tokens, lens, anchors)
    nxt = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)  # the token each position predicts
    teacher = 100.0 * embd[nxt]  # logits at p - 1: 100 x cosine, peaked at tokens[p]
    for alpha in (0.0, 0.5, 1.0):
        got, _ = draft_logits_loss(m, embd, feats, tokens, lens, anchors, teacher=teacher, topk=1, alpha=alpha)
        torch.testing.assert_close(got, plain)
    off_by_one = 100.0 * embd[tokens]  # the state at p itself: the wrong distribution
    got, _ = draft_logits_loss(m, embd, feats, tokens, lens, anchors, teacher=off_by_one, topk=1, alpha=1.0)
    assert abs(got.item() - plain.item()) > 0.1
    soft, _ = draft_logits_loss(m, embd, feats, tokens, lens, anchors, teacher=teacher, topk=8, alpha=0.5)
    assert torch.isfinite(soft)


def test_a_drafter_from_scratch_takes_its_heads_and_trains():
    """The trainer shapes a new drafter's attention from its arguments (more, narrower heads: docs/drafter.md), keeps
    the defaults where they are 0, and refuses them beside --init, whose config fixes them."""
    from types import SimpleNamespace

    from pydflash.train.trainer import main, scratch_config

    target = SimpleNamespace(n_embd=32, n_vocab=50, n_layer=8)
    c = scratch_config(target, SimpleNamespace(layers=2, heads=8, kv_heads=2, head_dim=8), [1, 3, 5])
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (2, 8, 2, 8)
    default = scratch_config(target, SimpleNamespace(layers=0, heads=0, kv_heads=0, head_dim=0), [1, 3, 5])
    assert (default.num_hidden_layers, default.num_attention_heads, default.head_dim) == (3, 4, 128)
    c = DrafterConfig(**{**c.__dict__, "block_size": 4})
    m = DFlashDrafter(c).train()
    feats, tokens = torch.randn(1, 12, 3 * c.hidden_size), torch.randint(5, c.vocab_size, (1, 12))
    loss, _ = draft_logits_loss(m, torch.randn(c.vocab_size, c.hidden_size), feats, tokens, torch.tensor([12]),
                                torch.tensor([[4, 7]]))
    loss.backward()
    assert torch.isfinite(loss) and m.layers[0].self_attn.q_proj.weight.shape == (8 * 8, 32)
    with pytest.raises(SystemExit) as e:
        main(["--gguf", "x.gguf", "--data", "d", "--out", "o", "--init", "i.safetensors", "--heads", "8"])
    assert e.value.code == 2


def test_walk_counts_bonus():
    import numpy as np
    acc = np.zeros(20, dtype=int)
    acc[5] = 3   # anchor 5: 3 drafts accepted + bonus -> next anchor 9
    steps, committed, accepted = walk(acc, 5, 12)
    assert (steps, committed, accepted) == (3, 6, 3)       # 5->9->10->11


def test_export_names_and_config_roundtrip():
    from pydflash.train.export_gguf import gguf_name
    c, _ = tiny(3)
    assert DrafterConfig.from_hf_config(c.to_hf_config()) == c
    assert gguf_name("layers.2.self_attn.o_proj.weight") == "blk.2.attn_output.weight"
    assert gguf_name("hidden_norm.weight") == "enc.output_norm.weight"
    assert gguf_name("layers.0.post_attention_layernorm.weight") == "blk.0.ffn_norm.weight"
