"""pydflash-server: an OpenAI-compatible server with DFlash speculative decoding, over one or several model pairs.

    pydflash-server                          the embedded default pair (Gemma-3-270M + the shipped drafter)
    pydflash-server -m TARGET [-md DRAFTER]  one pair
    pydflash-server --config models.toml     named presets, loaded lazily, at most --max-resident at once

Bad flags or a bad config print one line and exit 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

from .placement import add_placement_args

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        sys.stderr.write(f"pydflash-server: error: {message}\n")
        raise SystemExit(EXIT_BAD_INPUT)


def parse_args(argv=None) -> argparse.Namespace:
    p = _Parser(prog="pydflash-server", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--config", help="models.toml with named presets")
    src.add_argument("-m", "--model", help="target GGUF")
    p.add_argument("-md", "--model-draft", help="DFlash drafter GGUF for -m")
    p.add_argument("--alias", default=None, help="the model name clients use with -m (default: the file's stem)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=os.environ.get("PYDFLASH_API_KEY"),
                   help="require Authorization: Bearer KEY (default: $PYDFLASH_API_KEY)")
    p.add_argument("--max-resident", type=int, default=2, help="model workers loaded at once (LRU eviction)")
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="serve through Ray Serve on this Ray cluster: auto, local, or ray://HOST:10001 "
                        "(needs the ray extra; docs/scale-out.md)")
    p.add_argument("--ray-replicas", metavar="N", type=int, default=1, help="with --ray: engine replicas")
    p.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body (413 above)")
    p.add_argument("--no-preload", action="store_true", help="load the default model on its first request")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip running each context's largest batch at load on a GPU (its first run is slow)")
    g = p.add_argument_group("the pair of -m (or the embedded default)")
    g.add_argument("-np", "--parallel", type=int, default=4, help="slots (concurrent requests)")
    g.add_argument("-c", "--ctx-size", type=int, default=4096, help="context of each slot")
    g.add_argument("-b", "--batch-size", type=int, default=512, help="prefill chunk")
    g.add_argument("-t", "--threads", type=int, default=0, help="threads (0 = llama.cpp default)")
    add_placement_args(g)
    g.add_argument("--draft-max", type=int, default=None, help="drafts per step (default: trained block - 1)")
    # None = not given: adaptive, except under --spec-synth-len, whose forced acceptance assumes a fixed block
    g.add_argument("--draft-adaptive", action=argparse.BooleanOptionalAction, default=None,
                   help="shrink drafting, down to none, while it does not pay (default: on); --no-draft-adaptive: "
                        "always draft --draft-max tokens")
    g.add_argument("--no-lookup", action="store_true",
                   help="verify only the drafter's blocks, never a continuation copied from the text itself")
    g.add_argument("--no-spec", action="store_true", help="plain decoding through the same engine")
    g.add_argument("--chat-template", default=None, help="a built-in template NAME (gemma, chatml) or a FILE")
    g.add_argument("--max-queue", type=int, default=64, help="requests waiting for a slot before 429")
    c = p.add_argument_group("prompt cache of the pair of -m (docs/cache.md; --config presets set their own)")
    c.add_argument("--cache-device", metavar="CELLS", type=int, default=-1,
                   help="KV cells that keep finished requests' sequences on the device for later prompts sharing a "
                        "prefix, no copy (-1 = a quarter of the KV, the default; 0 = off)")
    c.add_argument("--cache-ram", metavar="MiB", type=float, default=0.0,
                   help="RAM tier: what the device tier evicts, copied out of the KV (0 = off, the default)")
    c.add_argument("--no-cache-reuse", action="store_true",
                   help="do not keep a finished request's prompt in its slot for the next request")
    c.add_argument("--ctx-checkpoint-every", metavar="N", type=int, default=256,
                   help="sliding-window targets: a checkpoint every N positions (0 = none; default 256)")
    c.add_argument("--slot-save-path", metavar="DIR", default=None,
                   help="directory for POST /slots/{id}?action=save|restore files (default: those are refused)")
    g.add_argument("--spec-synth-len", metavar="L", type=float, default=None,
                   help="benchmarking only: force this mean acceptance length, with a fixed draft block unless "
                        "--draft-adaptive (L = 1 then stands for a useless drafter); the text is not valid output")
    p.add_argument("-v", "--verbose", action="store_true", help="log requests and model loads")
    return p.parse_args(argv)


def build_models(args):
    """The presets the flags name: ``--config``'s, or the one pair of ``-m``/``-md`` (the embedded default without
    them). Flag combinations are checked here; the presets check themselves (``server/preset.py``)."""
    from ..server.preset import ServerModels
    from .speculative import gpu_layers

    save_path = None
    if args.slot_save_path is not None:
        if not os.path.isdir(args.slot_save_path):
            raise ValueError(f"--slot-save-path {args.slot_save_path}: no such directory")
        save_path = os.path.abspath(args.slot_save_path)
    if args.config:
        if args.model_draft:
            raise ValueError("-md goes with -m; drafters of --config presets are set in the config")
        if args.rpc is not None or args.rpc_allow_public:
            raise ValueError("--rpc goes with -m; --config presets set rpc = [\"host:port\", ...] in the config")
        return ServerModels.from_toml(args.config)
    if args.model_draft and not args.model:
        raise ValueError("-md needs -m: a drafter is paired with the target it was trained for")
    return ServerModels.single(
        args.model, "" if args.no_spec else args.model_draft, name=args.alias,
        n_slots=args.parallel, n_ctx_slot=args.ctx_size, n_batch=args.batch_size, n_threads=args.threads,
        n_gpu_layers=gpu_layers(args), rpc=args.rpc if args.rpc is not None else (),
        rpc_allow_public=args.rpc_allow_public, draft_max=args.draft_max,
        draft_adaptive=args.draft_adaptive if args.draft_adaptive is not None else args.spec_synth_len is None,
        lookup=not args.no_lookup, chat_template=args.chat_template, max_queue=args.max_queue,
        cache_reuse=not args.no_cache_reuse, cache_device_cells=args.cache_device, cache_ram_mib=args.cache_ram,
        checkpoint_every=args.ctx_checkpoint_every, slot_save_path=save_path, synth_len=args.spec_synth_len,
        warm_up=not args.no_warmup)


def check_rpc_servers(models) -> None:
    """Every preset's RPC servers resolve, pass the address policy and answer the handshake now: a dead endpoint is
    a config error at start rather than a worker that fails to load later (RpcUnreachable is not a ValueError)."""
    from ..rpc_endpoints import parse_endpoint, probe, resolve_all

    for preset in models.presets.values():
        for ep in resolve_all(preset.rpc, preset.rpc_allow_public):
            probe(parse_endpoint(ep))


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach host: a loopback address or "localhost" (any other name may resolve
    to a public address, so it counts as reachable from outside)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, api_key) -> str:
    """The warning for a server other machines can reach with no API key ("" when it does not apply): every
    route but /health then serves anyone who can reach the port."""
    if api_key or is_loopback(host):
        return ""
    where = "all interfaces" if host in ("0.0.0.0", "::", "[::]", "") else host
    return (f"listening on {host} ({where}) without an API key: anyone who can reach this port can use the models; "
            "set --api-key (or PYDFLASH_API_KEY), or bind 127.0.0.1")


def main(argv=None) -> int:
    from ..errors import PydflashError

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        models = build_models(args)
        if args.max_resident < 1:
            raise ValueError("--max-resident must be >= 1")
        if not 1 <= args.port <= 65535:
            raise ValueError("--port must be in 1..65535")
        check_rpc_servers(models)
    except (ValueError, PydflashError) as exc:  # ConfigError is a ValueError too; RpcUnreachable a ModelLoadError
        sys.stderr.write(f"pydflash-server: error: {exc}\n")
        return EXIT_BAD_INPUT
    if args.ray:
        from . import server_ray

        return server_ray.main(args, models)

    import uvicorn

    from ..server import keepalive
    from ..server.app import create_app

    app = create_app(models, api_key=args.api_key or None, max_resident=args.max_resident,
                     max_body_bytes=int(args.max_body_mb * 1024 * 1024), preload=not args.no_preload,
                     log_level="info" if args.verbose else "warning")
    log = logging.getLogger("pydflash.server")
    if args.spec_synth_len is not None:
        log.warning("--spec-synth-len %g: acceptance is forced, the generated text is NOT valid model output",
                    args.spec_synth_len)
    exposed = exposure_warning(args.host, args.api_key)
    if exposed:
        log.warning("%s", exposed)
    # shown without -v too, but as what it is: information, not a warning
    startup = logging.getLogger("pydflash.server.startup")
    startup.setLevel(logging.INFO)
    startup.info("serving %s on http://%s:%d (models: %s)", "with an API key" if args.api_key else "without an API key",
                 args.host, args.port, ", ".join(models.presets))
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning",
                access_log=args.verbose, timeout_graceful_shutdown=5, timeout_keep_alive=keepalive.PUBLIC_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
