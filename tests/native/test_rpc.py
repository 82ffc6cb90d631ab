"""The target split over llama.cpp RPC servers: two real ggml-rpc-server processes (from our build) on loopback.

Greedy speculative output with the target's layers on the local CPU and both servers equals local plain decoding
(up to the regret gate of tests/helpers/oracle.py); the address policy, endpoint syntax and dead servers give one-line
errors (exit 2 from the CLIs) in well under the handshake timeout, never a hang or an abort.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers.oracle import Oracle
from tests.helpers.server_util import REPO, free_port

from pydflash import api
from pydflash import rpc_endpoints as rpc
from pydflash.config import EngineConfig
from pydflash.engine.request import Request
from pydflash.native._lib import LIB_DIR

RPC_SERVER = LIB_DIR.parent / "bin" / "ggml-rpc-server"
PROMPTS = ["hello world", "the cat sat on", "1 2 3 4"]


def _start_server():
    """One ggml-rpc-server on a free loopback port (CPU, one thread, no file cache); retried if the port was taken."""
    assert RPC_SERVER.is_file(), f"{RPC_SERVER} is missing: scripts/build_native.sh builds it"
    env = dict(os.environ, LD_LIBRARY_PATH=str(LIB_DIR))  # the installed libraries, not the build tree's
    for _ in range(3):
        port = free_port()
        # coreutils timeout: a server orphaned by a test process that died without its teardown ends on its own
        proc = subprocess.Popen(["timeout", "600", str(RPC_SERVER), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                rpc.probe(rpc.Endpoint("127.0.0.1", port), timeout_s=2.0)
                return proc, f"127.0.0.1:{port}"
            except rpc.RpcUnreachable:
                time.sleep(0.05)
        _stop(proc)
    raise RuntimeError("ggml-rpc-server did not come up")


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextlib.contextmanager
def _two_servers():
    procs = []
    try:
        for _ in range(2):
            procs.append(_start_server())
        yield [ep for _, ep in procs]
    finally:
        for proc, _ in procs:
            _stop(proc)


@pytest.fixture(scope="module")
def servers():
    with _two_servers() as eps:
        yield eps


@pytest.fixture()
def closed_port():
    """A loopback port with nothing listening: connect() is refused at once."""
    return free_port()


def _placement(log: str) -> dict[int, str]:
    """layer -> endpoint (or CPU) from llama.cpp's load log of one model."""
    names = dict(re.findall(r"using device (RPC\d+) \((\S+)\)", log))
    layers = re.findall(r"layer\s+(\d+) assigned to device (\S+),", log)
    return {int(i): names.get(dev, dev) for i, dev in layers}


def test_protocol_constants_match_the_vendored_header():
    inc = REPO / "vendor" / "llama.cpp" / "ggml"
    if not inc.is_dir():
        pytest.skip("vendor/llama.cpp is not extracted")
    header = (inc / "include" / "ggml-rpc.h").read_text()
    assert f"RPC_PROTO_MAJOR_VERSION    {rpc.RPC_PROTO_MAJOR_VERSION}\n" in header
    assert f"RPC_PROTO_MINOR_VERSION    {rpc.RPC_PROTO_MINOR_VERSION}\n" in header
    assert f"RPC_CONN_CAPS_SIZE = {rpc.RPC_CONN_CAPS_SIZE};" in (inc / "src" / "ggml-rpc" / "transport.h").read_text()
    src = (inc / "src" / "ggml-rpc" / "ggml-rpc.cpp").read_text()
    commands = re.search(r"enum rpc_cmd \{(.*?)\};", src, re.S).group(1)
    order = re.findall(r"(RPC_CMD_\w+)", commands)
    assert order.index("RPC_CMD_HELLO") == rpc.RPC_CMD_HELLO
    assert order.index("RPC_CMD_DEVICE_COUNT") == rpc.RPC_CMD_DEVICE_COUNT


