"""Whether ggml-cuda runs a 9-16-column product as MMVQ passes (patches/0006), chosen from the model's weights.

A speculative verify or a DFlash block of one sequence multiplies every weight matrix with 9-16 columns. On Hopper,
patches/0006 runs such a product as passes of up to 8 columns of MMVQ instead of MMQ's stream-k tiles. Which wins
depends on the matrix, measured on an H100 (docs/benchmarks.md, "eighth session"):

- Gemma-3-270M (its Q5_0 / K-quant matrices at most 640 x 2048): a 16-token verify 2.09-2.13 ms with the passes,
  2.61-2.70 ms without. The matrices are small: MMQ's tiles and stream-k fix-up cost more than two short passes.
- A Qwen3-4B-shaped Q4_K_M target (2560 x 1024 .. 2560 x 9728, and a tied 151,936-row Q6_K head): 11.2 ms with the
  passes, 6.4 ms without (a plain step 3.2 ms). MMVQ decodes the K-quant blocks again for every column, so a pass of
  8 columns over a large matrix costs as much as MMQ's 16 (an 8-token verify: 6.5 ms), and there are two of them.
  Through HTTP at one client, synthetic acceptance length 5, the pair went from 1.12x to 1.80x native llama-server.

The switch is the patch's environment variable, read once per process at the first such product, so it is set
here when a model is loaded, before anything runs: off where the largest matrix the passes would take exceeds
PASSES_MAX_ELEMENTS. Between the two measured shapes (1.3 M and >= 2.6 M elements a matrix) the threshold is a
guess, near their geometric middle. A process serves one pair (each pydflash-server worker does), so one choice per
process is one per model; a process that loads a small model, runs it, then a large one keeps the first choice. A
user's own GGML_CUDA_MMVQ_PASSES is never overridden. On a CPU or a GPU other than Hopper the variable changes
nothing, and an RPC server (--rpc) keeps its own default: the variable is this process's.
"""

from __future__ import annotations

import logging
import os

import gguf

from ..compat.gguf_meta import GGUFMeta, read_metadata

log = logging.getLogger(__name__)

ENV = "GGML_CUDA_MMVQ_PASSES"
PASSES_MAX_ELEMENTS = 1 << 21  # ~2.1 M: above Gemma-3-270M's 1.3 M, below a Qwen3-4B's smallest (2.6 M)
_MMQ_ALWAYS = int(gguf.GGMLQuantizationType.Q8_0)  # the patch leaves Q8_0 with MMQ whatever the size


def largest_pass_matrix(meta: GGUFMeta) -> int:
    """Elements of the largest 2-D quantized weight that patches/0006 would multiply as passes (0: none)."""
    largest = 0
    untied = "output.weight" in meta.tensors  # then the embedding is only looked up, never multiplied
    for name, t in meta.tensors.items():
        if len(t.dims) != 2 or t.ggml_type == _MMQ_ALWAYS or (untied and name == "token_embd.weight"):
            continue
        try:
            block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.ggml_type)]
        except (ValueError, KeyError):  # a type this gguf-py does not know: not ours to judge
            continue
        if block > 1:  # a quantized type (F32 / F16 / BF16 have blocks of one)
            largest = max(largest, t.dims[0] * t.dims[1])
    return largest


def choose_for(path) -> None:
    """Turn the passes off for this process if the model at ``path`` has a matrix too large for them to pay."""
    if ENV in os.environ:
        return  # the user's choice, or an earlier model's
    try:
        largest = largest_pass_matrix(read_metadata(path))
    except Exception as exc:  # noqa: BLE001  advisory only: llama.cpp's load says what is wrong with the file
        log.debug("%s: MMVQ passes left as they are (%s)", path, exc)
        return
    if largest > PASSES_MAX_ELEMENTS:
        os.environ[ENV] = "0"
        log.debug("%s: a %d-element matrix: 9-16-column products as MMQ (%s=0)", path, largest, ENV)
