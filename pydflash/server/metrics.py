"""Prometheus metrics for the router and its workers, through prometheus_client's multiprocess mode.

Every worker process writes its samples into ``PROMETHEUS_MULTIPROC_DIR``; the router's ``/metrics`` aggregates
all of them with ``MultiProcessCollector``. prometheus_client picks its storage when it is first imported, so
``ensure_dir()`` must run before that import in each process: this module does it on import, and the router
hands the same directory to the workers it spawns through the environment.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time

ENV = "PROMETHEUS_MULTIPROC_DIR"


_owned: dict[str, int] = {}  # the directory this process made -> its pid


def ensure_dir() -> str:
    if not os.environ.get(ENV):
        path = os.environ[ENV] = tempfile.mkdtemp(prefix="pydflash-metrics-")
        # The process that made the directory owns it (the router; the workers and engine processes it spawns
        # inherit the variable and only write there): one was left in /tmp per server run before. The router's
        # shutdown removes it once its workers are stopped (remove_owned_dir); atexit covers other exits of its
        # Python, but not a SIGTERM, which uvicorn re-raises after its shutdown, so the process dies of it.
        _owned[path] = os.getpid()
        atexit.register(remove_owned_dir)
    os.makedirs(os.environ[ENV], exist_ok=True)
    return os.environ[ENV]


def remove_owned_dir() -> None:
    """Remove the metrics directory if this process made it (not in a forked child that inherited the record)."""
    for path, owner in list(_owned.items()):
        if os.getpid() == owner:
            shutil.rmtree(path, ignore_errors=True)
            del _owned[path]


ensure_dir()

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest  # noqa: E402
from prometheus_client import CONTENT_TYPE_LATEST, multiprocess  # noqa: E402

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5, 10, 30)

# each generation request is counted once: ok, error (the engine or its worker failed), cancelled (the client went
# away) or rejected (a 4xx before generation; model "" when no preset was resolved). Workers count what they
# admitted; the router counts the 4xx answers (its own and the workers') and requests lost with a worker.
REQUESTS = Counter("pydflash_requests_total", "Finished requests by endpoint and outcome",
                   ["model", "endpoint", "outcome"])
REJECTED = Counter("pydflash_requests_rejected_total", "Requests answered 4xx before generation, by HTTP status",
                   ["model", "endpoint", "status"])
ENDPOINTS = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}  # the routes requests are counted on
PROMPT_TOKENS = Counter("pydflash_prompt_tokens_total", "Prompt tokens of admitted requests", ["model"])
CACHED_TOKENS = Counter("pydflash_cached_prompt_tokens_total", "Prompt tokens reused from a cache", ["model"])
GENERATED_TOKENS = Counter("pydflash_generation_tokens_total", "Generated tokens", ["model"])
DRAFTED = Counter("pydflash_draft_tokens_total", "Draft tokens proposed", ["model"])
ACCEPTED = Counter("pydflash_draft_accepted_tokens_total", "Draft tokens accepted", ["model"])
DRAFTED_AT = Counter("pydflash_draft_proposed_by_position_total", "Drafts proposed at each block position",
                     ["model", "position"])
ACCEPTED_AT = Counter("pydflash_draft_accepted_by_position_total", "Drafts accepted at each block position",
                      ["model", "position"])
QUEUE_DEPTH = Gauge("pydflash_queue_depth", "Requests waiting for a slot", ["model"], multiprocess_mode="livesum")
SLOTS_BUSY = Gauge("pydflash_slots_busy", "Slots decoding a request", ["model"], multiprocess_mode="livesum")
SLOTS_TOTAL = Gauge("pydflash_slots_total", "Slots of resident models", ["model"], multiprocess_mode="livesum")
TTFT = Histogram("pydflash_time_to_first_token_seconds", "Submit to first generated token", ["model"],
                 buckets=LATENCY_BUCKETS)
ITL = Histogram("pydflash_inter_token_latency_seconds", "Gap between successive outputs of a request, per token",
                ["model"], buckets=LATENCY_BUCKETS)
# prompt cache (docs/cache.md): engine.prompt_cache.metrics(), read by the engine loop (loop.LoopState)
CACHE_REUSED = Counter("pydflash_prompt_cache_reused_tokens_total", "Prompt positions not prefilled thanks to the "
                       "prompt cache", ["model"])
CACHE_FALLBACKS = Counter("pydflash_prompt_cache_fallbacks_total", "Cached prefixes found but re-prefilled (window, "
                          "refused state, size mismatch; logged with the reason)", ["model"])
CACHE_DRAFTER_RESTARTS = Counter("pydflash_prompt_cache_drafter_restarts", "Reuses past the cached target features "
                                 "(decoded while drafting was paused): the drafter context restarted at the reuse "
                                 "point", ["model"])
CACHE_CONTEXT_TRIMS = Counter("pydflash_prompt_cache_context_trims", "Reuses stopped up to a lead-in short of a "
                              "cached prefix without target features, so that a request about to draft has a drafter "
                              "context", ["model"])
CACHE_HITS = Counter("pydflash_prompt_cache_ram_hits_total", "Admissions restored from the RAM cache", ["model"])
CACHE_MISSES = Counter("pydflash_prompt_cache_ram_misses_total", "Admissions the RAM cache did not serve", ["model"])
CACHE_EVICTIONS = Counter("pydflash_prompt_cache_ram_evictions_total", "RAM cache entries evicted under the cap",
                          ["model"])
CACHE_BYTES = Gauge("pydflash_prompt_cache_ram_bytes", "Bytes of snapshots in the RAM cache", ["model"],
                    multiprocess_mode="livesum")
CACHE_ENTRIES = Gauge("pydflash_prompt_cache_ram_entries", "Snapshots in the RAM cache", ["model"],
                      multiprocess_mode="livesum")
DEVICE_HITS = Counter("pydflash_prompt_cache_device_hits_total", "Admissions served from sequences kept in the KV "
                      "(the device tier: no copy)", ["model"])
DEVICE_MISSES = Counter("pydflash_prompt_cache_device_misses_total", "Admissions the device tier did not serve",
                        ["model"])
DEVICE_EVICTIONS = Counter("pydflash_prompt_cache_device_evictions_total", "Device-tier entries given up (cap, their "
                           "share of the load, not hit within their probation, or KV needed by running requests)",
                           ["model"])
DEVICE_CELLS = Gauge("pydflash_prompt_cache_device_cells", "KV cells held by device-tier entries (upper bound: "
                     "cells shared with slots count too)", ["model"], multiprocess_mode="livesum")
SLOT_GIVEN_UP = Counter("pydflash_prompt_cache_slot_given_up_total", "Idle slots' kept sequences cut back to their "
                        "prompt (how=cut) or given up (how=dropped) to hold kept KV cells to their share of the load",
                        ["model", "how"])
CACHE_KEPT = Gauge("pydflash_prompt_cache_slot_tokens", "Tokens kept in idle slots for reuse", ["model"],
                   multiprocess_mode="livesum")
RESIDENT = Gauge("pydflash_models_resident", "Model workers loaded and serving", multiprocess_mode="livesum")
RESTARTS = Counter("pydflash_worker_restarts_total", "Workers respawned after dying", ["model"])


def count_rejected(model: str, endpoint: str, status: int) -> None:
    REQUESTS.labels(model, endpoint, "rejected").inc()
    REJECTED.labels(model, endpoint, str(status)).inc()


def exposition() -> tuple[bytes, str]:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def process_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (its counters and histograms stay: they are cumulative)."""
    multiprocess.mark_process_dead(pid)


