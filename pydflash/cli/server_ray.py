"""``pydflash-server --ray ADDRESS``: the same server, deployed on a Ray cluster through Ray Serve.

The flags mean what they mean without ``--ray`` (``--config``/``-m`` presets, ``--api-key``, ``--host``/``--port``
of the HTTP proxy, ``--max-resident`` as models per engine replica, ``--no-preload``); ``--ray-replicas`` sets the
engine replicas. Ray is imported only here, so ``pydflash-server`` without ``--ray`` never needs it.
"""

from __future__ import annotations

import importlib.util
import logging
import signal
import sys
import threading
import time

log = logging.getLogger("pydflash.server")
APP_NAME = "pydflash"
EXIT_BAD_INPUT = 2
DELETE_TIMEOUT_S = 30.0


def main(args, models) -> int:
    """Deploy ``models`` (a ServerModels built from the flags) on the cluster at ``args.ray``; serve until stopped."""
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        sys.stderr.write("pydflash-server: error: --ray needs Ray Serve: pip install 'pydflash[ray]'\n")
        return EXIT_BAD_INPUT
    replicas = getattr(args, "ray_replicas", 1)
    if replicas < 1:
        sys.stderr.write("pydflash-server: error: --ray-replicas must be >= 1\n")
        return EXIT_BAD_INPUT
    return run(args.ray, models, host=args.host, port=args.port, api_key=args.api_key or None,
               max_models_per_replica=args.max_resident, num_replicas=replicas,
               max_body_bytes=int(args.max_body_mb * 1024 * 1024), preload=not args.no_preload)


def run(address: str, models, host: str = "127.0.0.1", port: int = 8080, api_key=None, max_models_per_replica: int = 2,
        num_replicas: int = 1, max_body_bytes: int = 16 * 1024 * 1024, preload: bool = True) -> int:
    """Connect to Ray at ``address`` ("auto", "local" for a new local instance, or "ray://HOST:10001"), start Serve's
    HTTP proxy on host:port, deploy the application, and serve until SIGINT or SIGTERM; then delete it."""
    import ray
    from ray import serve

    from ..server.ray.app import build

    ray.init(address=address, include_dashboard=False if address == "local" else None, log_to_driver=False)
    # stop as on Ctrl-C, also while Serve still deploys (after ray.init, whose own SIGTERM handler aborts)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve.start(http_options={"host": host, "port": port})  # an already running Serve keeps its own
        serve.run(build(models, max_models_per_replica=max_models_per_replica, api_key=api_key,
                        max_body_bytes=max_body_bytes, preload=preload,
                        engine_options={"num_replicas": num_replicas}),
                  name=APP_NAME, route_prefix="/")
        log.warning("serving %s on http://%s:%d through Ray Serve at %s (models: %s; %d engine replica(s))",
                    "with an API key" if api_key else "without an API key", host, port, address,
                    ", ".join(models.presets), num_replicas)
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        if address != "local":  # a local instance goes down whole with ray.shutdown()
            log.warning("stopping: deleting the Serve application %r", APP_NAME)
            _bounded(lambda: serve.delete(APP_NAME), DELETE_TIMEOUT_S)
        return 0
    finally:
        ray.shutdown()


def _bounded(fn, timeout_s: float) -> None:
    """fn() on a daemon thread, waited for at most timeout_s: a cluster in trouble must not hang the exit."""
    def call():
        try:
            fn()
        except Exception as exc:
            log.warning("%s", exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout_s)


def _interrupt(*_):
    raise KeyboardInterrupt
