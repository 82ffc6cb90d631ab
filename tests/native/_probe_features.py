"""Subprocess helper: write the layer-input features of a fixed token sequence to an .npy file.

Run in a fresh process because patches/0001 reads PYDFLASH_LAYER_INP_FROM_L_OUT once per process.
usage: python _probe_features.py MODEL OUT.npy LAYER[,LAYER...] N_UBATCH
"""

import sys

import numpy as np

from pydflash.native import Context, ContextParams, Model, TokenBatch


def main():
    path, out, layers, n_ubatch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    layers = tuple(int(x) for x in layers.split(","))
    model = Model(path)
    tokens = [(i * 37 + 11) % (model.n_vocab - 16) + 8 for i in range(48)]
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64, n_ubatch=n_ubatch, feature_layers=layers,
                                       backend_greedy=False))
    batch = TokenBatch(64)
    batch.add(tokens, 0, 0, False)
    ctx.decode(batch)
    np.save(out, ctx.features(len(tokens)))


if __name__ == "__main__":
    main()
