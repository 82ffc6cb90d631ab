"""pydflash on Ray Serve: the application (ingress + engine deployment) and its builder.

    serve run pydflash.server.ray.app:app config=models.toml max_models_per_replica=2
    serve run serve_config.yaml          # import_path: pydflash.server.ray.app:app (sample in docs/scale-out.md)

``app`` is a Serve application builder: its arguments (``AppArgs``) come from ``serve run`` or from the config's
``args``. Replica counts, autoscaling bounds and ``num_gpus`` per replica are Serve's own deployment options: set
them in the config's ``deployments`` section (names ``PydflashIngress`` and ``PydflashEngine``) or through
``build``'s ``engine_options``. Model files must sit at the same path on every node that runs an engine replica.
"""

from __future__ import annotations

import os
from typing import Optional

from pydantic import BaseModel, Field
from ray import serve
from ray.serve import Application

from ..app import MAX_BODY_BYTES
from ..preset import ServerModels
from .ingress import Ingress
from .replica import Replica

INGRESS = "PydflashIngress"
ENGINE = "PydflashEngine"
# the ingress only relays bytes: no CPU reserved, and enough concurrency for every stream it carries
INGRESS_OPTIONS = {"num_replicas": 1, "max_ongoing_requests": 1024, "ray_actor_options": {"num_cpus": 0}}


class AppArgs(BaseModel):
    """Arguments of ``pydflash.server.ray.app:app`` (``serve run ... key=value`` or the Serve config's ``args``)."""

    config: Optional[str] = Field(None, description="models.toml with named presets (default: pydflash-server's "
                                                    "embedded default pair)")
    max_models_per_replica: int = Field(2, ge=1, description="presets one engine replica holds (LRU eviction)")
    api_key: Optional[str] = Field(None, description="require Authorization: Bearer KEY (default: "
                                                     "$PYDFLASH_API_KEY on the node that builds the app)")
    max_body_mb: float = Field(MAX_BODY_BYTES / 2**20, gt=0, description="largest request body (413 above)")
    preload: bool = Field(True, description="each engine replica loads the default preset at start")


def app(args: dict) -> Application:
    """The Serve application builder."""
    a = AppArgs(**args)
    return build(_models(a.config), max_models_per_replica=a.max_models_per_replica,
                 api_key=a.api_key or os.environ.get("PYDFLASH_API_KEY") or None,
                 max_body_bytes=int(a.max_body_mb * 2**20), preload=a.preload)


def build(models: ServerModels, max_models_per_replica: int = 2, api_key: Optional[str] = None,
          max_body_bytes: int = MAX_BODY_BYTES, preload: bool = True, engine_options: Optional[dict] = None,
          ingress_options: Optional[dict] = None) -> Application:
    """The application over ``models``: one ingress (the pydflash-server app) in front of the engine deployment."""
    if max_models_per_replica < 1:
        raise ValueError("max_models_per_replica must be >= 1")
    engine = serve.deployment(Replica, name=ENGINE, **_engine_defaults(models)).options(
        **(engine_options or {}))
    ingress = serve.deployment(serve.ingress()(Ingress), name=INGRESS, **INGRESS_OPTIONS).options(
        **(ingress_options or {}))
    return ingress.bind(engine.bind(models, max_models_per_replica, preload), models, api_key, max_body_bytes)


def _engine_defaults(models: ServerModels) -> dict:
    """A replica takes up to twice its largest preset's slots before Serve queues at the ingress and routes to the
    least loaded replica; a preset with GPU layers asks for a GPU per replica."""
    slots = max(p.n_slots for p in models.presets.values())
    gpu = any(p.n_gpu_layers != 0 for p in models.presets.values())
    return {"num_replicas": 1, "max_ongoing_requests": 2 * slots,
            "ray_actor_options": {"num_cpus": 1, "num_gpus": 1 if gpu else 0}}


def _models(config: Optional[str]) -> ServerModels:
    """The presets of ``config``, else the embedded default pair as ``pydflash-server`` serves it without flags."""
    return ServerModels.from_toml(config) if config else ServerModels.single()
