"""A model worker: one process that loads one preset's pair and serves it to the router over a Unix socket.

    python -m pydflash.server.worker --preset '{"name": ...}' --uds /tmp/.../gemma.sock

The router never loads a model: a native abort, an OOM kill or a SIGKILL here takes down this process and its
in-flight requests only. The engine is owned by the engine-loop thread; the routes below reach it only through
``EngineLoop`` (submit / cancel / call). If the engine fails, its requests get the error, ``/health`` turns 503,
and the process exits shortly after so that the router respawns it.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import sys
import threading
from typing import Optional

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse

from . import metrics  # noqa: F401  (first: prometheus_client must see the multiprocess directory)
from . import chat, errors, slots
from . import schemas as S
from ..errors import PydflashError
from .generate import Generation
from .loop import EngineLoop
from .metrics import StepRecorder
from .preset import EMBEDDED, Preset
from .scoring import ScoreService

log = logging.getLogger(__name__)
EXIT_ENGINE_DEAD = 70
EXIT_LOAD_FAILED = 3
DEATH_GRACE_S = 1.0  # time for the failed requests' error events to reach their clients
# The engine thread and the event loop share the GIL. When a forward returns, the engine thread waits for it
# while the event loop sends the last step's frames, up to the switch interval (Python's default: 5 ms, longer
# than a plain GPU step at 16 slots) before the loop is made to let go; a shorter interval bounds that wait, and
# the frames still go out during the next forward. On the H200 at 16 clients, 0.5 ms gave 4,605 tok/s at synthetic
# length 8 and 3,954 plain, against 4,373 and 3,591 with 5 ms (docs/gpu_2026-12-02-b).
# PYDFLASH_SWITCH_INTERVAL_MS overrides it (0: Python's default).
SWITCH_INTERVAL_MS = 0.5


def load_engine(preset: Preset):
    """The pair and engine of a preset, and its chat template."""
    from ..compat.gguf_meta import read_metadata
    from ..defaults import default_pair
    from ..engine.engine import Engine
    from ..pair import load_pair

    target, drafter = preset.target, preset.drafter
    if target == EMBEDDED:
        d = default_pair()
        target, drafter = d.target, (d.drafter if drafter is None else drafter)
    pair = load_pair(target, drafter or None, n_gpu_layers=preset.n_gpu_layers, rpc=preset.rpc,
                     rpc_allow_public=preset.rpc_allow_public)
    try:
        engine = Engine(pair, preset.engine_config(), cache=preset.cache_config())
    except BaseException:
        pair.close()
        raise
    model = pair.target
    template = chat.resolve(read_metadata(model.path).get("tokenizer.chat_template"), model.arch,
                            preset.chat_template,
                            bos_token=model.token_to_piece(model.bos, special=True).decode("utf-8", "replace"),
                            eos_token=model.token_to_piece(model.eos, special=True).decode("utf-8", "replace"))
    return engine, template


def create_worker_app(preset: Preset) -> FastAPI:
    engine, template = load_engine(preset)
    recorder = StepRecorder(preset.name, preset.n_slots)

    def die(exc: BaseException) -> None:
        threading.Timer(DEATH_GRACE_S, os._exit, args=(EXIT_ENGINE_DEAD,)).start()

    loop = EngineLoop(engine, preset.max_queue, on_step=recorder.on_step, on_death=die)
    gen = Generation(loop, preset.name, template, recorder, ScoreService(loop))
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        loop.start()
        yield
        loop.stop()

    app = FastAPI(title=f"pydflash worker {preset.name}", lifespan=lifespan)
    errors.install(app)
    app.state.loop = loop

    @app.post("/v1/completions")
    async def completions(body: S.CompletionRequest, http: HTTPRequest):
        return await gen.completion(body, http)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: S.ChatCompletionRequest, http: HTTPRequest):
        return await gen.chat(body, http)

    @app.post("/tokenize")
    async def tokenize(body: S.TokenizeRequest) -> S.TokenizeResponse:
        text, special = body.content, body.add_special
        return S.TokenizeResponse(tokens=await loop.call(lambda e: e.model.tokenize(text, add_special=special)))

    @app.post("/detokenize")
    async def detokenize(body: S.DetokenizeRequest) -> S.DetokenizeResponse:
        tokens = list(body.tokens)

        def run(e):
            bad = [t for t in tokens if not 0 <= t < e.model.n_vocab]
            if bad:
                from ..errors import InvalidRequest

                raise InvalidRequest(f"token id {bad[0]} outside the vocabulary [0, {e.model.n_vocab})")
            return e.model.detokenize_text(tokens).decode("utf-8", "replace")

        return S.DetokenizeResponse(content=await loop.call(run))

    @app.post("/slots/{id_slot}")
    async def slot_action(id_slot: int, action: S.SlotAction, body: Optional[S.SlotActionRequest] = None):
        return await slots.slot_action(loop, preset.slot_save_path, id_slot, action, body.filename if body else None)

    @app.get("/health")
    async def health():
        if loop.dead is not None:
            return JSONResponse({"status": "error", "error": str(loop.dead)}, status_code=503)
        return {"status": "ok", "slots_busy": loop.n_busy, "queue": loop.n_waiting,
                "n_slots": preset.n_slots, "n_ctx_slot": preset.n_ctx_slot, "chat_template": template.name,
                "drafter": engine.drafter is not None}

    return app


def main(argv=None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(prog="pydflash-worker")
    p.add_argument("--preset", required=True, help="the preset as JSON")
    p.add_argument("--uds", required=True, help="Unix socket to serve on")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    # a native abort or fault mid-step (GGML_ASSERT, CUDA) kills the process without a Python traceback: dump every
    # thread's Python stack to stderr, where the router's exit report reads the last words
    faulthandler.enable()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s worker %(name)s %(levelname)s %(message)s")
    interval_ms = float(os.environ.get("PYDFLASH_SWITCH_INTERVAL_MS", SWITCH_INTERVAL_MS))
    if interval_ms > 0:
        sys.setswitchinterval(interval_ms / 1000)
    preset = Preset.from_json(args.preset)
    try:
        app = create_worker_app(preset)
    except PydflashError as exc:  # a preset that cannot load: one line the router shows its clients
        sys.stderr.write(f"LOAD-ERROR: {exc}\n")
        raise SystemExit(EXIT_LOAD_FAILED)
    uvicorn.run(app, uds=args.uds, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
