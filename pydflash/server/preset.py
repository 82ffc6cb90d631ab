"""Model presets: what one worker serves (a target, an optional drafter, and how to run them).

``models.toml`` holds one table per preset:

    default = "gemma"          # optional: the preset for "model": "any" when nothing is resident

    [gemma]
    target = "gemma-3-270m-q4_k_m.gguf"   # relative paths are relative to the config file
    drafter = "gemma-3-270m-dflash-q8_0.gguf"
    n_slots = 4
    n_ctx_slot = 4096
    cache_ram_mib = 0                     # prompt cache (docs/cache.md); slot_save_path is relative to this file too

    [split]                               # the target's layers over llama.cpp RPC servers (pydflash/rpc_endpoints.py)
    target = "big.gguf"
    n_gpu_layers = -1                     # layers offloaded to the local GPUs and the RPC servers together
    rpc = ["10.0.0.2:50052", "10.0.0.3:50052"]   # a trusted private network only (rpc_allow_public = true forces)

A preset's name is only ever looked up in this table; it is never joined into a path.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from dataclasses import dataclass
from typing import Optional

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ..cache.config import CacheConfig
from ..config import EngineConfig
from ..defaults import default_pair
from ..errors import InvalidRequest

EMBEDDED = "embedded"  # target value: the embedded default pair (Gemma-3-270M + the shipped drafter)


class ConfigError(InvalidRequest):
    """models.toml (or the flags) describe no valid preset."""


@dataclass(frozen=True)
class Preset:
    name: str
    target: str = EMBEDDED
    drafter: Optional[str] = None  # with target = EMBEDDED: None means the shipped drafter, "" none
    n_slots: int = 4
    n_ctx_slot: int = 4096
    n_batch: int = 512
    n_threads: int = 0
    n_gpu_layers: int = 0  # layers offloaded to the local GPUs and the RPC servers together (-1 = all)
    # llama.cpp RPC servers ("host:port") that take the target's offloaded layers; the drafter stays local.
    # Unauthenticated: private addresses only unless rpc_allow_public (pydflash/rpc_endpoints.py)
    rpc: tuple[str, ...] = ()
    rpc_allow_public: bool = False
    draft_max: Optional[int] = None
    draft_adaptive: bool = True
    lookup: bool = True  # copied chains where the text repeats itself (engine/lookup.py; --no-lookup)
    warm_up: bool = True  # each context's largest batch once at load, on a GPU (engine/warmup.py; --no-warmup)
    chat_template: Optional[str] = None  # a built-in NAME or a FILE; default: the GGUF's, else by architecture
    max_queue: int = 64  # requests waiting for a slot before 429
    # prompt cache (docs/cache.md): llama-server's --cache-reuse, --cache-ram, --ctx-checkpoints, --slot-save-path
    cache_reuse: bool = True
    cache_device_cells: int = -1  # KV cells for sequences kept on the device (-1 = a quarter of the KV, 0 = off)
    cache_ram_mib: float = 0.0  # 0 = no RAM cache (a state copy per entry: opt-in)
    checkpoint_every: int = 256
    slot_save_path: Optional[str] = None  # directory of /slots/{id}?action=save|restore files; None = refused
    # benchmarking only: forced mean acceptance length (pydflash-speculative --spec-synth-len); the text is invalid
    synth_len: Optional[float] = None

    def __post_init__(self):
        if not self.name or len(self.name) > 128 or any(ord(c) < 32 for c in self.name):
            raise ConfigError(f"bad preset name {self.name!r}")
        # "no" would read as true (rpc_allow_public: EngineConfig checks it, below)
        for key in ("draft_adaptive", "lookup", "cache_reuse", "warm_up"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"preset {self.name!r}: {key} must be true or false")
        try:
            # rpc as EngineConfig normalises it (a list from models.toml or JSON, or "a:1,b:2") into the frozen field
            object.__setattr__(self, "rpc", self.engine_config().rpc)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"preset {self.name!r}: {exc}") from exc
        if self.max_queue < 0:
            raise ConfigError(f"preset {self.name!r}: max_queue must be >= 0")
        try:
            self.cache_config()
        except (ValueError, TypeError) as exc:  # TypeError: a string where models.toml needs a number
            raise ConfigError(f"preset {self.name!r}: {exc}") from exc
        if self.synth_len is not None and (self.drafter == "" or self.draft_max == 0):
            raise ConfigError(f"preset {self.name!r}: synth_len needs a drafter and draft_max > 0")
        if self.slot_save_path is not None and not pathlib.Path(self.slot_save_path).is_dir():
            raise ConfigError(f"preset {self.name!r}: slot_save_path {self.slot_save_path!r} is not a directory")

    def pair_files(self) -> tuple[str, Optional[str]]:
        """The target and drafter GGUF files (drafter None: plain decoding); EMBEDDED is the default pair's."""
        target, drafter = self.target, self.drafter
        if target == EMBEDDED:
            d = default_pair()
            target, drafter = str(d.target), (str(d.drafter) if drafter is None else drafter)
        return target, drafter or None

    def engine_config(self) -> EngineConfig:
        return EngineConfig(n_slots=self.n_slots, n_ctx_slot=self.n_ctx_slot, n_batch=self.n_batch,
                            n_ubatch=min(512, self.n_batch), n_threads=self.n_threads, n_gpu_layers=self.n_gpu_layers,
                            draft_max=self.draft_max, adaptive=self.draft_adaptive, synth_len=self.synth_len,
                            lookup=self.lookup,
                            rpc=self.rpc, rpc_allow_public=self.rpc_allow_public, check_invariants=False,
                            warm_up=None if self.warm_up else False)

    def cache_config(self) -> CacheConfig:
        return CacheConfig(reuse=self.cache_reuse, device_cells=self.cache_device_cells, ram_mib=self.cache_ram_mib,
                           checkpoint_every=self.checkpoint_every)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Preset":
        return cls(**json.loads(text))


