"""The split half of scripts/bench/scale_out.py (``--part split``): one target over two GPUs, through HTTP.

Placements of the target (each a pydflash-server with ``-ngl -1``; ``CUDA_VISIBLE_DEVICES`` picks the GPUs):

- ``one``: GPU 0 alone, the reference (a 4B-scale target fits one GPU; what the split costs shows against it);
- ``layer``: GPUs 0 and 1 visible: llama.cpp's own split, ``-sm layer`` (its default split mode, with no
  ``tensor_split``: layers spread over the visible GPUs by their free memory). pydflash exposes no other split
  mode, so visibility is the switch; the drafter is split the same way;
- ``rpc``: GPU 0 local, ``--rpc`` to a ``ggml-rpc-server`` started on GPU 1 (``CUDA_VISIBLE_DEVICES=1``); the drafter
  stays local (docs/scale-out.md, "Splitting one target over llama.cpp RPC"). A fresh server per condition: one
  whose client went away may refuse the next.

Modes: ``plain`` (``--no-spec``), ``spec`` (the drafter, adaptive drafting as by default) and ``synth``
(``--spec-synth-len L``: a fixed draft block with acceptance forced to L, for random-weight pairs whose drafter
accepts nothing; its text is not valid output). ``native-layer``: llama-server ``-ngl 99 -sm layer`` on both GPUs,
plain, default flags. Conditions are ``<placement>-<mode>`` and ``native-layer``.

Before the timed levels each condition answers ``PROBES`` greedy non-streamed requests (scale_out.py's ``measure``);
the texts are compared with ``one-plain``'s (greedy speculation is lossless; the synthetic mode is left out).

On a CPU (tests/server/test_scale_out_dryrun.py) ``one`` and ``layer`` are the same placement and the RPC server runs on
the CPU: a plumbing check of the path, not a measurement.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # scripts/ is not a package
from server_load import Server, fmt  # noqa: E402

from pydflash import rpc_endpoints  # noqa: E402
from pydflash.native._lib import LIB_DIR  # noqa: E402

PLACEMENTS = {"one": "0", "layer": "0,1", "rpc": "0"}  # CUDA_VISIBLE_DEVICES of the pydflash-server
RPC_GPU = "1"
MODES = ("plain", "spec", "synth")
PROBES = 3  # greedy requests whose texts are compared across conditions
TARGET_SPLIT = (1, 1.5)  # the split target with DFlash >= 1.5x the split without it at C=1 (docs/scale-out.md)
RPC_SERVER = LIB_DIR.parent / "bin" / "ggml-rpc-server"


def conditions(a: argparse.Namespace) -> list[str]:
    modes = [m for m in MODES if m != "synth" or a.synth_len]
    every = [f"{p}-{m}" for p in PLACEMENTS for m in modes] + (["native-layer"] if a.llama_server else [])
    only = [c for c in a.only.split(",") if c]
    unknown = sorted(set(only) - set(every))
    if unknown:
        raise SystemExit(f"scale_out: unknown or unavailable split condition(s) {unknown}; known: {every}")
    return only or every


def default_target() -> tuple[str, str]:
    """The 4B-scale random-weight pair of pydflash.factory.scale, if that module is there (else name --target)."""
    try:
        from pydflash.factory.scale import write_scale_pair
    except ImportError as exc:
        raise SystemExit("scale_out: no --target, and pydflash.factory.scale is not there to make the 4B-scale "
                         "target: pass --target and --drafter") from exc
    from pydflash.defaults import cache_dir

    pair = write_scale_pair(cache_dir() / "scale-qwen3-4b", shape="qwen3-4b", quants=("Q4_K_M",))
    return str(pair.targets["Q4_K_M"]), str(pair.drafter)


def start_rpc_server(log: pathlib.Path) -> tuple[subprocess.Popen, str]:
    """A ggml-rpc-server on a free loopback port, on GPU 1 (the CPU where there is none), once it answers."""
    from server_load import free_port

    port = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=str(LIB_DIR), CUDA_VISIBLE_DEVICES=RPC_GPU)
    # coreutils timeout: a server orphaned by a benchmark that died ends on its own
    proc = subprocess.Popen(["timeout", "3600", str(RPC_SERVER), "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    ep = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            rpc_endpoints.probe(rpc_endpoints.parse_endpoint(ep), timeout_s=2.0)
            return proc, ep
        except rpc_endpoints.RpcUnreachable:
            time.sleep(0.1)
    stop(proc)
    raise SystemExit(f"scale_out: {RPC_SERVER} did not answer on {ep}; see {log}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def server_args(cond: str, target: str, drafter: str, a: argparse.Namespace, rpc_ep: str | None) -> list[str]:
    mode = cond.split("-")[1]
    args = ["-m", target, "-ngl", "-1", "-t", str(a.threads)]
    if mode == "plain":
        args.append("--no-spec")
    else:
        args += ["-md", drafter] + (["--spec-synth-len", str(a.synth_len)] if mode == "synth" else [])
    return args + (["--rpc", rpc_ep] if rpc_ep else [])


def start(cond: str, target: str, drafter: str, a: argparse.Namespace, work: pathlib.Path) -> tuple[Server, list]:
    """The condition's server (and its ggml-rpc-server): the things to stop afterwards."""
    log = work / f"{cond}.log"
    if cond == "native-layer":
        return Server(["-m", target, "-ngl", "99", "-sm", "layer"], log, ready_timeout=600,
                      program=[a.llama_server], env={"CUDA_VISIBLE_DEVICES": "0,1"}), []
    placement = cond.split("-")[0]
    extra = []
    rpc_ep = None
    if placement == "rpc":
        proc, rpc_ep = start_rpc_server(work / f"{cond}.rpc.log")
        extra.append(proc)
    try:
        # verbose with llama.cpp's debug lines (patches/0010 skips them): the load log names each layer's device
        srv = Server(server_args(cond, target, drafter, a, rpc_ep), log, ready_timeout=600,
                     env={"CUDA_VISIBLE_DEVICES": PLACEMENTS[placement], "PYDFLASH_VERBOSE": "1",
                          "GGML_LOG_SKIP_DEBUG": "0"})
    except BaseException:
        for p in extra:
            stop(p)
        raise
    return srv, extra