def observe_n(hist, amount: float, n: int) -> None:
    """``hist.observe(amount)`` n times, as one update of the sum and of one bucket. A step of 16 drafting slots
    commits ~130 tokens, and each observation is an mmap write in multiprocess mode (~3.5 us on a CPU core), every
    step. prometheus_client has no weighted observe: this uses its Histogram's own fields, as observe()
    does, and falls back to observe() should they change."""
    try:
        bounds, buckets, total = hist._upper_bounds, hist._buckets, hist._sum
    except AttributeError:
        for _ in range(n):
            hist.observe(amount)
        return
    total.inc(amount * n)
    for bound, bucket in zip(bounds, buckets):
        if amount <= bound:
            bucket.inc(n)
            break


class StepRecorder:
    """The worker's per-step metrics, fed with each step's events and the engine's state (``LoopState``): on the
    engine's thread in-process, on the engine process client's reader thread in a worker
    (engine_process_client.py). Request start times come from handlers."""

    def __init__(self, model: str, n_slots: int):
        self.model = model
        self.started: dict[int, float] = {}  # request id -> submit time (monotonic)
        self._last: dict[int, float] = {}  # request id -> time of its last output
        self._cache_seen: dict[str, int] = {}  # the prompt cache's cumulative counts already added to the counters
        # this runs after every step (a GPU step is ~1-5 ms): the label lookups once, and the gauges (an mmap write
        # each in multiprocess mode) only when they change
        self._queue, self._busy = QUEUE_DEPTH.labels(model), SLOTS_BUSY.labels(model)
        self._ttft, self._itl = TTFT.labels(model), ITL.labels(model)
        self._shown = (-1, -1)
        SLOTS_TOTAL.labels(model).set(n_slots)
        for counter in (CACHE_REUSED, CACHE_FALLBACKS, CACHE_DRAFTER_RESTARTS, CACHE_HITS, CACHE_MISSES,
                        CACHE_EVICTIONS, DEVICE_HITS, DEVICE_MISSES, DEVICE_EVICTIONS):
            counter.labels(model)  # shown as 0 from the start, not only after the first event
        for how in ("cut", "dropped"):
            SLOT_GIVEN_UP.labels(model, how)

    def on_step(self, state, events) -> None:
        now = time.monotonic()
        shown = (state.n_waiting, state.n_busy)
        if shown != self._shown:
            self._queue.set(shown[0])
            self._busy.set(shown[1])
            self._shown = shown
        if state.cache is not None:
            self._cache(state.cache)
        for ev in events:
            if ev.tokens:
                last = self._last.get(ev.request_id)
                if last is None:
                    t0 = self.started.get(ev.request_id)
                    if t0 is not None:
                        self._ttft.observe(now - t0)
                else:
                    observe_n(self._itl, (now - last) / len(ev.tokens), len(ev.tokens))
                self._last[ev.request_id] = now
            if ev.finished:
                self.forget(ev.request_id)
                self._finished(ev.result.stats)

    def _finished(self, st) -> None:
        m = self.model
        PROMPT_TOKENS.labels(m).inc(st.n_prompt)
        CACHED_TOKENS.labels(m).inc(getattr(st, "n_cached", 0))
        GENERATED_TOKENS.labels(m).inc(st.n_generated)
        DRAFTED.labels(m).inc(st.n_drafted)
        ACCEPTED.labels(m).inc(st.n_accepted)
        for i, (d, a) in enumerate(zip(st.drafted_hist, st.accept_hist)):
            DRAFTED_AT.labels(m, str(i + 1)).inc(d)
            ACCEPTED_AT.labels(m, str(i + 1)).inc(a)

    def _cache(self, pc: dict) -> None:
        """Counters from the prompt cache's cumulative counts (by their increase), gauges as they are."""
        m = self.model
        ram, dev = pc.get("ram") or {}, pc.get("device") or {}
        counts = {"reused": (CACHE_REUSED.labels(m), pc["n_reused_tokens"]),
                  "fallbacks": (CACHE_FALLBACKS.labels(m), pc["fallbacks"]),
                  "drafter_restarts": (CACHE_DRAFTER_RESTARTS.labels(m), pc["drafter_restarts"]),
                  "context_trims": (CACHE_CONTEXT_TRIMS.labels(m), pc.get("context_trims", 0)),
                  "hits": (CACHE_HITS.labels(m), ram.get("hits", 0)),
                  "misses": (CACHE_MISSES.labels(m), ram.get("misses", 0)),
                  "evictions": (CACHE_EVICTIONS.labels(m), ram.get("evictions", 0)),
                  "device_hits": (DEVICE_HITS.labels(m), dev.get("hits", 0)),
                  "device_misses": (DEVICE_MISSES.labels(m), dev.get("misses", 0)),
                  "device_evictions": (DEVICE_EVICTIONS.labels(m), dev.get("evictions", 0)),
                  "cut": (SLOT_GIVEN_UP.labels(m, "cut"), pc.get("residents_cut", 0)),
                  "dropped": (SLOT_GIVEN_UP.labels(m, "dropped"), pc.get("residents_dropped", 0))}
        for key, (counter, total) in counts.items():
            seen = self._cache_seen.get(key, 0)
            if total > seen:
                counter.inc(total - seen)
                self._cache_seen[key] = total
        CACHE_BYTES.labels(m).set(ram.get("bytes", 0))
        CACHE_ENTRIES.labels(m).set(ram.get("entries", 0))
        DEVICE_CELLS.labels(m).set(dev.get("cells", 0))
        CACHE_KEPT.labels(m).set(pc["resident_tokens"])

    def forget(self, request_id: int) -> None:
        self.started.pop(request_id, None)
        self._last.pop(request_id, None)

    def idle(self) -> None:
        QUEUE_DEPTH.labels(self.model).set(0)
        SLOTS_BUSY.labels(self.model).set(0)