def test_split_target_greedy_equals_local(tiny, servers, monkeypatch, capsys):
    p = tiny("qwen3")  # 5 layers + the output layer
    # -ngl 5: layer 0 on the local CPU, 1-3 on the first server, 4 and the output layer on the second (free memory
    # splits evenly); the output tensors are kept in CPU memory, where the drafter runs the target's head
    cfg = EngineConfig(n_slots=2, n_ctx_slot=512, n_gpu_layers=5, rpc=tuple(servers), draft_max=7)
    monkeypatch.setenv("PYDFLASH_VERBOSE", "1")
    monkeypatch.setenv("GGML_LOG_SKIP_DEBUG", "0")  # the placement lines are debug lines (patches/0010)
    llm = api.load(p.target, p.drafter, cfg)
    monkeypatch.undo()
    oracle = Oracle(p.target, n_ctx=512)
    try:
        target_log = capsys.readouterr().err.split("llama_model_loader: loaded meta data")[1]  # not the drafter's
        assert [_placement(target_log)[i] for i in range(6)] == ["CPU"] + [servers[0]] * 3 + [servers[1]] * 2
        assert re.search(r"tensor output\.weight .*buffer type overridden to CPU", target_log)
        assert len(llm.engine.pair.target.devices) == 2 and llm.engine.pair.drafter.devices == []
        prompts = [llm.tokenize(t) for t in PROMPTS]
        results = llm.generate_many([Request(t, max_tokens=32, ignore_eos=True) for t in prompts])
        assert sum(r.stats.n_drafted for r in results) > 0
        for toks, res in zip(prompts, results):
            assert len(res.tokens) == 32
            oracle.check(toks, res.tokens)
    finally:
        llm.close()
        oracle.close()


def test_two_models_share_the_servers_in_one_process(tiny, servers):
    """llama.cpp keeps one connection per server and process; the handshake check must not knock on it again (a
    ggml-rpc-server answers one connection at a time)."""
    p = tiny("qwen3")
    cfg = EngineConfig(n_ctx_slot=256, n_gpu_layers=-1, rpc=tuple(servers), draft_max=0)
    with api.load(p.target, None, cfg) as a, api.load(p.target, None, cfg) as b:
        assert a.generate("hi", max_tokens=8).tokens == b.generate("hi", max_tokens=8).tokens
    for ep in servers:  # both closed: the servers accept a new client
        assert rpc.probe(rpc.parse_endpoint(ep), timeout_s=5.0) == 1


