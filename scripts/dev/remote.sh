#!/usr/bin/env bash
# Runs ON the device machine, from the repo root. Steps (one per call, the machine kept warm in between: it is
# given back after 30 s idle, and the build and the model live only on it):
#   remote.sh part 0, part 0b  stage g0 and g0b (the trimmed llama.cpp source's two halves): calls of their own,
#                     since the tree (~60 MB with the drafter and the data) and the source (5.6 MB) do not fit one
#                     call's 64 MiB together
#   remote.sh part 1b  stage g1b (the server's wheels), a call of its own: with the tree it would not fit g1's
#   remote.sh start   unpack g1 (pure-Python packages), install the staged wheels and source, start the CUDA
#                     build detached (survives the call), check that the server's imports resolve; beside it, the
#                     pristine build: llama-server alone from the same pinned source with patches/ reverted (checked
#                     against the sdist's files, g1/pristine.sha256), a user's cmake flags, in $W/pristine
#                     (NO_PRISTINE=1: not now; `remote.sh pristine` starts it later, once the patched build is done)
#   remote.sh part N  stash model part(s) from gN (N = 2 .. the last folder prepare_carry.sh made); part t0, part t1
#                     stage what SLIM=1 took out of the tree for `train` (the shipped safetensors, the data runs).
#                     The parts were sized for the tree when they were packed, with 1 MB of slack: once the tree has
#                     grown past that, as docs/results/ had by 2026-12-06, move docs/results out for the part calls
#                     (the tool refuses a call over 64 MiB)
#   remote.sh costs   wait for the build, assemble the model, scripts/bench/step_costs.py with the batched argmax of
#                     patches/0003 and with upstream's per-row argmax (PYDFLASH_PER_ROW_GREEDY)
#   remote.sh bench   scripts/bench/engine.py, all modes: 1 request x 512 tokens, 8 requests x 256 tokens
#   remote.sh long    adaptive modes only, long requests: 1 x 900 tokens (6 rounds), 8 x 600 tokens (4 rounds)
#   remote.sh eval    the held-out drafter evaluation (scripts/bench/drafter_eval.py)
#   remote.sh suite   the bucketed drafter suite + repetition suite (scripts/bench/drafter_eval.py --suite), 256 tokens; SUITE_ARGS
#                     adds flags (--no-lookup), SUITE_TAG suffixes the output's name
#   remote.sh server  scripts/bench/server_load.py against pydflash-server -ngl -1: spec / plain / fixed block at 1, 4, 16
#                     clients, plus the long-prefill probe
#   remote.sh http    scripts/bench/http_vs_native.py: native llama-server (the pristine build; native DFlash on the patched
#                     one) against pydflash-server through HTTP; extra args pick conditions (--only ...) so that
#                     each call fits.
#                     Run a step that waits for the build first (profile): the build took ~5 min after `start` at
#                     -j16 (the two builds at -j8 each will take longer; not yet measured), and an http call that
#                     waits for it loses that from its 600 s (2026-12-02: cut after 8 clients)
#   remote.sh fast1, fast2  (TRACE=1: each pydflash engine's step trace, summarised as trace_<name>_<pid>.json, raw as
#                     trace_raw_<name>_<pid>.jsonl.gz)
#                     scripts/bench/http_vs_native.py --defaults (what a user gets: both servers with their default
#                     flags, the fresh prompt set, interleaved rounds, 5 in fast1, 3 in fast2): fast1 the non-streamed recurring
#                     workload at 1, 4, 8, 16 clients and the chat workload at 1, 4, 8; fast2 the streamed recurring
#                     workload, the no-reuse workload and cache_prompt:false requests (secondary). Each fits one call
#                     (estimated from docs/results/2026-12-03-h200-d: ~360 s and ~440 s of benchmark); both need the builds
#                     done. JSON only, as fast1.json / fast2.json; render locally: scripts/bench/http_vs_native.py --render
#                     fast1.json fast2.json. Extra args go to scripts/bench/http_vs_native.py (e.g. --rounds 2)
#   remote.sh adapt   in-process scripts/bench/engine.py, plain against adaptive drafting (useless and shipped drafter) at
#                     1, 8 and 16 slots, with the per-step split (draft / verify / commit / host: the host profile)
#   remote.sh paused  scripts/bench/paused_cost.py: a paused step of the speculative engine against a plain step (no
#                     drafter), with and without the drafter's feature taps in the target graph, 1 and 16 slots; waits
#                     for both builds so that the host-bound steps run on a quiet machine (~150 s). As served, with a
#                     request boundary every 256 steps (~30 s; docs/results/2026-12-05-h200-b): `paused --slots 1
#                     --capacity 16 --cache --request-tokens 256 --variants plain,paused,adaptive`; each variant's
#                     step trace comes back summarised (trace_<variant>.<slots>.json)
#   remote.sh cachediag  scripts/bench/paused_cost.py in-process, plain with every tier of the prompt cache (the
#                     default), without the device tier and with none, at 8 and 16 of 16 slots, 256-token requests,
#                     with CUDA graphs and without (~4 min): whether the engine alone shows the cache's cost that
#                     HTTP showed (docs/results/2026-12-05-h200-c). Through HTTP, the same split:
#                     `NO_NATIVE=1 remote.sh fast1 --only 'py-plain,py-plain-nodevice,py-plain-nocache'
#                     --workloads noreuse,recur --clients 4,8,16`
#   remote.sh copyfirst  scripts/bench/copy_first.py in-process: the shipped pair with copies standing in for its
#                     blocks where every drafting slot loops (engine/copies.py, CopyPolicy.first) and without, against
#                     plain, at 1 / 4 / 8 slots
#   remote.sh kvspan  scripts/bench/kv_span.py --run: the KV span (llama.cpp's n_kv) with the cache off, fresh and settled
#   remote.sh profile scripts/bench/profile_host.py: the host part of a step by phase (16 slots L=8 and plain, 1 slot L=8)
#   remote.sh cache   scripts/bench/cache.py: a 6-turn chat with a ~1,000-token system prompt, cache on / off
#   remote.sh sampling  scripts/bench/sampling.py: rejection against sample-and-match at T 0.7 / 1.0,
#                     without and with top-p 0.9
#   remote.sh gen [SECONDS] [SKIP] [SLOTS] [SPAN] [NPROC]  the target's greedy responses to the carried
#                     corpus (prepare_carry.sh builds it; staged in halves by `part c0` and `part c1`) through pydflash on the
#                     GPU, NPROC processes on SPAN lines each from SKIP; shards stay in $W/data for `train` and come
#                     back as data.tar.NN; GEN_TAG=x writes $W/data/xp$i, so a second gen call keeps the first's shards;
#                     GEN_RANGES="A:B,C:D" runs one process per range of lines instead of SKIP / SPAN / NPROC
#   remote.sh selfgen [SECONDS] [SKIP] [SPAN] [NPROC] [SLOTS]  training rows from the target's own distribution
#                     (pydflash.train.selfgen: sampled documents cut into prompts, greedy answers; docs/drafter.md,
#                     "Fresh evaluation set"), NPROC processes (default 4) x SLOTS (128) on the GPU, process i on
#                     documents SKIP + i * SPAN .. SKIP + (i + 1) * SPAN (SPAN default 1,000,000: a process never
#                     reaches the next one's), SECONDS of generation (default 500, cut to what the call has left).
#                     Shards stay in $W/gguf_selfgen/<date>-selfgen/p$i (DATA for `train`/`trainbg` can name them) and
#                     come back as selfgen.tar.NN, which unpacks at the repository root as
#                     pydflash/train/gguf_data/<date>-selfgen/p$i; generate_selfgen_p$i.json: counts and next_skip.
#                     SELFGEN_DATE names the folder (default: today on the device); SELFGEN_ARGS replaces the extra
#                     flags (default: none, the pooled KV. --kv-streams, a KV stream per slot, steps faster on an idle
#                     H200 (a 128-slot step 9.4 ms against 27.6 pooled) yet generated less: 695-724 response tokens/s
#                     a process alone on an H100 (2026-12-06-h) against the pooled runs' 1,190-1,320 (2026-12-06-b,
#                     -d, -e); `gen` with streams made ~3,200)
#   remote.sh train [SECONDS] [LAYERS]  continue the shipped drafter (INIT=none: train one from scratch, shaped by
#                     TRAIN_ARGS='--heads H --head-dim D') on $W/data (pydflash.train.trainer), export the
#                     Q8_0 GGUF to $W/drafter; weights come back as model.safetensors.NN, logs in train_meta.tgz
#   remote.sh trainbg [SECONDS] [LAYERS]  the same training, started detached (it survives the call) from a copy of
#                     the tree, so that later calls (gen, suite) run while it trains; the model is assembled without
#                     waiting for the CUDA build (the trainer needs no llama.cpp)
#   remote.sh trainwait [MAX_WAIT]  wait for trainbg, export the GGUF, return what `train` returns
#   remote.sh suite2  the drafter suite for the new drafter ($W/drafter) and the shipped one (SUITE2_WHICH=new: only
#                     the new), and scripts/bench/step_costs.py with the new drafter (its block against a 16-token verify)
#   remote.sh cuda    the CUDA-only patches on the idle GPU: their tests, and scripts/bench/step_costs.py (shipped drafter) with
#                     both, without 0006's MMVQ passes (GGML_CUDA_MMVQ_PASSES=0) and without 0007's per-shape CUDA
#                     graphs (GGML_CUDA_GRAPH_KEY_SHAPES=0)
#   remote.sh split   the cost bar, where a drafting step's drafter work goes: scripts/bench/step_costs.py (shipped drafter)
#                     with each forward's host launch and device wait and its graph reuses; again with llama.cpp's
#                     graph reuse off (LLAMA_GRAPH_REUSE_DISABLE), with CUDA graphs off (GGML_CUDA_DISABLE_GRAPHS), with
#                     debug lines reaching Python (GGML_LOG_SKIP_DEBUG=0: patches/0010 off); the random one-layer
#                     drafter for the block's fixed part
#   remote.sh d2t     patches/0011 on the cost bar: scripts/bench/step_costs.py (shipped drafter, I32 d2t) with the greedy picks over
#                     the reduced vocabulary and with the scatter into the whole one (PYDFLASH_D2T_SCATTER=1), twice
#                     each, alternating
#   remote.sh spare   patches/0012 (opt-in): scripts/bench/step_costs.py (shipped drafter) without and with PYDFLASH_SPARE_SCHED=1,
#                     twice each, alternating: the drafting step's drafter work (steady_draft_*) and a verify after a
#                     plain step, each with its graph reuses
#   remote.sh scale4b-a, scale4b-b [scripts/bench/http_vs_native.py args...]  speed at 4B scale (docs/byo-pair.md,
#                     "Speed at 4B scale"): random-weight Qwen3-4B-shaped targets (Q4_K_M and Q8_0, llama.cpp's own
#                     K-quant mix) and a Qwen3-4B-DFlash-b16-shaped drafter (Q8_0 but fc), generated HERE by
#                     `python -m pydflash.factory.scale` into $W/scale4b (never carried; kept for the next call),
#                     then scripts/bench/http_vs_native.py --interleave against the pristine llama-server (-bs, and
#                     native DFlash at the same synthetic L), 128 tokens, 3 rounds, clients 1,4,8,16.
#                     scale4b-a: the models (F16 files written while llama.cpp still builds: numpy only), then the
#                     targets' conditions native-bs, py-plain, py-synth5, py-synth1-adaptive (the useless
#                     drafter: a random one agrees with the random-weight target, 96 % accepted), py-synth5-adaptive
#                     (L = 5 under the default policy, where py-synth5 fixes the block); scale4b-b: the rest of the
#                     L = 1, 3, 5, 8 curve, py-synth1/3/8 and native-synth1/3/5/8. Needs part 0, 0b, 1b and start
#                     only (no Gemma parts). SCALE_QUANT=Q8_0 benchmarks the Q8_0 target instead. JSON as
#                     scale4b_{a,b}_<quant>.json (render locally: http_vs_native.py --render both); extra args go to
#                     http_vs_native.py and win (e.g. --only 'native-synth*' --clients 4,16 to finish a cut chunk).
#                     TRACE=1 returns each pydflash engine's step trace as fast1 does (trace_<a|b>_<quant>_<pid>.json).
#                     NO_NATIVE=1 (after `start` with NO_PRISTINE=1): no llama-server; --only names pydflash's conditions.
#                     Time, measured on an H100 (2026-12-06, docs/results/2026-12-06-h100-scale4b): the F16 files
#                     126 s beside the builds (both at -j8, ~10 min); after them, quantizing and the benchmark's 4
#                     servers x 4 levels x 3 rounds (~290 s) fit the first scale4b-a call (492 s in all). With
#                     prebuilt packs the builds take seconds and the call ~7 min. The same call with --only of 4
#                     conditions, --clients 1,8 and --rounds 2: 95 s. scale4b-b (7 servers) is estimated at
#                     ~450-500 s (native-synth1, drafting 15 tokens to keep one, is the slow one); not yet run.
#   remote.sh scale31b [scripts/bench/http_vs_native.py args...]  a Gemma-4-31B-shaped Q4_K_M target (18.7 GB) and a
#                     gemma-4-31B-it-DFlash-shaped drafter (Q8_0 but fc), written HERE into $W/scale31b by `python -m
#                     pydflash.factory.scale --shape gemma4-31b` straight at their types (no 61 GB F16 file: the disk is
#                     64 GB), then native-bs, py-plain and py-synth5 through HTTP at 1 and 8 clients, 2 rounds, 512
#                     tokens of context per slot (three 19 GB servers and their KV in one H100's 80 GB), 128 tokens a
#                     request. Needs part 0, 0b, 1b and start (NO_NATIVE=1 as for scale4b). JSON as scale31b.json.
#                     Time, measured on an H100 (2026-12-07, docs/results/2026-12-07-h100-d): the target 319 s and
#                     the drafter 36 s on 16 cores once the patched build was done; the rest of that call ran the
#                     1-client rounds and was cut in the 8-client ones, so run it twice: the second call (the models
#                     kept) with --clients 8 --stem scale31b_c8 took 117 s.
#   remote.sh scaleout replicas|split [scripts/bench/scale_out.py args...]  the nvidia-h200-x2 kind: past one GPU through
#                     HTTP (docs/scale-out.md, "Measured on two GPUs"). Needs part 0, 0b, 1b, start, the Gemma parts
#                     (replicas: the default pair) and Ray, which the image lacks: `part r0` .. `part rN` stage the
#                     ray[serve] wheels for Python 3.12 (.device-bench/gr*/raywhl.tar.NN, packed as docs/scale-out.md
#                     says; the ray wheel alone is 79 MB), which the first scaleout call installs. replicas:
#                     pydflash-server --ray with 1 and 2 engine replicas (a GPU each) and a direct server on GPU 0,
#                     -ngl -1, 1-32 clients, 2 rounds; split: the 4B-scale target of `python -m pydflash.factory.scale`
#                     in $W/scale4b (shared with scale4b-a/-b, made here if missing) on one GPU, over two by layer and
#                     over --rpc to a ggml-rpc-server on GPU 1 (built here), plain / adaptive drafter / --spec-synth-len
#                     5, and the pristine llama-server -sm layer; c1 and c4, 1 round. Time, estimated (not yet run):
#                     replicas ~6-8 min (3 servers a round, ~30 s each to start), split ~6-9 min (10 servers); each
#                     stops at what its call has left. JSON + md as scaleout_<part>.json / .md, server logs as
#                     logs_scaleout_<part>.tgz; extra args go to scale_out.py and win (e.g. --rounds 1 --clients 16,32)
# Build time (2026-12-05): both builds at -j8 each (patched llama + llama-server, pristine llama-server) were still
# running 650 s after `start`; a fast1 called right after staging spent its whole call waiting. For the defaults
# benchmark alone, PRISTINE_JOBS=12 on `start` leaves the pristine llama-server most of the cores. The patched build
# makes libllama alone (PATCHED_TARGETS' default, part of a prebuilt pack's key): pydflash needs nothing else, and
# `http`, whose native DFlash rows run the patched llama-server, builds that target on the machine when it is missing.
# A session short of device time: NO_PRISTINE=1 PATCHED_JOBS=16 on `start` builds only the patched
# libllama on every core; then `paused` and NO_NATIVE=1 fast1/fast2 (the pydflash conditions: pass --only). `start`
# prints when each stage ended: on 2026-12-05 a `start` piped into `tail` gave nothing back for 300 s (cause unknown;
# pip now skips its version check, which waits on a network the machine lacks, and runs under a timeout).
# 2026-12-05 (second session): a first machine (H100) ran part 0 .. start, then went back while this side was cut off
# for over 30 s; three starts failed or the machine was taken back (~200 s each, plus 15 s refusals); the one that
# came (H200) staged everything in 6 calls within 30 s of lease and `paused` waited ~4 min for the -j16 libllama
# build: a session can count on ~500 s of benchmark after ~20 minutes of failed starts.
# Order: part 0, part 0b, part 1b, start (carrying g1 and head.tgz), part 2 .. part N (part c0, part c1 before gen), then the
# steps above. With prebuilt packs (`packbuild patched` / `packbuild pristine` once the builds are done on some
# machine, each a call of its own; `scripts/dev/store_build.sh FILES_AT` here files the reply as .device-bench/gbp0..
# and gbq0..): `part bp0` (carrying .device-bench/gbp0), `part bp1`.., `part bq0`.. BEFORE `start`, each a call of its
# own (a pack part is 15 MiB, three to a folder); `start` then unpacks instead of building where the key matches.
# 2026-12-05 (fourth session, H200): both builds at -j8 each ended 506 s after `start`; `packbuild patched` and
# `packbuild pristine` took 12 s each (41.5 and 44.3 MB, three parts each): .device-bench/gbp0 (key c86aed0bf7819641,
# PATCHED_TARGETS=llama) and gbq0 (key c49774ddf46abec9) are filed here. Stage them (`part bp0`, `part bq0`, each a
# call carrying its folder) before `start`: a session then skips the builds while the source and the flags are
# these. The first throwaway call got no machine; the second started one at once.
# 2026-12-06 (eighth session, H100): those packs were gone with their checkout; both builds at -j8 ended ~10 min after
# `start`, and new packs are filed: gbp0 (key 6eeb7101acd5479c, PATCHED_TARGETS=llama) and gbq0 (key
# 26a80d6041abec67). Run `packbuild patched` and `packbuild pristine` as calls of their own: in one call the first's
# parts did not come back. Never pipe `start` into anything (`| tail`): that call returned nothing until its
# 300 s limit, twice now, although the builds had started (call `start` bare; its output is short).
# scale4b-a right after the staging: F16 files 126 s beside the builds, then the wait, the quantizing, and 299 s left
# for its benchmark, which took ~290 s (4 servers, 4 levels, 3 rounds): one call, 492 s.
# Every step that needs the build fails at once if `start` never ran (a carry over the limit refuses the call without
# running it).
# Results go to $OUT; each of costs/bench/long/eval fits one 10-minute call.
# Begin every batch of calls with a throwaway one (`nvidia-smi -L`): when a batch's first call gets no machine ("no
# device machine could be started"), the next call starts a fresh one without what the first staged, and every
# later step fails fast (2026-12-02: twice, ~240-430 s lost each time). Send the throwaway ALONE and wait for its
# answer before the staging batch: a refused first call makes every later call of the batch a refusal too, each at
# 15 s of device time (2026-12-06, tenth session: ten calls sent together, ~200 s lost; two later tries ~90 s each).
# 2026-12-07 (fourteenth session): ten throwaway calls from 00:11 to 01:55 UTC, 5-20 minutes apart, got no machine
# (15, 90 or 180 s each, every one from the fifth on 180 s; an eleventh with 254 s left: 90 s): 1,636 s of 1,800. Once
# refusals repeat, a session cannot count on its device time; do the CPU work first and try at long intervals.
# 2026-12-07 (fifteenth session, a new checkout: .device-bench/ packed again with SLIM=1 NO_CORPUS=1, no prebuilt
# packs): eight throwaway calls from 03:26 to 05:27 UTC, 10-21 minutes apart (once named nvidia-h100-x1: 90 s), got no
# machine, 180 s each otherwise: 1,351 s of 1,800, and the 449 s left would not cover a start and a build.
# 2026-12-07 (sixteenth session, the same checkout: .device-bench/ still packed): refused at 06:26 and 06:43 (180 s
# each) and at 07:02 naming nvidia-h100-x1 (90 s); the try at 07:14, again naming nvidia-h100-x1, got an H100 and made
# the staging call itself (no throwaway first: a refusal costs the same). Then parts 2-5, the drafter GGUF back in the
# tree, part 6, fast1 (304 s, ~180 of it the -j16 build's wait), a traced fast1 (58 s), scale4b-a (192 s, the models
# included), part t0, part t1, train 380 (488 s): 1,676 s of 1,800 used in all.
# 2026-12-07 (seventeenth session): 124 s of device time left at the first step (`can_start_another: false`), too
# little for a start: no call.
# 2026-12-07 (eighteenth session, the same checkout; g0 / g0b packed again for the new patches/0012, same method):
# refused at 11:33 and 11:49 (180 s each), 12:01 (180 s), three "none tried" answers (15 s each); the try at 12:14
# naming nvidia-h100-x1 got an H100 and made the staging call itself (NO_PRISTINE=1 PATCHED_JOBS=16). Parts 2-6
# (~5 s each), fast1 with four pydflash servers (359 s, ~190 of it the build's wait), `pristine` (0.3 s) and right
# after it scale4b-a with native (371 s: models beside the pristine build, which ended in time), two short fast1
# runs (58 s, 85 s): 1,582 s of 1,800 used in all.
# 2026-12-07 (nineteenth session, the same checkout and packs): the first try (naming nvidia-h100-x1, 13:51) got an
# H100 and made the staging call (both builds at -j8). scale4b-a right after it spent its whole 574 s on the builds
# and the models (F16 113 + 15 s, then the builds' wait and the quantizing) and ran no benchmark: with native rows,
# call scale4b-a twice. Then scale4b-a (119 s, 4 servers x 2 levels x 4 rounds), scale4b-b (284 s, 7 servers x 2
# levels x 2 rounds), SCALE_QUANT=Q8_0 scale4b-a (92 s), parts 2-6 (~5 s each), three fast1 calls (33, 138, 80 s):
# 1,509 s of 1,800 in all.
# 2026-12-07 (twentieth session, the same checkout and packs): refused at 16:17 naming nvidia-h100-x1; at once with
# nvidia-h200 an H100 came (~130 s of lease before the first call). Staging call (3 s), scale4b-a (429 s: builds and
# models, no benchmark), scale4b-a (188 s, 4 servers x 4 levels x 3 rounds), scale31b (578 s: models 355 s, 1 client,
# cut in the 8-client rounds), scale31b --clients 8 (117 s), then the L curve's 4- and 16-client rows with
# http_vs_native.py called directly (46 s and 195 s, the second cut in its 4-client level): 1,738 s of 1,800.
# Missed: `packbuild patched` and `packbuild pristine` (12 s each) right after the first scale4b-a, which would have
# filed packs for the next session on this checkout (gbp0 / gbq0: the next session's builds in seconds, not ~430 s).
# 2026-12-07 (twenty-first session, H100 again, through nvidia-h200 after an nvidia-h100-x1 refusal): the first
# scale4b-a was cut at 600 s in the builds and models (no benchmark); `packbuild patched` then stopped in use_build's
# check for the Gemma model (not staged), fixed above; the packs were made by hand with the same commands (15 / 17 s)
# and filed: gbp0 (key c15cc47a3e9efd0d) and gbq0 (key bbcf29b8fdd2282d). scale4b-a again 361 s (5 servers), a traced
# run 76 s, the L = 1 / 3 rows 327 s: 1,599 s of 1,800.
# 2026-12-07 (twenty-second session, the same checkout and packs): no machine. Ten calls from 19:26 to 20:32 UTC,
# each `part bp0` (a refused call runs nothing): refused at 19:26 (nvidia-h200, 181 s),
# 19:35 (90 s), 19:45 (90 s), 19:58 (nvidia-h100-x1: "none tried", 15 s, then refused, 90 s), 20:05 (180 s),
# 20:12 ("none tried", 15 s), 20:19 (180 s), 20:30 ("none tried", 15 s), 20:31 (180 s); then `status` said new loans
# were paused for the session (1,036 s spent). At 21:03 `status` listed kinds again: four more calls, refused at 21:03
# (nvidia-h200, 180 s), "none tried" at 21:04 (nvidia-h100-x1, 15 s), refused at 21:15 (nvidia-h100-x1, 90 s) and
# 21:16 (nvidia-h200, 180 s): 1,501 s of 1,800 in all, nothing measured. The plan stands for the next session: `part
# bp0`, `part bq0`, the staging call, `scale4b-a`, parts 2-6 with the drafter GGUF back before part 6, `fast1
# --workloads noreuse,evalset --clients 1,4,8`, then selfgen from SKIP 9,870.
# 2026-12-07 (twenty-third session, same checkout and packs): refused once (nvidia-h200, 181 s), then an H100
# (nvidia-h100-x1). `part bp0` (rc 1 from its listing's grep, which found no part yet; the copy was made), `part bq0`,
# the staging call (8 s with the packs), scale4b-a 436 s (models 119 s), parts 2-6 (one call each, the drafter GGUF
# back before part 6) with `fast1 --workloads noreuse,evalset --clients 1,4,8 --rounds 5` (146 s), `fast1
# --workloads recur,noreuse --clients 1,4,8,16 --rounds 4` with native-bs (279 s), `selfgen 470 9870` (476 s):
# 1,710 s of 1,800. Next: traces of the fixed policy where it lost (`TRACE=1 NO_NATIVE=1 remote.sh fast1 --workloads
# recur --clients 4,8 --rounds 4 --only py-plain,py-dflash`; `TRACE=1 NO_NATIVE=1 remote.sh scale4b-a --only
# py-plain,py-synth5-adaptive --clients 1,16 --rounds 2 --stem scale4b_trace`), then selfgen from SKIP 10,890.
# 2026-12-07 (twenty-fourth session): no device time left (90 s). A CPU replay of the engine through the load ramp
# with a 4B cost model (scripts/bench/ramp_replay.py, docs/results/2026-12-07-cpu-h) puts a fifth to a half of
# adaptive drafting's time at 4-8 clients in step shapes' warm-up runs, if a warm-up run costs 1.5x. The traces above
# decide it: add c4,c8 to the scale4b trace (`--clients 1,4,8,16`), and read each drafting shape's first runs against
# its later ones with scripts/bench/trace_summary.py before changing the policy.
# 2026-12-08 (twenty-fifth session, a new checkout: .device-bench/ packed again, SLIM=1 NO_CORPUS=1, the model re-split
# into five parts of 57 MB with the drafter, the safetensors, the data runs and docs/results moved out): refused at
# 01:37 (nvidia-h200, 91 s), 01:38 (nvidia-h100-x1, 90 s), 01:41 (nvidia-h200, 90 s), 01:48 (nvidia-h200, 90 s),
# 01:53 (nvidia-h100-x1, 90 s) and 01:58 (nvidia-h200, 90 s), with two "none tried" answers (01:47, 01:51, 15 s each):
# 571 s; then `status` said new loans were paused for the session, with 1,229 s left. Nothing ran.
# The plan above stands; patches/0013 changes the source's key, so the next staging builds anew (no prebuilt pack).
# What a whole issue-13 run costs (2026-12-02, docs/results/2026-12-02-h200-g, 1,800 s in all): setup ~60 s; `hooks` 362 s
# (it waits for the build); `http` with py-plain,py-synth8,native-bs,py-random,py-dflash at 1,4,8,16 x 5 rounds
# 307 s; native-plain,native-dflash,native-synth4,native-synth8 x 3 rounds 523 s; native-synth1 alone 437 s. A
# session that also trains has room for the first `http` call only. A training session (2026-12-02,
# docs/results/2026-12-02-h200-h): setup ~110 s, `trainbg 780 3` (841 s with the load and checks) with two `suite` calls beside
# it (the GPU shared: taus do not depend on speed), `suite2` with SUITE2_LOOKUP="on off" 42 s, one `http` at 1 and 8
# clients x 5 rounds 141 s: 1,160 s in all; a second batch on a fresh machine then pays setup and the build again
# (~360 s before its first `http` result).
# Faster staging (2026-12-04, 7 calls in 134 s of lease): one call carrying g0, g0b, g1b, g1 and head.tgz runs
# `part 0 && part 0b && part 1b && start`; with the drafter GGUF moved out of the tree as well as SLIM=1's files
# (the tree is then ~5 MB), the model re-split into parts of 57 MB goes in 5 calls; put the drafter back before
# the benchmark calls (it travels with the tree). The fast1 call after that lost its machine ("stopped
# answering") while both CUDA builds ran at -j8 each: unexplained; suspect memory or disk under two builds.
set -euo pipefail
# Other work in progress in the local tree travels with every call; .device-bench/head.tgz (carried, made just
# before a call with `git archive HEAD pydflash scripts tests`) puts the committed files back, so the GPU runs HEAD.
if [ -s .device-bench/head.tgz ]; then  # git archive HEAD pydflash scripts tests (models left out), carried
    tar xzf .device-bench/head.tgz