@dataclass(frozen=True)
class ServerModels:
    """The presets a server offers, and the one that ``"model": "any"`` names when nothing is resident. Built from
    a ``models.toml`` (``from_toml``) or from one pair (``single``): the CLI's flags and the Ray app's arguments
    both come here, so the two serve the same presets for the same settings."""

    presets: dict[str, Preset]
    default: str

    def __post_init__(self):
        if not self.presets:
            raise ConfigError("no model presets")
        if self.default not in self.presets:
            raise ConfigError(f"default preset {self.default!r} is not defined")

    @classmethod
    def from_toml(cls, path: str | pathlib.Path) -> "ServerModels":
        """The presets of a ``models.toml`` (the module docstring shows one); paths in it are relative to it."""
        path = pathlib.Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        default = data.pop("default", None)
        presets = {}
        for name, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: {name!r} must be a table of preset settings")
            unknown = set(table) - _FIELDS
            if unknown:
                raise ConfigError(f"{path}: preset {name!r} has unknown keys {sorted(unknown)}")
            table = dict(table)
            for key in ("target", "drafter", "chat_template", "slot_save_path"):
                table[key] = _resolve_path(path.parent, table.get(key), key)
            presets[name] = Preset(name=name, **{k: v for k, v in table.items() if v is not None or k == "drafter"})
        return cls(presets, default or next(iter(presets), ""))

    @classmethod
    def single(cls, target: Optional[str] = None, drafter: Optional[str] = None, name: Optional[str] = None,
               **settings) -> "ServerModels":
        """One preset. ``target``: a GGUF file, or None for the embedded default pair; ``drafter``: its DFlash
        drafter, None for none (with the embedded target: the shipped one), "" for none in either case. ``name``
        defaults to the target file's stem ("default" for the embedded pair); ``settings`` are ``Preset`` fields."""
        if target is not None and not os.path.isfile(target):
            raise ConfigError(f"no such model file: {target}")
        if drafter and not os.path.isfile(drafter):
            raise ConfigError(f"no such drafter file: {drafter}")
        if name is None:
            name = os.path.splitext(os.path.basename(target))[0] if target is not None else "default"
        preset = Preset(name=name, target=os.path.abspath(target) if target is not None else EMBEDDED,
                        drafter=os.path.abspath(drafter) if drafter else drafter, **settings)
        return cls({name: preset}, name)


_FIELDS = {f.name for f in dataclasses.fields(Preset)} - {"name"}


def _resolve_path(base: pathlib.Path, value, key: str):
    """Paths in the config are relative to the config file; EMBEDDED and chat-template names stay as they are."""
    if value is None or value == "" or value == EMBEDDED:
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a string")
    p = pathlib.Path(value).expanduser()
    if key == "chat_template" and not p.suffix and not p.is_absolute() and "/" not in value:
        return value  # a built-in template name
    return str(p if p.is_absolute() else base / p)
