"""Where the target's layers go: the flags both CLIs share (-ngl, --rpc, --rpc-allow-public)."""

from __future__ import annotations


def add_placement_args(p) -> None:
    """Add the flags to a parser or argument group."""
    p.add_argument("-ngl", "--n-gpu-layers", metavar="N", type=int, default=None,
                   help="layers on the GPUs and RPC servers (-1 = all; default 0, or all with --rpc)")
    p.add_argument("--rpc", metavar="HOST:PORT,...", default=None,
                   help="llama.cpp ggml-rpc-server(s) that take the target's offloaded layers with the local GPUs "
                        "(the drafter stays local); unauthenticated: trusted private networks only")
    p.add_argument("--rpc-allow-public", action="store_true",
                   help="allow --rpc endpoints on public or wildcard (0.0.0.0) addresses")
