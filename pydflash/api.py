"""The Python API.

    from pydflash import api
    with api.load("target.gguf", "drafter.gguf") as llm:
        out = llm.generate("def fib(n):", max_tokens=64)
        print(out.text, out.stats.mean_accept_len)

``load(target)`` without a drafter gives plain greedy decoding through the same engine (the losslessness oracle).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

from .config import EngineConfig
from .engine.engine import Engine
from .engine.request import Event, Request, Result
from .pair import PathLike, load_pair


class LLM:
    def __init__(self, engine: Engine):
        self.engine = engine

    def generate(self, prompt, **kw) -> Result:
        return self.engine.generate(prompt, **kw)

    def generate_many(self, requests: Iterable[Request]) -> list[Result]:
        reqs = list(requests)
        results = self.engine.run(reqs)
        return [results[r.id] for r in reqs]

    def stream(self, prompt, **kw) -> Iterator[Event]:
        """Events for one request as the engine steps (other queued requests step along)."""
        req = Request(prompt, **kw)
        self.engine.submit(req)
        while True:
            for ev in self.engine.step():
                if ev.request_id == req.id:
                    yield ev
                    if ev.finished:
                        return

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.engine.model.tokenize(text, add_special=add_special)

    def detokenize(self, tokens) -> str:
        return self.engine.model.detokenize(tokens).decode("utf-8", "replace")

    def close(self) -> None:
        self.engine.close()
        self.engine.pair.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load(target: PathLike, drafter: Optional[PathLike] = None, config: Optional[EngineConfig] = None,
         allow_scale_mismatch: bool = False, target_kv_overrides: Optional[dict] = None) -> LLM:
    """target_kv_overrides: GGUF metadata overrides for the target (llama.cpp's --override-kv)."""
    config = config or EngineConfig()
    pair = load_pair(target, drafter, n_gpu_layers=config.n_gpu_layers, allow_scale_mismatch=allow_scale_mismatch,
                     target_kv_overrides=target_kv_overrides)
    try:
        return LLM(Engine(pair, config))
    except BaseException:
        pair.close()
        raise