def test_cli_plain_decoding_over_rpc_matches_local(tiny, servers):
    p = tiny("qwen3")
    r = subprocess.run([sys.executable, "-m", "pydflash.cli.speculative", "-m", str(p.target), "-p", "hello world",
                        "-n", "16", "--no-spec", "--json", "--rpc", ",".join(servers)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    oracle = Oracle(p.target, n_ctx=512)
    try:
        toks = oracle.llm.tokenize("hello world")
        # plain decoding on both sides: the same graph, only placed elsewhere (f32 CPU kernels on every device)
        want = oracle.llm.detokenize(oracle.greedy(toks, 16, ignore_eos=False))
    finally:
        oracle.close()
    assert out["n_generated"] > 0 and out["text"] == want


@pytest.fixture()
def own_servers():
    """Two servers for this test alone: stopping pydflash-server kills its worker while it holds both servers'
    connections, and a ggml-rpc-server whose client vanished mid-session may not take the next one."""
    with _two_servers() as eps:
        yield eps


def test_server_splits_the_target(tiny, own_servers):
    from tests.helpers.server_util import Server

    servers = own_servers
    p = tiny("qwen3")
    srv = Server(["-m", str(p.target), "-md", str(p.drafter), "-np", "2", "-c", "512", "-ngl", "5",
                  "--rpc", ",".join(servers)])
    oracle = Oracle(p.target, n_ctx=512)
    try:
        for ep in servers:  # the worker holds each server's one connection: another client gets no handshake
            with pytest.raises(rpc.RpcUnreachable, match="serving another client"):
                rpc.probe(rpc.parse_endpoint(ep), timeout_s=0.5)
        for prompt in PROMPTS:
            body = {"model": "any", "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                    "return_tokens": True}
            r = srv.http().post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            oracle.check(oracle.llm.tokenize(prompt), r.json()["choices"][0]["tokens"])
    finally:
        srv.stop()
        oracle.close()


def _one_line_exit_2(r, prog):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def _cli(prog, *args, timeout=60):
    module = {"pydflash-speculative": "pydflash.cli.speculative", "pydflash-server": "pydflash.cli.server"}[prog]
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("prog", ["pydflash-speculative", "pydflash-server"])
@pytest.mark.parametrize("endpoint,words", [
    ("0.0.0.0:50052", "wildcard"),
    ("8.8.8.8:50052", "public address"),
    ("10.0.0.2", "no port"),
    ("10.0.0.2:99999", "1..65535"),
    ("[::1]:50052", "IPv6"),
    ("10.0.0.2:1,,10.0.0.3:1", "stray comma"),
    ("bad_host!:1", "not an IPv4 address or host name"),
])
def test_refused_endpoints_one_line_exit_2(tiny, prog, endpoint, words):
    r = _cli(prog, "-m", str(tiny("qwen3").target), "--rpc", endpoint)
    line = _one_line_exit_2(r, prog)
    assert words in line
    if endpoint.startswith(("0.0.0.0", "8.8.8.8")):
        assert "--rpc-allow-public" in line


def test_allow_public_lets_the_wildcard_through_to_the_handshake(closed_port):
    cfg = EngineConfig(n_gpu_layers=-1, rpc=f"0.0.0.0:{closed_port}", rpc_allow_public=True)
    assert cfg.rpc == (f"0.0.0.0:{closed_port}",)
    with pytest.raises(rpc.RpcUnreachable, match="connection refused"):
        rpc.probe(rpc.parse_endpoint(cfg.rpc[0]))


@pytest.mark.parametrize("prog", ["pydflash-speculative", "pydflash-server"])
def test_dead_endpoint_is_a_quick_clear_error(tiny, servers, closed_port, prog):
    t0 = time.monotonic()
    r = _cli(prog, "-m", str(tiny("qwen3").target), "--rpc", f"{servers[0]},127.0.0.1:{closed_port}")
    line = _one_line_exit_2(r, prog)
    assert f"127.0.0.1:{closed_port}" in line and "connection refused" in line
    assert time.monotonic() - t0 < 30  # interpreter start and imports; the refusal itself is immediate


def test_silent_endpoint_times_out(tiny, monkeypatch):
    """A port that accepts but never answers (a server busy with another client, or not a ggml-rpc-server):
    llama.cpp would wait forever; the handshake gives up after CONNECT_TIMEOUT_S."""
    monkeypatch.setattr(rpc, "CONNECT_TIMEOUT_S", 0.5)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(rpc.RpcUnreachable, match="serving another client"):
            api.load(tiny("qwen3").target, None, EngineConfig(n_gpu_layers=-1, rpc=[f"127.0.0.1:{port}"]))
        assert time.monotonic() - t0 < 3


def test_not_an_rpc_server(monkeypatch):
    """A peer that closes at once (another service on that port) is named as such, not a crash."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        import threading

        def answer_and_close():
            conn, _ = listener.accept()
            conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            conn.close()

        threading.Thread(target=answer_and_close, daemon=True).start()
        with pytest.raises(rpc.RpcUnreachable, match="not a ggml-rpc-server"):
            rpc.probe(rpc.Endpoint("127.0.0.1", port), timeout_s=2.0)


def test_config_and_preset_validation(tmp_path):
    from pydflash.server.preset import ConfigError, Preset, ServerModels

    with pytest.raises(ValueError, match="n_gpu_layers"):
        EngineConfig(rpc=["10.0.0.2:50052"])  # -ngl 0 would put nothing on the servers
    with pytest.raises(ValueError, match="rpc_allow_public"):
        EngineConfig(n_gpu_layers=-1, rpc=["10.0.0.2:50052"], rpc_allow_public="yes")
    p = Preset(name="s", rpc=["10.0.0.2:50052", "rpc-host.lan:50052"], n_gpu_layers=-1)
    assert p.rpc == ("10.0.0.2:50052", "rpc-host.lan:50052") and Preset.from_json(p.to_json()) == p
    assert p.engine_config().rpc == p.rpc
    with pytest.raises(ConfigError, match="wildcard"):
        Preset(name="s", rpc=["0.0.0.0:50052"], n_gpu_layers=-1)
    assert Preset(name="s", rpc=["0.0.0.0:50052"], n_gpu_layers=-1, rpc_allow_public=True).rpc_allow_public
    cfg = tmp_path / "models.toml"
    cfg.write_text('[a]\ntarget = "x.gguf"\nn_gpu_layers = -1\nrpc = ["203.0.113.9:50052"]\n')
    with pytest.raises(ConfigError, match="public address"):
        ServerModels.from_toml(cfg)
    cfg.write_text('[a]\ntarget = "x.gguf"\nn_gpu_layers = -1\nrpc = [50052]\n')
    with pytest.raises(ConfigError, match="must be a string"):
        ServerModels.from_toml(cfg)


def test_server_flags_reach_the_preset():
    from pydflash.cli.server import build_models, parse_args

    p = build_models(parse_args(["--rpc", "10.0.0.2:50052,10.0.0.3:50052"])).presets["default"]
    assert p.rpc == ("10.0.0.2:50052", "10.0.0.3:50052") and p.n_gpu_layers == -1  # all layers unless -ngl
    assert build_models(parse_args(["--rpc", "10.0.0.2:1", "-ngl", "3"])).presets["default"].n_gpu_layers == 3
    assert build_models(parse_args([])).presets["default"].rpc == ()
    r = _cli("pydflash-server", "--config", "models.toml", "--rpc", "10.0.0.2:1")
    assert "--rpc goes with -m" in _one_line_exit_2(r, "pydflash-server")
