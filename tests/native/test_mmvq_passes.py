"""pydflash.native.mmvq: patches/0006's MMVQ passes stay on for a small model and go off for one whose matrices are
too large for them to pay (an H100 measured both: the module's docstring). The switch itself is CUDA's; here, that
the right models flip it, and that loading a model is what flips it."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest

from pydflash.defaults import SHIPPED_DRAFTER
from pydflash.native import Model, ModelParams, mmvq


@pytest.fixture(autouse=True)
def _restore_switch():
    before = os.environ.pop(mmvq.ENV, None)
    yield
    os.environ.pop(mmvq.ENV, None)
    if before is not None:
        os.environ[mmvq.ENV] = before


def _weights_gguf(path, rows: int, cols: int, qtype: gguf.GGMLQuantizationType, name: str = "blk.0.ffn_up.weight",
                  head: gguf.GGMLQuantizationType | None = None):
    """A GGUF holding one quantized rows x cols matrix (cols = ggml's ne0) of zero bytes, and with ``head`` an
    output.weight of that type and shape: only its header is read."""
    w = gguf.GGUFWriter(str(path), "qwen3")
    for tname, t in ((name, qtype), ("output.weight", head)):
        if t is not None:
            block, type_size = gguf.GGML_QUANT_SIZES[t]
            w.add_tensor(tname, np.zeros((rows, cols // block * type_size), np.uint8), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_qwen3_4b_sized_k_quant_matrix_turns_the_passes_off(tmp_path):
    path = _weights_gguf(tmp_path / "k.gguf", 1024, 2560, gguf.GGMLQuantizationType.Q4_K)  # a Qwen3-4B attn_k
    assert mmvq.largest_pass_matrix(mmvq.read_metadata(path)) == 1024 * 2560
    mmvq.choose_for(path)
    assert os.environ.get(mmvq.ENV) == "0"


def test_gemma_3_270m_and_its_shipped_drafter_keep_the_passes(gemma_path):
    # its largest Q5_0 / K-quant matrix is 640 x 2048; the 262k-row embedding (its head) is Q8_0, MMQ's anyway
    assert mmvq.largest_pass_matrix(mmvq.read_metadata(gemma_path)) == 640 * 2048
    assert mmvq.largest_pass_matrix(mmvq.read_metadata(SHIPPED_DRAFTER)) == 0  # Q8_0 but F32 norms and its I32 d2t
    for path in (gemma_path, SHIPPED_DRAFTER):
        mmvq.choose_for(path)
    assert mmvq.ENV not in os.environ


def test_q8_0_matrices_never_count(tmp_path):
    path = _weights_gguf(tmp_path / "q8.gguf", 9728, 2560, gguf.GGMLQuantizationType.Q8_0)
    assert mmvq.largest_pass_matrix(mmvq.read_metadata(path)) == 0
    mmvq.choose_for(path)
    assert mmvq.ENV not in os.environ


def test_an_embedding_counts_only_where_it_is_the_head(tmp_path):
    big, k, q8 = (151936 // 64, 2560), gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.Q8_0
    tied = _weights_gguf(tmp_path / "tied.gguf", *big, k, name="token_embd.weight")
    untied = _weights_gguf(tmp_path / "untied.gguf", *big, k, name="token_embd.weight", head=q8)
    assert mmvq.largest_pass_matrix(mmvq.read_metadata(tied)) == big[0] * big[1]  # multiplied as the head
    assert mmvq.largest_pass_matrix(mmvq.read_metadata(untied)) == 0  # only looked up; the head is Q8_0


def test_the_users_own_setting_stands(tmp_path):
    path = _weights_gguf(tmp_path / "k.gguf", 1024, 2560, gguf.GGMLQuantizationType.Q4_K)
    os.environ[mmvq.ENV] = "1"
    mmvq.choose_for(path)
    assert os.environ[mmvq.ENV] == "1"


def test_loading_a_model_with_gpu_layers_makes_the_choice(gemma_path, monkeypatch):
    monkeypatch.setattr(mmvq, "PASSES_MAX_ELEMENTS", 0)  # every quantized matrix counts as large
    Model(gemma_path, ModelParams(n_gpu_layers=0, vocab_only=True)).close()
    Model(gemma_path, ModelParams(n_gpu_layers=0)).close()
    assert mmvq.ENV not in os.environ  # a CPU-only load leaves the GPU's switch alone
    Model(gemma_path, ModelParams(n_gpu_layers=99)).close()
    assert os.environ.get(mmvq.ENV) == "0"
