"""A model worker: one process that serves one preset's pair to the router over a Unix socket.

    python -m pydflash.server.worker --preset '{"name": ...}' --uds /tmp/.../gemma.sock

The router never loads a model, and neither does this process: its engine runs in an engine process of its own
(``engine_process.py``), so that a step's Python never waits on this process's GIL while the event loop writes
streams. A native abort, an OOM kill or a SIGKILL there takes down this worker and its in-flight requests only. The
routes below reach the engine only through an ``EngineClient`` (submit / cancel / call; ``engine_client.py``), here
an ``EngineProcessClient``; prompts are tokenized here, by the worker's own vocabulary-only ``Tokenizer``, so a
request reaches the engine once. If the engine fails, its requests get the error, ``/health`` turns 503, and the worker
exits shortly after so that the router respawns it. ``PYDFLASH_ENGINE_PROCESS=0`` runs the engine on an
``EngineThread`` of this process instead (as a Ray replica does, ``ray/inprocess_worker.py``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
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
from . import chat, errors, keepalive, slots
from . import schemas as S
from ..errors import PydflashError
from .completions import Completions
from .engine_client import EngineClient, EngineInfo
from .engine_process import EXIT_ENGINE_DEAD, EXIT_LOAD_FAILED, load_engine
from .engine_process_client import EngineExited, EngineProcessClient
from .engine_thread import EngineThread
from .metrics import StepRecorder
from .native_api import NativeAPI
from .preset import Preset
from .scoring import ScoreService
from .tokenizer import Tokenizer

log = logging.getLogger(__name__)
DEATH_GRACE_S = 1.0  # time for the failed requests' error events to reach their clients
# With the engine on a thread of this process (PYDFLASH_ENGINE_PROCESS=0), it and the event loop share the GIL.
# When a forward returns, the engine thread waits for it while the event loop sends the last step's frames, up to
# the switch interval (Python's default: 5 ms, longer than a plain GPU step at 16 slots) before the loop is made to
# let go; a shorter interval bounds that wait. On the H200 at 16 clients, 0.5 ms gave 4,605 tok/s at synthetic
# length 8 and 3,954 plain, against 4,373 and 3,591 with 5 ms (docs/benchmarks.md). With an engine process the
# interval only paces this process's event loop against the engine client's reader thread.
# PYDFLASH_SWITCH_INTERVAL_MS overrides it (0: Python's default).
SWITCH_INTERVAL_MS = 0.5


def resolve_template(info: EngineInfo, preset: Preset) -> chat.ChatTemplate:
    return chat.resolve(info.chat_template, info.arch, preset.chat_template, bos_token=info.bos_text,
                        eos_token=info.eos_text)


def create_worker_app(preset: Preset, engine: Optional[EngineClient] = None,
                      tokenizer: Optional[Tokenizer] = None) -> FastAPI:
    """The worker's routes over ``engine`` (an engine process's client), or without one over an engine loaded here
    and run on an ``EngineThread`` of this process; ``tokenizer``: the preset's, loaded here when not given."""
    recorder = StepRecorder(preset.name, preset.n_slots)

    def die(exc: BaseException) -> None:
        threading.Timer(DEATH_GRACE_S, os._exit, args=(EXIT_ENGINE_DEAD,)).start()

    if tokenizer is None:
        tokenizer = Tokenizer.for_preset(preset)
    if engine is None:
        engine = EngineThread(load_engine(preset), preset.max_queue)
    engine.on_step, engine.on_death = recorder.on_step, die
    info = engine.info
    template = resolve_template(info, preset)
    gen = Completions(engine, tokenizer, preset.name, template, recorder, ScoreService(engine))
    native = NativeAPI(gen, engine, preset)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        engine.start()
        yield
        engine.stop()
        tokenizer.close()

    app = FastAPI(title=f"pydflash worker {preset.name}", lifespan=lifespan)
    errors.install(app)
    app.state.engine = engine
    app.state.tokenizer = tokenizer

    @app.post("/v1/completions")
    async def completions(body: S.CompletionRequest, http: HTTPRequest):
        return await gen.completion(body, http)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: S.ChatCompletionRequest, http: HTTPRequest):
        return await gen.chat(body, http)

    # llama-server's native endpoints (native_api.py). The router always POSTs to its workers, so the GET ones
    # are served on POST too.
    @app.post("/completion")
    async def completion(body: S.NativeCompletionRequest, http: HTTPRequest):
        return await native.completion(body, http)

    @app.api_route("/props", methods=["GET", "POST"])
    async def properties():
        return native.props()

    @app.api_route("/slots", methods=["GET", "POST"])
    async def slot_list():
        return await native.slots()

    @app.post("/apply-template")
    async def apply_template(body: S.ChatCompletionRequest) -> S.ApplyTemplateResponse:
        return native.apply_template(body)

    @app.post("/tokenize")
    async def tokenize(body: S.TokenizeRequest) -> S.TokenizeResponse:
        return S.TokenizeResponse(tokens=await tokenizer.tokenize(body.content, body.add_special, body.parse_special))

    @app.post("/detokenize")
    async def detokenize(body: S.DetokenizeRequest) -> S.DetokenizeResponse:
        return S.DetokenizeResponse(content=tokenizer.detokenize(list(body.tokens)))

    @app.post("/slots/{id_slot}")
    async def slot_action(id_slot: int, action: S.SlotAction, body: Optional[S.SlotActionRequest] = None):
        return await slots.slot_action(engine, preset.slot_save_path, id_slot, action, body.filename if body else None)

    @app.get("/health")
    async def health():
        if engine.dead is not None:
            return JSONResponse({"status": "error", "error": str(engine.dead)}, status_code=503)
        return {"status": "ok", "slots_busy": engine.n_busy, "queue": engine.n_waiting,
                "n_slots": preset.n_slots, "n_ctx_slot": preset.n_ctx_slot, "chat_template": template.name,
                "drafter": info.drafter}

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
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            # the vocabulary loads while the engine process loads its pair (each load releases the GIL)
            tokenizer = pool.submit(Tokenizer.for_preset, preset)
            in_process = os.environ.get("PYDFLASH_ENGINE_PROCESS") == "0"
            engine = None if in_process else EngineProcessClient(args.preset, args.log_level)
            app = create_worker_app(preset, engine, tokenizer.result())
    except EngineExited as exc:  # a native abort while loading: its own last words are already on stderr
        log.error("%s", exc)
        raise SystemExit(1)
    except PydflashError as exc:  # a preset that cannot load: one line the router shows its clients
        sys.stderr.write(f"LOAD-ERROR: {exc}\n")
        raise SystemExit(EXIT_LOAD_FAILED)
    uvicorn.run(app, uds=args.uds, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=2,
                timeout_keep_alive=keepalive.WORKER_S)


if __name__ == "__main__":
    main()
