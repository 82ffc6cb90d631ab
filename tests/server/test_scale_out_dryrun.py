"""scripts/bench/scale_out.py's code paths on CPU, as the GPU run takes them: the plumbing, not the speed.

- ``--part replicas``: ``pydflash-server --ray auto`` with 2 engine replicas of one tiny preset joins a Ray instance
  this process started; Serve runs both replicas, both answer the benchmark's streamed clients
  (``X-Pydflash-Replica``), ``"model": "any"`` reaches the preset, and a replica killed while requests are in
  flight leaves the other serving: its streams end with the 503 error event and ``[DONE]``, non-streamed requests
  are sent again and answer.
- ``--part split``: the target over a ``ggml-rpc-server`` (from our build) answers the benchmark's greedy probes as
  the local target does, plain and speculative, with layers on the RPC device.

What test_server_ray.py and test_rpc.py check (routing between presets, eviction, the RPC address policy) is not
repeated here.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import httpx
import pytest

from tests.helpers.bench import load_bench

TIMEOUT = 60  # seconds, on every client call: a hang fails the test instead of stalling the suite


def _load(name: str):
    return load_bench(name, register=True)  # rpc_split imports server_load as scale_out does: one copy of each


scale_out = _load("scale_out")
rpc_split = _load("rpc_split")


def bench_args(*extra: str):
    return scale_out.parse_args(["--requests", "2", "--tokens", "24", *extra])


# --- replicas -----------------------------------------------------------------------------------------------------
@pytest.fixture()
def ray_instance():
    ray = pytest.importorskip("ray", reason="the ray[serve] extra is not installed (pip install -e '.[ray]')")
    pytest.importorskip("ray.serve", reason="the ray[serve] extra is not installed (pip install -e '.[ray]')")
    saved = dict(os.environ), signal.getsignal(signal.SIGTERM), sys.excepthook
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        # ray.init leaves RAY_* variables, a SIGTERM handler and an excepthook in this (shared) pytest process
        env, sigterm, hook = saved
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGTERM, sigterm)
        sys.excepthook = hook


def stream(base: str, body: dict, out: dict, started: threading.Event) -> None:
    """One streamed request: its replica and its data lines, into ``out``."""
    out["frames"] = []
    try:
        with httpx.Client(base_url=base, timeout=TIMEOUT) as c, \
                c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            out["status"], out["replica"] = r.status_code, r.headers.get(scale_out.REPLICA)
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out["frames"].append(line[6:])
                    started.set()
    except httpx.HTTPError as exc:  # a cut connection is the failure this test looks for
        out["error"] = repr(exc)
    started.set()


def post(base: str, body: dict, out: dict) -> None:
    try:
        r = httpx.post(base + "/v1/completions", json=body, timeout=TIMEOUT)
        out.update(status=r.status_code, replica=r.headers.get(scale_out.REPLICA), body=r.json())
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)


@pytest.mark.slow
def test_two_replicas_through_pydflash_server_ray(tiny, tmp_path, ray_instance):
    pair = tiny("gemma3")
    # no copied chains: the tiny target's text after "hello" loops, and with copies a long request below finished
    # before its replica was killed (CI, 2026-12-06); the kill must meet streams in flight
    args = ["-m", str(pair.target), "-md", str(pair.drafter), "-c", "2048", "--no-lookup"]
    srv = scale_out.start_serve(args, 2, tmp_path / "serve.log")
    try:
        # the app answers once one replica is up; Serve may still be starting the other on a loaded machine
        deadline = time.monotonic() + 90
        while scale_out.replica_states() != {"RUNNING": 2} and time.monotonic() < deadline:
            time.sleep(0.5)
        assert scale_out.replica_states() == {"RUNNING": 2}
        # the benchmark's level: 4 clients x 2 streamed requests; both replicas hold the preset and take some
        res = scale_out.measure(srv.base, bench_args("--part", "replicas"), [4], probes=1)
        lvl = res["levels"][0]
        assert lvl["completion_tokens"] == 4 * 2 * 24 and res["texts"][0]
        assert len(lvl["per_replica"]) == 2, lvl["per_replica"]

        model = scale_out.model_id(srv.base)
        r = httpx.post(srv.base + "/v1/completions", timeout=TIMEOUT,
                       json={"model": "any", "prompt": "hello", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["model"] == model, r.text
        assert r.headers[scale_out.REPLICA] in lvl["per_replica"]

        # 4 long streams and 2 long non-streamed requests in flight; one replica that serves a stream is killed
        body = {"model": model, "prompt": "hello", "max_tokens": 800, "ignore_eos": True, "temperature": 0}
        streams = [{} for _ in range(4)]
        started = [threading.Event() for _ in streams]
        posts = [{} for _ in range(2)]
        threads = [threading.Thread(target=stream, args=(srv.base, body, s, e)) for s, e in zip(streams, started)]
        threads += [threading.Thread(target=post, args=(srv.base, body, p)) for p in posts]
        for t in threads:
            t.start()
        assert all(e.wait(TIMEOUT) for e in started)
        victim = streams[0]["replica"]
        ray_instance.kill(ray_instance.get_actor(victim, namespace="serve"), no_restart=True)
        for t in threads:
            t.join(TIMEOUT)
            assert not t.is_alive()

        for s in streams:
            assert "error" not in s and s["status"] == 200 and s["frames"][-1] == "[DONE]", s.get("error")
            last = json.loads(s["frames"][-2])
            if s["replica"] == victim:  # cut: the clean error event, not a broken connection
                # (read with .get so that a stream that ended without one shows its last frame and length: CI on
                # 2026-12-08 once saw the victim's stream end on a plain data frame and [DONE], cause not yet found)
                err = last.get("error", {})
                assert err.get("code") == 503 and err.get("type") == "unavailable_error", (len(s["frames"]), last)
            else:  # the other replica's streams ran to their end
                assert last["choices"][0]["finish_reason"] == "length", last
        for p in posts:  # sent again to a live replica if theirs died before answering
            assert "error" not in p and p["status"] == 200, p
            assert p["body"]["usage"]["completion_tokens"] == 800 and p["replica"] != victim
        r = httpx.post(srv.base + "/v1/completions", timeout=TIMEOUT,
                       json={"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.headers[scale_out.REPLICA] != victim, r.text
    finally:
        scale_out.stop_serve(srv)


# --- split --------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_split_over_rpc_answers_as_local(tiny, tmp_path):
    assert rpc_split.RPC_SERVER.is_file(), f"{rpc_split.RPC_SERVER} is missing: scripts/build_native.sh builds it"
    pair = tiny("qwen3")
    a = bench_args("--part", "split", "--target", str(pair.target), "--drafter", str(pair.drafter),
                   "--only", "one-plain,rpc-plain,rpc-spec", "--split-clients", "2")
    rep = rpc_split.run_split(a, tmp_path, scale_out.measure)
    assert rep["texts_equal_one_plain"] == {"rpc-plain": True, "rpc-spec": True}
    res = rep["rounds"][0]
    assert all(r["levels"][0]["completion_tokens"] == 2 * 2 * 24 for r in res.values())
    plain, spec = res["rpc-plain"]["layers_per_device"], res["rpc-spec"]["layers_per_device"]
    rpc_layers = lambda layers: sum(n for dev, n in layers.items() if dev.startswith("RPC"))  # noqa: E731
    assert rpc_layers(plain) > 0 and rpc_layers(res["one-plain"]["layers_per_device"]) == 0, (plain, res)
    # the drafter's layers came on top, all local: the RPC device holds the target's alone
    assert sum(spec.values()) > sum(plain.values()) and rpc_layers(spec) == rpc_layers(plain), (plain, spec)
    table = rpc_split.split_markdown(rep, a.split_clients)
    assert "| rpc-spec |" in table and "NO" not in table