fi
W=/root/pydflash-dev
REPO=$PWD
mkdir -p $W

join_halves() {  # PREFIX SHA_FILE: PREFIX.00 + PREFIX.01 (prepare_carry.sh's halves) into PREFIX, if the sha matches
    cat "$1.00" "$1.01" > "$1.tmp" && sha256sum "$1.tmp" | cut -c1-64 | diff -q - "$2" > /dev/null && mv "$1.tmp" "$1"
}

use_build() {
    [ -f $W/configure.log ] || { echo "no build was started on this machine: run remote.sh part 0 and start first"; exit 1; }
    wait_patched
    assemble_model
    mkdir -p .cache/models pydflash/models
    ln -sf $W/gemma.gguf .cache/models/gemma-3-270m-q4_k_m.gguf
    [ -f pydflash/models/gemma-3-270m-dflash-q8_0.gguf ] \
        || { echo "no pydflash/models/gemma-3-270m-dflash-q8_0.gguf: the shipped drafter travels with the tree"; exit 1; }
    tree_env
}

tree_env() {  # the tree's code on the patched build
    export PYTHONPATH=$W/site:$PWD PYDFLASH_LIB_DIR=$W/llama.cpp/build/bin PYTHONUNBUFFERED=1
    # .git does not travel: pass PYDFLASH_TREE_COMMIT=<local HEAD at call time> in the command; commit.txt is only
    # the HEAD when g1 was packed
    export PYDFLASH_TREE_COMMIT="${PYDFLASH_TREE_COMMIT:-$(cat $W/commit.txt) (HEAD when g1 was packed)}"
}