def placement(log: pathlib.Path) -> dict[str, int]:
    """Layers per device over the models a server loaded (target and drafter), from llama.cpp's load log."""
    out: dict[str, int] = {}
    for dev in re.findall(r"layer\s+\d+ assigned to device (\S+),", log.read_text(errors="replace")):
        out[dev] = out.get(dev, 0) + 1
    return out


def run_split(a: argparse.Namespace, work: pathlib.Path, measure) -> dict:
    """Every condition in turn (``measure`` is scale_out.py's: the streamed client levels); rounds interleave."""
    target, drafter = (a.target, a.drafter) if a.target else default_target()
    if any(not c.endswith("plain") and c != "native-layer" for c in conditions(a)) and not drafter:
        raise SystemExit("scale_out: the spec and synth conditions need --drafter")
    if "rpc" in " ".join(conditions(a)) and not RPC_SERVER.is_file():
        raise SystemExit(f"scale_out: {RPC_SERVER} is missing: build the ggml-rpc-server target")
    rounds = []
    for rnd in range(a.rounds):
        res = {}
        for cond in conditions(a):
            print(f"round {rnd + 1}: {cond}", file=sys.stderr, flush=True)
            srv, extra = start(cond, target, drafter, a, work)
            try:
                res[cond] = measure(srv.base, a, a.split_clients, probes=PROBES)
            finally:
                srv.stop()
                for p in extra:
                    stop(p)
            res[cond]["layers_per_device"] = placement(work / f"{cond}.log")
        rounds.append(res)
    ref = rounds[0].get("one-plain", {}).get("texts")
    same = {c: r["texts"] == ref for c, r in rounds[0].items() if ref and "synth" not in c and c != "one-plain"}
    return {"target": target, "drafter": drafter, "synth_len": a.synth_len, "conditions": conditions(a),
            "rounds": rounds, "texts_equal_one_plain": same}


def split_markdown(rep: dict, clients: list[int]) -> str:
    import statistics

    def tps(cond: str, i: int):
        xs = [r[cond]["levels"][i]["tok_per_s"] for r in rep["rounds"] if cond in r]
        return round(statistics.median(xs), 2) if xs else None

    def cell(cond: str, i: int) -> str:
        ttft = [r[cond]["levels"][i]["ttft_ms_p50"] for r in rep["rounds"] if cond in r]
        return f"{fmt(tps(cond, i))} ({fmt(statistics.median(ttft)) if ttft else '-'} ms)"

    conds = rep["conditions"]
    out = ["| condition | " + " | ".join(f"c={c} tok/s (TTFT p50)" for c in clients)
           + " | vs its plain, c=1 | text = one-plain |", "|---" * (len(clients) + 3) + "|"]
    for cond in conds:
        plain = cond.rsplit("-", 1)[0] + "-plain"
        vs = fmt(round(tps(cond, 0) / tps(plain, 0), 2)) if plain in conds and plain != cond and tps(plain, 0) else "-"
        same = rep["texts_equal_one_plain"].get(cond)
        out.append(f"| {cond} | " + " | ".join(cell(cond, i) for i in range(len(clients)))
                   + f" | {vs} | {'-' if same is None else 'yes' if same else 'NO'} |")
    out += ["", f"Target `{rep['target']}`, drafter `{rep['drafter']}`; synth = `--spec-synth-len "
            f"{rep['synth_len']}`. Per condition, GPU memory in use (MiB per GPU) and llama.cpp's layers per "
            "device (target and drafter, from the load log): "
            + "; ".join(f"{c} {rep['rounds'][0][c].get('gpu_mib')} {rep['rounds'][0][c].get('layers_per_device')}"
                        for c in conds) + "."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit("run it as: scripts/bench/scale_out.py --part split ...")