wait_patched() {  # the patched build's end (its libraries quantize the scale steps' models), whatever else is missing
    for _ in $(seq 1 110); do [ -f $W/build.rc ] && break; sleep 5; done
    [ "$(cat $W/build.rc 2>/dev/null)" = 0 ] || { tail -20 $W/build.log; exit 1; }
}

scale_budget() {  # NAME TAG MIN_S WHAT: a scale step's native_args (NO_NATIVE=1, a session that built no pristine
    # llama-server: none; pass --only without native conditions, the ratios then come from an earlier run on the same
    # kind) and `left`, its benchmark's seconds; under MIN_S the call ends (WHAT took it); TRACE=1 as for fast1
    native_args=()
    if [ "${NO_NATIVE:-0}" != 1 ]; then use_pristine; native_args=(--llama-server $PRISTINE_SERVER); fi
    left=$((575 - SECONDS))
    echo "$1: ${left} s left for the benchmark"
    [ $left -ge $3 ] || { echo "$1: $4 took the call: run $1 again"; exit 0; }
    if [ "${TRACE:-0}" = 1 ]; then trace_begin $2; left=$((left - 20)); fi
}

pristine_tree() {  # $W/pristine: the carried source with patches/ reverted (last first), checked against the sdist's
    # own copies of the files they touch (g1/pristine.sha256, made by prepare_carry.sh)
    rm -rf $W/pristine && mkdir -p $W/pristine \
        && tar cf - -C $W/llama.cpp --exclude=./build . | tar xf - -C $W/pristine \
        && (cd $W/pristine && for p in $(ls -r $REPO/patches/*.patch); do patch -R -p1 --quiet < $p || exit 1; done) \
        && (cd $W/pristine && sha256sum -c --quiet $W/pristine.sha256)
}

use_pristine() {  # wait for the pristine llama-server (`start` builds it beside the patched tree)
    [ -f $W/pristine_check.log ] || { echo "no pristine build was started on this machine: run remote.sh start"; exit 1; }
    for _ in $(seq 1 110); do [ -f $W/pristine.rc ] && break; sleep 5; done
    [ "$(cat $W/pristine.rc 2>/dev/null)" = 0 ] || { cat $W/pristine_check.log 2>/dev/null; tail -20 $W/pristine_build.log; exit 1; }
    PRISTINE_SERVER=$W/pristine/build/bin/llama-server
}

fast_bench() {  # NAME WORKLOADS [scripts/bench/http_vs_native.py args...]: the defaults-mode benchmark, bounded to what the call has left
    use_build
    local native=()
    if [ "${NO_NATIVE:-0}" != 1 ]; then  # NO_NATIVE=1: the pydflash conditions only (no pristine build this session)
        use_pristine
        ldd $PRISTINE_SERVER | grep -m1 libllama || true  # its own libllama (build RPATH), not the patched one
        native=(--llama-server $PRISTINE_SERVER)
    fi
    local left=$((${CALL_S:-600} - 25 - SECONDS))  # CALL_S: the call's own limit where less than 600 s is left
    echo "$1: ${left} s left for the benchmark"
    [ $left -ge 120 ] || { echo "$1: the builds took the call: run $1 again"; exit 1; }
    if [ "${TRACE:-0}" = 1 ]; then trace_begin $1; left=$((left - 20)); fi  # 20 s for the summaries
    # SIGTERM at the bound (the run then writes what it measured, marked partial), SIGKILL 20 s later
    timeout -k 20 $((left - 20)) python3 scripts/bench/http_vs_native.py --defaults --ngl -1 "${native[@]}" \
        --workloads "$2" --rounds 3 --out-dir $OUT --stem "$1" --no-render --log-dir $OUT/logs_$1 "${@:3}" || echo "$1: exit $?"
    tar czf $OUT/logs_$1.tgz -C $OUT logs_$1 && rm -rf $OUT/logs_$1
    trace_end $1
}

trace_begin() {  # NAME, under TRACE=1: every pydflash engine started from here on writes its step trace (PATH.<pid>)
    rm -rf $W/trace_$1 && mkdir -p $W/trace_$1 && export PYDFLASH_STEP_TRACE=$W/trace_$1/tr
}

trace_end() {  # NAME: one summary per engine process; which server it was shows in it (a plain server has no
    # drafting or feature steps, a synthetic one gives its acceptance), so trace two servers at a time
    # (--only py-plain,py-dflash) where their kinds alone do not tell them apart
    for f in $( [ "${TRACE:-0}" = 1 ] && ls $W/trace_$1/tr.* 2>/dev/null); do
        python3 scripts/bench/trace_summary.py $f --out $OUT/trace_$1_$(basename $f | cut -d. -f2).json > /dev/null \
            || echo "trace_summary: $f failed"
        gzip -c $f > $OUT/trace_raw_$1_$(basename $f | cut -d. -f2).jsonl.gz  # the steps themselves (~25 B a step gzipped, 2026-12-06)
    done
}

costs_off_on() {  # VAR OFF ON: scripts/bench/step_costs.py (shipped drafter) without VAR and with VAR=1, twice each, alternating
    for i in 1 2; do
        env -u "$1" python3 scripts/bench/step_costs.py --ngl -1 \
            --drafter pydflash/models/gemma-3-270m-dflash-q8_0.gguf --out $OUT/step_costs_$2_$i.json 2>&1 | tail -1
        env "$1=1" python3 scripts/bench/step_costs.py --ngl -1 \
            --drafter pydflash/models/gemma-3-270m-dflash-q8_0.gguf --out $OUT/step_costs_$3_$i.json 2>&1 | tail -1
    done
}

assemble_model() {
    if [ ! -f $W/gemma.gguf ]; then
        cat $W/part* > $W/gemma.gguf.tmp && sha256sum $W/gemma.gguf.tmp | cut -c1-64 | diff - $W/model.sha256 \
            && mv $W/gemma.gguf.tmp $W/gemma.gguf
    fi
}

# torch and our CUDA libllama in one process abort ("free(): invalid pointer", H200): the trainer needs no
# llama.cpp, so pydflash's import must not load it. Bounded by a timeout so that the export always runs; the first
# try, during the CUDA build's 16 compile jobs, ran past its call's limit and returned nothing.
# The tree's own runs count only where their shards travelled: a tree whose data was moved aside for the call keeps
# the empty folders on the device (2026-12-06: the trainer then read 58 folders without a shard)
tree_has_data() { compgen -G "pydflash/train/gguf_data/*/*/shard-*.npz" > /dev/null; }
committed_data() {  # the data runs staged by `part t1` (SLIM=1), unpacked once
    if ! tree_has_data && [ -f $W/gguf_data.tar ] && [ ! -d $W/gguf_data ]; then
        tar xf $W/gguf_data.tar -C $W
    fi
}
data_root() { tree_has_data && echo $PWD/pydflash/train/gguf_data || echo $W/gguf_data; }

train_cmd() {  # SECONDS LAYERS, from a tree root; DATA / TRAIN_ARGS / INIT from the environment
    # INIT: the drafter to continue (default: the shipped one); INIT=none trains one from scratch (TRAIN_ARGS may
    # shape it: --heads, --kv-heads, --head-dim)
    # SLIM=1 packs the shipped safetensors and the committed data runs out of the tree (prepare_carry.sh: `part t0`,
    # `part t1` stage them in $W)
    local shipped=pydflash/models/gemma-3-270m-dflash.safetensors
    if [ ! -f $shipped ]; then  # staged by `part t0`; its config is tracked and travels with the tree
        shipped=$W/gemma-3-270m-dflash.safetensors
        cp pydflash/models/gemma-3-270m-dflash.config.json $W/
    fi
    local init="${INIT:-$shipped}" init_args=()
    if [ "$init" != none ]; then
        [ -f "$init" ] || { echo "no drafter $init (with SLIM=1, stage it: part t0): training starts from it"; return 1; }
        init_args=(--init "$init")
    fi
    committed_data
    timeout $(($1 + 300)) env -u PYDFLASH_LIB_DIR python3 -m pydflash.train.trainer --gguf $W/gemma.gguf \
        --out $W/drafter --data "${DATA:-$(ls -d $(data_root)/*/*/ $W/data/*p*/ 2>/dev/null | sed 's:/$::' | paste -sd,)}" \
        ${init_args[@]+"${init_args[@]}"} --layers "$2" --seconds "$1" ${TRAIN_ARGS:-}
}

export_drafter() {
    env -u PYDFLASH_LIB_DIR python3 -m pydflash.train.export_gguf --drafter $W/drafter --target $W/gemma.gguf \
        --out $W/drafter/drafter-fullhead-q8_0.gguf --type q8_0 2>&1 | tail -3
    # the shipped form: its own head of the 28,672 ids the data runs use most (scripts/reduce_drafter_head.py)
    committed_data
    env -u PYDFLASH_LIB_DIR python3 scripts/reduce_drafter_head.py --drafter $W/drafter/drafter-fullhead-q8_0.gguf \
        --target $W/gemma.gguf --data $(data_root) --out $W/drafter/drafter-q8_0.gguf | grep sha256
    split -b 15000000 -d -a 2 $W/drafter/model.safetensors $OUT/model.safetensors.
    tar czf $OUT/train_meta.tgz -C $W/drafter config.json train.json train.log
}

# The two builds' configure flags (the key of a prebuilt pack below includes them). Pristine: the flags a user would
# give (tests, examples and the web UI's download off: their sources are not carried, and the machine reaches no
# network; none changes inference).
PATCHED_CMAKE="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_RPC=ON"
PRISTINE_CMAKE="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
PATCHED_TARGETS="${PATCHED_TARGETS:-llama}"

# Prebuilt packs. The two CUDA builds take 4-10 minutes of every machine's 30 (2026-12-05: the patched libllama at
# -j8 beside the pristine llama-server at -j10 ran past 570 s; alone at -j16, 210 s). `packbuild patched|pristine`
# sends a finished build back in parts; scripts/dev/store_build.sh files them under .device-bench/gb<which>N; `part
# bp0`.. / `part bq0`.. stage them and `start` unpacks them instead of building when their key is this machine's:
# the carried source (src.sha256, patches applied), the flags and targets above and the CUDA compiler. Anything else
# (no pack, another key, a library that does not resolve) builds as before.
build_key() {  # patched|pristine: what that build depends on, as 16 hex digits
    local nvcc; nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    { cat $W/src.sha256; [ "$1" = pristine ] && { cat $W/pristine.sha256; echo "$PRISTINE_CMAKE"; } \
        || echo "$PATCHED_CMAKE|$PATCHED_TARGETS"; { $nvcc --version 2>/dev/null || true; } | tail -2; } \
        | sha256sum | cut -c1-16
}

prebuilt() {  # patched|pristine: unpack $W/build-<which>.txz.NN into $W when its key is this machine's (status 0)
    local which=$1 key lib
    ls $W/build-$which.txz.?? > /dev/null 2>&1 || return 1
    key=$(build_key $which)
    [ "$(cat $W/build-$which.key 2>/dev/null)" = "$key" ] \
        || { echo "prebuilt $which: packed for key $(cat $W/build-$which.key 2>/dev/null), this machine's is $key: building"; return 1; }
    cat $W/build-$which.txz.?? > $W/build-$which.txz && sha256sum $W/build-$which.txz | cut -c1-64 \
        | diff -q - $W/build-$which.sha256 > /dev/null || { echo "prebuilt $which: the joined pack is not the sent one"; return 1; }
    xz -dc $W/build-$which.txz | tar xf - -C $W || return 1
    [ $which = pristine ] && lib=$W/pristine/build/bin/llama-server || lib=$W/llama.cpp/build/bin/libllama.so
    if [ ! -e $lib ] || ldd $lib | grep -q "not found"; then echo "prebuilt $which: $lib does not resolve: building"; return 1; fi
}

build_pristine() {  # JOBS: llama-server from $W/pristine, detached (survives the call); pristine.rc when done
    setsid nohup bash -c "cd $W/pristine && cmake -S . -B build $PRISTINE_CMAKE > $W/pristine_configure.log 2>&1 \
        && cmake --build build -j$1 --target llama-server > $W/pristine_build.log 2>&1; echo \$? > $W/pristine.rc" \
        > /dev/null 2>&1 &
}

BENCH="python3 scripts/bench/engine.py --ngl -1 --threads 8"
ADAPTIVE="adaptive, random drafter;adaptive, random drafter, 32k head;trained drafter, adaptive"
case "$1" in
start)
    cp -r .device-bench/g1/* $W/
    [ -f $W/src.tgz.00 ] && [ -f $W/src.tgz.01 ] \
        || { echo "no llama.cpp source staged: run remote.sh part 0 and part 0b (carrying .device-bench/g0, g0b) first"; exit 1; }
    [ -d $W/whl ] || { echo "no wheels staged: run remote.sh part 1b (carrying .device-bench/g1b) first"; exit 1; }
    join_halves $W/src.tgz $W/src.sha256 || { echo "the joined llama.cpp source is not the packed one"; exit 1; }
    cd $W && mkdir -p site && tar xzf site.tgz -C site && tar xzf src.tgz
    echo "start: source unpacked at ${SECONDS} s"
    # no version check: the machine reaches no network, and pip's check would wait on it
    timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --upgrade --target $W/site whl/*.whl || echo "start: pip install failed or timed out ($?)"
    echo "start: wheels installed at ${SECONDS} s"

    # the pristine tree for llama-server alone (PRISTINE_CMAKE), copied before the patched build starts writing
    # build/ there; either build comes from a prebuilt pack where one was staged for this machine's key
    rm -f $W/pristine.rc $W/build.rc
    build_key patched > $W/build-patched.key.here; build_key pristine > $W/build-pristine.key.here
    if [ "${NO_PRISTINE:-0}" = 1 ]; then  # no native baseline this session: the patched build gets every core
        echo "no pristine build (NO_PRISTINE=1)" > $W/pristine_check.log; echo 1 > $W/pristine.rc
    elif prebuilt pristine; then
        echo "prebuilt (key $(cat $W/build-pristine.key))" > $W/pristine_check.log; echo 0 > $W/pristine.rc
        echo "start: prebuilt pristine llama-server unpacked at ${SECONDS} s"
    else
        pristine_tree > $W/pristine_check.log 2>&1 \
            || { echo "the pristine tree is not the sdist's: $(tail -3 $W/pristine_check.log)"; echo 1 > $W/pristine.rc; }
    fi
    echo "start: pristine tree at ${SECONDS} s"
    # our patches are already applied in the carried vendor tree. The CUDA-only ones (0006, 0007) are compiled first
    # here: should the build fail, they are reverted and the build retried, so that a session's runs still have a
    # library (build.log says so, `cuda` prints why, and the GPU tests of test_native_patches.py fail)
    if prebuilt patched; then
        echo "prebuilt (key $(cat $W/build-patched.key))" | tee $W/configure.log > $W/build.log; echo 0 > $W/build.rc
        echo "start: prebuilt patched libraries unpacked at ${SECONDS} s"
    else
        setsid nohup bash -c "cd $W/llama.cpp && cmake -S . -B build $PATCHED_CMAKE \
            > $W/configure.log 2>&1 && { cmake --build build -j${PATCHED_JOBS:-8} --target $PATCHED_TARGETS > $W/build.log 2>&1 \
            || { tail -30 $W/build.log > $W/build_failed.log; for p in \$(ls -r $REPO/patches/000[67]-*.patch); do patch -R -p1 --quiet < \$p; done \
                 && echo 'pydflash: the build failed; the CUDA-only patches (0006, 0007) reverted, built again' >> $W/build.log \
                 && cmake --build build -j${PATCHED_JOBS:-8} --target $PATCHED_TARGETS >> $W/build.log 2>&1; }; }; echo \$? > $W/build.rc" \
            > /dev/null 2>&1 &
    fi
    # -j8 each (the patched build above too): the two builds share the 16 cores
    [ -f $W/pristine.rc ] || build_pristine ${PRISTINE_JOBS:-8}
    echo started build; nvidia-smi --query-gpu=name,memory.total --format=csv
    PYTHONPATH=$W/site timeout 60 python3 -c 'import fastapi, starlette, pydantic, uvicorn, sse_starlette, prometheus_client
import jinja2, httpx, gguf, numpy, lzma; print("imports ok", fastapi.__version__, pydantic.__version__)' 2>&1 || true ;;
pristine)  # remote.sh pristine: the pristine build after a `start` with NO_PRISTINE=1, once the patched one is done (then
    # at -j16: the pydflash-only calls ran first, on a machine the builds were not sharing)
    [ -f $W/configure.log ] || { echo "pristine: run remote.sh start first"; exit 1; }
    [ "$(cat $W/pristine.rc 2>/dev/null)" = 0 ] && { echo "pristine: already built"; exit 0; }
    wait_patched
    rm -f $W/pristine.rc
    pristine_tree > $W/pristine_check.log 2>&1 \
        || { echo "the pristine tree is not the sdist's: $(tail -3 $W/pristine_check.log)"; echo 1 > $W/pristine.rc; exit 1; }
    build_pristine ${PRISTINE_JOBS:-16}
    echo "pristine: build started at ${SECONDS} s" ;;
packbuild)  # remote.sh packbuild patched|pristine: that finished build back as build-<which>.txz.NN (15 MiB parts, at most
    # 4: 64 MiB come back a call) with its key and sha256, for scripts/dev/store_build.sh; not when it failed or
    # was built without patches 0006 / 0007
    which=${2:?patched or pristine}
    # wait_patched, not use_build: a session that staged only the scale steps' parts has no Gemma model, and
    # use_build's checks for it ended the first packbuild of 2026-12-07 (twenty-first session) before it packed
    if [ $which = pristine ]; then use_pristine; dir=pristine/build/bin; else wait_patched; dir=llama.cpp/build/bin; fi
    [ -f $W/build-$which.key.here ] || { echo "packbuild: no key recorded by start on this machine"; exit 1; }
    if [ $which = patched ] && grep -q "CUDA-only patches (0006, 0007) reverted" $W/build.log; then
        echo "packbuild: this build lacks patches 0006 / 0007 (build_failed.log): not sent"; exit 1
    fi
    # the libraries and programs only (build/bin holds nothing else)
    tar cf - -C $W $dir | xz -T0 -6 > $W/build-$which.txz
    size=$(stat -c %s $W/build-$which.txz); echo "packbuild $which: $size bytes"
    [ $size -le $((4 * 15 * 1024 * 1024)) ] || { echo "packbuild: over 4 parts of 15 MiB: not sent"; exit 1; }
    split -b 15M -d -a 2 $W/build-$which.txz $OUT/build-$which.txz.
    sha256sum $W/build-$which.txz | cut -c1-64 > $OUT/build-$which.sha256
    cp $W/build-$which.key.here $OUT/build-$which.key; ls -la $OUT ;;
part)
    cp -r .device-bench/g$2/* $W/ && ls $W | grep 'part\|src.tgz' | tr '\n' ' '; tail -c 200 $W/build.log 2>/dev/null || true; echo ;;
costs)
    use_build
    python3 scripts/bench/step_costs.py --ngl -1 --out $OUT/step_costs_gpu.json
    PYDFLASH_PER_ROW_GREEDY=1 python3 scripts/bench/step_costs.py --ngl -1 --out $OUT/step_costs_gpu_per_row.json ;;
bench)
    use_build
    $BENCH --slots 1 --rounds 3 --tokens 512 --out $OUT/bench_gpu_c1.md
    $BENCH --slots 8 --rounds 3 --tokens 256 --out $OUT/bench_gpu_c8.md ;;
long)  # remote.sh long [1] [8]: which concurrencies (default both)
    use_build
    sel="${*:2}"
    for c in ${sel:-1 8}; do
        if [ "$c" = 1 ]; then
            $BENCH --slots 1 --rounds 6 --tokens 900 --only "$ADAPTIVE" --out $OUT/bench_gpu_c1_long.md
        else
            $BENCH --slots 8 --rounds 4 --tokens 600 --only "$ADAPTIVE" --out $OUT/bench_gpu_c8_long.md
        fi
    done ;;
eval)
    use_build
    python3 scripts/bench/drafter_eval.py --ngl -1 --threads 8 --n 40 --tokens 256 --out $OUT/drafter_eval_gpu.json ;;
suite)
    use_build
    python3 scripts/bench/drafter_eval.py --suite --ngl -1 --threads 8 --n 10 --tokens 256 --drafter "${2:-pydflash/models/gemma-3-270m-dflash-q8_0.gguf}" \
        --out $OUT/drafter_suite_gpu${SUITE_TAG:-}.json ${SUITE_ARGS:-} ;;
gen)  # NPROC generator processes share the GPU, process i on lines SKIP + i * SPAN .. SKIP + (i + 1) * SPAN;
      # GEN_ARGS passes more flags (--kv-streams)
    use_build
    skip=${3:-0}; span=${5:-30000}; nproc=${6:-2}
    # the call has 600 s: the build may have taken part of them (use_build waits for it), and the model loads, the
    # summaries and the tar take up to ~100 s besides (on 2026-12-01 a 380 s run used 599 s of its call)
    seconds=$(( ${2:-400} < 480 - SECONDS ? ${2:-400} : 480 - SECONDS ))
    echo "gen: ${seconds} s of generation (asked ${2:-400}, ${SECONDS} s of this call already gone)"
    if [ -f $W/slots_gpu.json ] && [ -z "${GEN_ARGS+x}" ]; then  # per-slot KV streams if `slots` found them faster
        GEN_ARGS=$(python3 -c "import json; r = {(x['layout'], x['slots']): x['step_ms'] for x in json.load(open('$W/slots_gpu.json'))['rows']}
print('--kv-streams' if r.get(('streams', 128), 1e9) < r.get(('unified', 128), 0) else '')")
        echo "gen: GEN_ARGS='$GEN_ARGS' (from slots_gpu.json)"
    fi
    if [ ! -f $W/prompts.jsonl.gz ]; then
        [ -f $W/prompts.jsonl.gz.00 ] && [ -f $W/prompts.jsonl.gz.01 ] || { echo "gen: stage the corpus first (part c0, part c1)"; exit 1; }
        join_halves $W/prompts.jsonl.gz $W/corpus.sha256 || { echo "gen: the joined corpus is not the packed one"; exit 1; }
    fi
    # GEN_RANGES="A:B,C:D" instead: one process per range of corpus lines (the unused gaps between earlier runs)
    ranges=${GEN_RANGES:-$(for i in $(seq 0 $((nproc - 1))); do echo -n "$((skip + i * span)):$((skip + (i + 1) * span)),"; done)}
    IFS=, read -ra ranges <<< "$ranges"
    nproc=${#ranges[@]}
    for i in $(seq 0 $((nproc - 1))); do
        python3 -m pydflash.train.generate --target $W/gemma.gguf --prompts $W/prompts.jsonl.gz \
            --out $W/data/${GEN_TAG:-}p$i --ngl -1 --threads 4 --slots "${4:-128}" --n-new 256 --seconds "$seconds" \
            --skip ${ranges[$i]%:*} --stop ${ranges[$i]#*:} ${GEN_ARGS:-} > $W/gen$i.log 2>&1 &
    done
    wait || true
    for i in $(seq 0 $((nproc - 1))); do
        grep -v "^llama_\|^load\|^print_info" $W/gen$i.log | tail -3
        cp $W/data/${GEN_TAG:-}p$i/generate.json $OUT/generate_${GEN_TAG:-}p$i.json
    done
    tar cf - -C $W --exclude=generate.json data | split -b 15000000 -d -a 2 - $OUT/data.tar. ;;
selfgen)  # remote.sh selfgen [SECONDS] [SKIP] [SPAN] [NPROC] [SLOTS]
    use_build
    # model load, flush and tar take ~30-60 s of the call's 600 (gen's experience): generation gets the rest
    seconds=$(( ${2:-500} < 520 - SECONDS ? ${2:-500} : 520 - SECONDS ))
    skip=${3:-0}; span=${4:-1000000}; nproc=${5:-4}
    name=${SELFGEN_DATE:-$(date +%F)}-selfgen
    echo "selfgen: ${seconds} s of generation into $W/gguf_selfgen/$name (${SECONDS} s of this call already gone)"
    for i in $(seq 0 $((nproc - 1))); do
        mkdir -p $W/gguf_selfgen/$name/p$i
        python3 -m pydflash.train.selfgen --target $W/gemma.gguf --out $W/gguf_selfgen/$name/p$i --ngl -1 --threads 4 \
            --slots "${6:-128}" --seconds "$seconds" --skip $((skip + i * span)) --stop $((skip + (i + 1) * span)) \
            ${SELFGEN_ARGS:-} > $W/selfgen$i.log 2>&1 &
    done
    wait || true
    for i in $(seq 0 $((nproc - 1))); do
        grep -v "^llama_\|^load\|^print_info" $W/selfgen$i.log | tail -2
        cp $W/gguf_selfgen/$name/p$i/generate.json $OUT/generate_selfgen_p$i.json || true
    done
    tar cf - -C $W/gguf_selfgen --transform "s:^:pydflash/train/gguf_data/:" $name \
        | split -b 15000000 -d -a 2 - $OUT/selfgen.tar. ;;
train)  # DATA=folders (default: the committed runs in pydflash/train/gguf_data and what `gen` left in $W/data)
    use_build
    set +e
    train_cmd "${2:-450}" "${3:-4}" > $OUT/train_stdout.log 2>&1
    echo "trainer exit $?"; grep -v Warning $OUT/train_stdout.log | tail -30
    set -e
    export_drafter ;;
trainbg)
    assemble_model
    rm -rf $W/trainsrc $W/train.rc && mkdir -p $W/trainsrc && cp -r pydflash $W/trainsrc/
    # the next call replaces this tree: the detached trainer runs from its own copy
    export PYTHONPATH=$W/site:$W/trainsrc PYTHONUNBUFFERED=1
    declare -f train_cmd committed_data data_root tree_has_data > $W/train_fn.sh
    setsid nohup bash -c "cd $W/trainsrc && source $W/train_fn.sh && W=$W DATA='${DATA:-}' TRAIN_ARGS='${TRAIN_ARGS:-}' INIT='${INIT:-}' \
        train_cmd ${2:-450} ${3:-4} > $W/train_stdout.log 2>&1; echo \$? > $W/train.rc" > /dev/null 2>&1 &
    sleep 20; grep -v Warning $W/train_stdout.log | tail -5 || true ;;
trainwait)
    for _ in $(seq 1 $(( ${2:-500} / 5 ))); do [ -f $W/train.rc ] && break; sleep 5; done
    cp $W/train_stdout.log $OUT/
    echo "trainer exit $(cat $W/train.rc 2>/dev/null || echo 'still running')"; grep -v Warning $W/train_stdout.log | tail -30
    [ -f $W/train.rc ]
    use_build
    export_drafter ;;
suite2)
    use_build
    for which in ${SUITE2_WHICH:-new old}; do  # SUITE2_WHICH=new: the shipped drafter's suite is already known
        d=pydflash/models/gemma-3-270m-dflash-q8_0.gguf
        [ $which = new ] && d=$W/drafter/drafter-q8_0.gguf
        # SUITE2_LOOKUP="on off": with copied chains (the default) and the drafter's blocks alone (_nolookup)
        for lookup in ${SUITE2_LOOKUP:-on}; do
            python3 scripts/bench/drafter_eval.py --suite --ngl -1 --threads 8 --n 10 --tokens 256 --drafter $d \
                $([ $lookup = off ] && echo --no-lookup) --out $OUT/drafter_suite_gpu_$which$([ $lookup = off ] && echo _nolookup).json \
                2>&1 | grep -v "^llama_\|^load\|^print_info" | tail -12
        done
    done
    # both drafters' block against a 16-token verify, same machine, same call (the shipped one last ran a session ago)
    python3 scripts/bench/step_costs.py --ngl -1 --drafter $W/drafter/drafter-q8_0.gguf --out $OUT/step_costs_new.json 2>&1 | tail -8
    python3 scripts/bench/step_costs.py --ngl -1 --drafter pydflash/models/gemma-3-270m-dflash-q8_0.gguf \
        --out $OUT/step_costs_shipped.json 2>&1 | tail -8 ;;
cuda)  # the CUDA-only patches on the idle GPU (0006 MMVQ passes, 0007 a CUDA graph per shape): their tests, then
      # scripts/bench/step_costs.py (shipped drafter) with both, and with each turned off by its switch
    use_build
    cat $W/build_failed.log 2>/dev/null || true
    python3 -m pytest -q -p no:cacheprovider tests/native/test_native_patches.py -k "hopper or cuda_graphs" -rs 2>&1 | tail -6 || true
    for mode in both no_passes no_shape_keys; do
        GGML_CUDA_MMVQ_PASSES=$([ $mode = no_passes ] && echo 0 || echo 1) \
        GGML_CUDA_GRAPH_KEY_SHAPES=$([ $mode = no_shape_keys ] && echo 0 || echo 1) python3 scripts/bench/step_costs.py --ngl -1 \
            --drafter pydflash/models/gemma-3-270m-dflash-q8_0.gguf --out $OUT/step_costs_$mode.json 2>&1 | tail -3 || true
    done ;;
split)
    use_build
    shipped="--drafter pydflash/models/gemma-3-270m-dflash-q8_0.gguf"
    for v in split:GGML_LOG_SKIP_DEBUG=1 noreuse:LLAMA_GRAPH_REUSE_DISABLE=1 nocudagraphs:GGML_CUDA_DISABLE_GRAPHS=1 \
             debuglines:GGML_LOG_SKIP_DEBUG=0; do
        env ${v#*:} python3 scripts/bench/step_costs.py --ngl -1 $shipped --out $OUT/step_costs_${v%%:*}.json 2>&1 | tail -2
    done
    python3 scripts/bench/step_costs.py --ngl -1 --out $OUT/step_costs_random1.json 2>&1 | tail -2 ;;
d2t)
    use_build
    costs_off_on PYDFLASH_D2T_SCATTER picks scatter ;;
spare)
    use_build
    costs_off_on PYDFLASH_SPARE_SCHED onesched spare ;;
http)  # remote.sh http [scripts/bench/http_vs_native.py args...]: JSON only (rendered locally: the device has no matplotlib)
    use_build
    use_pristine
    if [ ! -x $W/llama.cpp/build/bin/llama-server ]; then  # the native DFlash rows' server: not in PATCHED_TARGETS' default
        # configured again first: a prebuilt pack brings build/bin alone
        (cd $W/llama.cpp && cmake -S . -B build $PATCHED_CMAKE > $W/server_build.log 2>&1 \
            && cmake --build build -j16 --target llama-server >> $W/server_build.log 2>&1) \
            || { tail -20 $W/server_build.log; exit 1; }
    fi
    python3 scripts/bench/http_vs_native.py --ngl -1 --threads 8 --llama-server $PRISTINE_SERVER \
        --llama-server-patched $W/llama.cpp/build/bin/llama-server --out-dir $OUT --no-render --log-dir $OUT/logs "${@:2}"
    # at most 8 files come back: the server logs and step traces travel as one archive
    tar czf $OUT/logs_trace.tgz -C $OUT logs $( [ -d $OUT/trace ] && echo trace ) && rm -rf $OUT/logs $OUT/trace ;;
fast1)  # remote.sh fast1 [scripts/bench/http_vs_native.py args...]
    # 5 rounds: at 4-16 clients a round lasts 1-2.5 s and paired rounds spread +-5-10 % (2026-12-05, 3 rounds of
    # three pydflash servers took 142 s of benchmark)
    fast_bench fast1 recur,chat --clients 1,4,8,16 --chat-clients 1,4,8 --rounds 5 "${@:2}" ;;
fast2)  # remote.sh fast2 [scripts/bench/http_vs_native.py args...]
    fast_bench fast2 recur-stream,noreuse,recur-cp0 --clients 1,4,8,16 "${@:2}" ;;
paused)  # scripts/bench/paused_cost.py: a paused step against a plain one, 1 and 16 slots, on a quiet machine (both builds done)
    use_build
    # a pristine build still running would share the CPU with the host-bound steps: wait for it, whatever its result
    for _ in $(seq 1 110); do [ -f $W/pristine.rc ] && break; sleep 5; done
    left=$((${CALL_S:-600} - 20 - SECONDS))
    [ $left -ge 150 ] || { echo "paused: the builds took the call ($left s left): run paused again"; exit 1; }
    # each engine's step trace (which kind of step took the time), summarised here: the traces stay on the machine
    rm -rf $W/trace_paused
    timeout -k 10 $((left - 15)) python3 scripts/bench/paused_cost.py --ngl -1 --slots 1,16 --steps 1500 --repeats 3 \
        --out $OUT/paused_cost.json --step-trace $W/trace_paused "${@:2}" || echo "paused: exit $?"
    for f in $W/trace_paused/*; do
        python3 scripts/bench/trace_summary.py $f --out $OUT/trace_$(basename $f | cut -d. -f1,2).json > /dev/null \
            || echo "trace_summary: $f failed"
    done ;;
kvspan)  # remote.sh kvspan [scripts/bench/kv_span.py args...]: the KV span each step attends over (llama.cpp's n_kv),
    # cache off / fresh / settled, in-process at 8 clients (the spans only: the log lines cost time in the forward)
    use_build
    timeout -k 10 $((${CALL_S:-600} - 30 - SECONDS)) python3 scripts/bench/kv_span.py --run --ngl -1 --clients 8 \
        --requests 64 --tokens 256 --out $OUT/kv_span_gpu.json "${@:2}" || echo "kvspan: exit $?" ;;
cachediag)  # remote.sh cachediag [scripts/bench/paused_cost.py args...]: what the prompt cache costs a plain step, in-process
    # (2026-12-05 through HTTP: 0.59-0.85x of the cache off on traffic that reuses nothing; not on a CPU), with
    # CUDA graphs and without (GGML_CUDA_DISABLE_GRAPHS: whether the cost is graphs that stop replaying)
    use_build
    for _ in $(seq 1 110); do [ -f $W/pristine.rc ] && break; sleep 5; done  # a quiet machine: host-bound steps
    for graphs in on off; do
        left=$((${CALL_S:-600} - 20 - SECONDS))
        [ $left -ge 100 ] || { echo "cachediag: $left s left: stopping before graphs=$graphs"; break; }
        env $([ $graphs = off ] && echo GGML_CUDA_DISABLE_GRAPHS=1) timeout -k 10 $(( left < 280 ? left : 280 )) \
            python3 scripts/bench/paused_cost.py --ngl -1 --slots 8,16 --capacity 16 --cache --request-tokens 256 \
            --steps 1000 --repeats 3 --variants plain,plain-nodevice,plain-nocache \
            --out $OUT/cachediag_graphs_$graphs.json "${@:2}" 2>&1 | grep -v "^llama_\|^load\|^print_info" | tail -3 \
            || echo "cachediag graphs=$graphs: exit $?"
    done ;;
adapt)
    use_build
    for c in 1 8 16; do
        $BENCH --slots $c --rounds 3 --tokens 256 --reduced-head 0 --out $OUT/bench_gpu_adaptive_c$c.md \
            --only "synthetic L=8;adaptive, random drafter;trained drafter;trained drafter, adaptive"
    done ;;
profile)  # scripts/bench/profile_host.py: a step's host part by phase, 16 slots synthetic L=8 and plain, 1 slot L=8
    use_build
    for args in "--slots 16 --synth-len 8" "--slots 16 --synth-len 0" "--slots 1 --synth-len 8"; do
        python3 scripts/bench/profile_host.py --model gemma --ngl -1 --threads 8 --steps 400 $args \
            --out $OUT/profile_host_$(echo $args | tr -d ' -' | tr '.' '_').json > /dev/null
    done
    ls $OUT ;;
sampling)
    use_build
    python3 scripts/bench/sampling.py --ngl -1 --rounds 3 --tokens 128 --out $OUT/sampling_gpu.json
    python3 scripts/bench/sampling.py --ngl -1 --rounds 3 --tokens 128 --top-p 0.9 --out $OUT/sampling_gpu_top_p.json ;;
copyfirst)  # remote.sh copyfirst [scripts/bench/copy_first.py args...]: copies standing in for the drafter's blocks,
    # in-process, with the stand-in and without, against plain (on a CPU the shipped drafter seldom drafts: nothing
    # to stand in for)
    use_build
    left=$((${CALL_S:-600} - 20 - SECONDS))
    timeout -k 10 $left python3 scripts/bench/copy_first.py --ngl -1 --loads 1,4,8 --prompts 24 \
        --out $OUT/copy_first.json "${@:2}" 2>&1 | grep -v "^llama_\|^load\|^print_info" | tail -12 ;;
cache)  # remote.sh cache [scripts/bench/cache.py args...]
    use_build
    python3 scripts/bench/cache.py --start "-ngl -1 -t 8" --out $OUT/cache_gpu.json "${@:2}" ;;
server)  # remote.sh server [scripts/bench/server_load.py args...]
    use_build
    python3 scripts/bench/server_load.py --start "-ngl -1 -np 16 -c 8192 -t 8" --modes spec,plain,fixed --fixed-k 15 \
        --clients 1,4,16 --requests 4 --tokens 128 --stream-tokens 2048 --out $OUT/server_gpu.json --log-dir $OUT "${@:2}" ;;
scale4b-a|scale4b-b)  # remote.sh scale4b-a|scale4b-b [scripts/bench/http_vs_native.py args...]
    [ -f $W/configure.log ] || { echo "$1: no build was started on this machine: run remote.sh start first"; exit 1; }
    S=$W/scale4b
    quant=${SCALE_QUANT:-Q4_K_M}
    tag=${1#scale4b-}_$(echo $quant | tr 'A-Z' 'a-z')
    tree_env
    # numpy only (pydflash imports without libllama): runs while the builds compile
    python3 -m pydflash.factory.scale $S --shape qwen3-4b --quant Q4_K_M,Q8_0 --f16-only 2>&1 | tail -1
    wait_patched
    python3 -m pydflash.factory.scale $S --shape qwen3-4b --quant Q4_K_M,Q8_0 2>&1 | grep -v "^\[\|^llama_model_quant" | tail -4
    cp $S/manifest.json $OUT/scale4b_models.json
    scale_budget $1 $tag 240 "the builds and the models"
    # the useless drafter: py-random agrees with this target; py-synth5-adaptive: L = 5 as a user's server drafts
    only="native-bs,py-plain,py-synth5,py-synth1-adaptive,py-synth5-adaptive"
    [ $1 = scale4b-b ] && only="py-synth1,py-synth3,py-synth8,native-synth*"
    # SIGINT, not TERM: the script's finally blocks stop the servers it started (each in a session of its own)
    timeout -s INT -k 30 $left python3 scripts/bench/http_vs_native.py --interleave --ngl -1 --threads 8 \
        "${native_args[@]}" --model $S/target-$(echo $quant | tr 'A-Z' 'a-z').gguf \
        --drafter $S/drafter-q8_0.gguf --random-drafter $S/drafter-q8_0.gguf --synth-lens 1,3,5,8 \
        --prompt-vocab 151936 --target-set scale4b --tokens 128 --rounds 3 --only "$only" \
        --model-label "random-weight Qwen3-4B-shaped $quant target; Qwen3-4B-DFlash-b16-shaped drafter (Q8_0, fc F16), pydflash.factory.scale" \
        --out-dir $OUT --stem scale4b_$tag --no-render --log-dir $OUT/logs_$tag "${@:2}" || echo "$1: exit $?"
    tar czf $OUT/logs_$tag.tgz -C $OUT logs_$tag && rm -rf $OUT/logs_$tag
    trace_end $tag ;;
scale31b)  # remote.sh scale31b [scripts/bench/http_vs_native.py args...]
    [ -f $W/configure.log ] || { echo "$1: no build was started on this machine: run remote.sh start first"; exit 1; }
    S=$W/scale31b
    tree_env
    wait_patched
    # cut at the call's end, the writer leaves no manifest: the next call starts the targets again (the drafter kept)
    { timeout $((560 - SECONDS)) python3 -m pydflash.factory.scale $S --shape gemma4-31b --quant Q4_K_M 2>&1 \
        | grep -v "^\[\|^llama_model_quant" | tail -4; } || true
    [ -f $S/manifest.json ] || { echo "$1: the models are not complete: run $1 again"; exit 0; }
    cp $S/manifest.json $OUT/scale31b_models.json
    scale_budget $1 scale31b 150 "the models (kept for the next call)"
    timeout -s INT -k 30 $left python3 scripts/bench/http_vs_native.py --interleave --ngl -1 --threads 8 \
        "${native_args[@]}" --model $S/target-q4_k_m.gguf \
        --drafter $S/drafter-q8_0.gguf --random-drafter $S/drafter-q8_0.gguf --synth-lens 5 \
        --prompt-vocab 262144 --target-set scale31b --tokens 128 --rounds 2 --clients 1,8 --ctx 512 \
        --only "native-bs,py-plain,py-synth5" \
        --model-label "random-weight Gemma-4-31B-shaped Q4_K_M target; gemma-4-31B-it-DFlash-shaped drafter (Q8_0, fc F16), pydflash.factory.scale --direct" \
        --out-dir $OUT --stem scale31b --no-render --log-dir $OUT/logs_scale31b "${@:2}" || echo "$1: exit $?"
    tar czf $OUT/logs_scale31b.tgz -C $OUT logs_scale31b && rm -rf $OUT/logs_scale31b
    trace_end scale31b ;;
scaleout)  # remote.sh scaleout replicas|split [scripts/bench/scale_out.py args...]
    part=${2:-}
    [ "$part" = replicas ] || [ "$part" = split ] || { echo "scaleout: replicas or split"; exit 1; }
    [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || echo "scaleout: fewer than 2 GPUs: this is the nvidia-h200-x2 kind's job"
    use_build
    if ! python3 -c 'import ray.serve' 2> /dev/null; then  # into the image's venv: pip then skips what it has
        ls $W/raywhl.tar.?? > /dev/null 2>&1 || { echo "scaleout: no Ray here: stage it first (part r0 .. rN)"; exit 1; }
        cat $W/raywhl.tar.?? > $W/raywhl.tar && sha256sum $W/raywhl.tar | cut -c1-64 | diff -q - $W/raywhl.sha256 \
            || { echo "scaleout: the joined Ray wheels are not the packed ones"; exit 1; }
        tar xf $W/raywhl.tar -C $W && python3 -m pip install -q --no-index --find-links $W/raywhl "ray[serve]"
        python3 -c 'import ray, ray.serve; print("ray", ray.__version__)'
    fi
    args=(--part replicas --server-args "-ngl -1" --clients 1,2,4,8,16,32 --rounds 2)
    if [ $part = split ]; then
        S=$W/scale4b
        (cd $W/llama.cpp && cmake --build build -j16 --target ggml-rpc-server > $W/rpc_build.log 2>&1) \
            || { tail -20 $W/rpc_build.log; exit 1; }
        [ -f $S/manifest.json ] || python3 -m pydflash.factory.scale $S --shape qwen3-4b --quant Q4_K_M 2>&1 | tail -2
        use_pristine
        args=(--part split --target $S/target-q4_k_m.gguf --drafter $S/drafter-q8_0.gguf --llama-server $PRISTINE_SERVER
              --split-clients 1,4 --synth-len 5 --rounds 1)
    fi
    left=$((575 - SECONDS))
    echo "scaleout $part: ${left} s left for the benchmark"
    # SIGINT, not TERM: the script's finally blocks stop its servers, Serve and Ray
    timeout -s INT -k 30 $left python3 scripts/bench/scale_out.py "${args[@]}" --out $OUT/scaleout_$part.json "${@:3}" \
        || echo "scaleout $part: exit $?"
    tar czf $OUT/logs_scaleout_$part.tgz -C /tmp $(cd /tmp && ls -d bench-scale-out-* 2> /dev/null) 2> /dev/null || true ;;
esac
