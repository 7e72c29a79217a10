#!/usr/bin/env bash
# One run on a GPU machine that checks and times everything. Each step's log, CSV/JSON and plots
# go to a work folder, packed into $OUT/logs.tgz at the end: keep the run's time limit above the
# longest step's.
#
#   bash bench/gpu_steps.sh STEP... [--parallel STEP...] [--serial STEP...]
#     STEP: see the case list below (env, conformance-*, conformance:IMPL:SHARD, tests-*,
#           tune-c128, bench*, sanitize*, soak*, pytest-bench)
#     --parallel: the steps after it run side by side (correctness only: never time anything
#                 beside other work); --serial (or the end) waits for them, then one by one again.
#
# conformance:IMPL:SHARD splits the catalogue so that its parts run side by side: IMPL is one
# implementation or several joined by '+' (they share the spec's results), SHARD one of core,
# state, verify, medium, large-c4, large-c128, large-rest, errors, v41, graph-small, graph-big, or
# graph-big in three parts that run side by side (graph-medium, graph-large-c4, graph-large-rest).
#
# The steps bench-v41-* also time vLLM's V4.1 kernels through the third-party adapter module
# vllm_v41_adapter (class VllmV41), when its folder is on the caller's PYTHONPATH and $VLLM_REF names its
# rebuilt vLLM files; without it their vLLM rows are skipped with a line and the others run.
# The step bench-vllm times vLLM's V4 kernels through the third-party adapter module
# vllm_adapter (attribute cutedsl) the same way; it needs that module (and $VLLM_REF) to run at all.
#
# The package is used in place (a link named dsv4_compressor on PYTHONPATH), so nothing is
# installed; torch, Triton and CuTe DSL come from the active Python environment ($PYTHON,
# default python3).
set -uo pipefail
OUT="${OUT:-$PWD/out}"
LOGS="$(mktemp -d)"  # packed into $OUT/logs.tgz at the end (a run brings back few files, not many)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
link_dir="$(mktemp -d)"
ln -s "$PWD" "$link_dir/dsv4_compressor"
export PYTHONPATH="$link_dir${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
status=0
parallel=0
# pytest-xdist's test distribution: worksteal (xdist >= 3.2) balances one large test file across
# workers, which loadfile leaves to one worker
DIST="${DIST:-$($PY -c 'import xdist; print("worksteal" if tuple(map(int, xdist.__version__.split(".")[:2])) >= (3, 2) else "loadfile")' 2>/dev/null || echo loadfile)}"
running=()

run_step() {  # run_step NAME SECONDS COMMAND...: run with a time limit into NAME.log, exit status into NAME.rc
  local name="$1" limit="$2"; shift 2
  echo "$(date -u +%H:%M:%S) limit ${limit}s: $*" > "$LOGS/$name.log"
  timeout "$limit" "$@" >> "$LOGS/$name.log" 2>&1
  echo $? > "$LOGS/$name.rc"
}

report_step() {  # report_step NAME LINES: the end of its log and its exit status
  local rc; rc="$(cat "$LOGS/$1.rc" 2>/dev/null || echo missing)"
  tail -n "$2" "$LOGS/$1.log"
  echo "=== $1: exit $rc"
  [ "$rc" = 0 ] || status=1
}

step() {  # step NAME SECONDS COMMAND...: now, or in the background after --parallel
  local name="$1"
  echo "=== $name ($(date -u +%H:%M:%S), limit ${2}s): ${*:3}"
  if [ "$parallel" = 1 ]; then
    run_step "$@" & running+=("$name")
  else
    run_step "$@"; report_step "$name" 40
  fi
}

join_parallel() {  # wait for the background steps, then report each
  [ "${#running[@]}" -gt 0 ] || return 0
  wait
  echo "=== parallel steps done at $(date -u +%H:%M:%S)"
  for name in "${running[@]}"; do report_step "$name" "${PARALLEL_TAIL:-6}"; done
  running=()
}

shard_args() {  # shard_args SHARD: the conformance arguments of one part of the catalogue
  case "$1" in
    core) echo "--scenarios c4_* c128_* tiny_amax huge_values equal_scores spread_scores signed_zeros subnormal_kv inactive_tokens non_boundary_slots fp8_per_tensor_saturation --model v4 --no-errors" ;;
    state) echo "--scenarios state_* --model v4 --no-errors" ;;
    verify) echo "--scenarios verify_* indexer_* rollback_* --model v4 --no-errors" ;;
    medium) echo "--scenarios medium_* --model v4 --no-errors" ;;
    large-c4) echo "--scenarios large_c4_decode_16384 large_c4_mixed large_c4_bf16_layout large_c4_positions_2e22 --model v4 --no-errors" ;;
    large-c128) echo "--scenarios large_c128_* --model v4 --no-errors" ;;
    large-rest) echo "--scenarios large_c4_offsets_beyond_2e31 large_state_* --model v4 --no-errors" ;;
    errors) echo "--errors-only --model all" ;;
    v41) echo "--model v4.1 --size all --no-errors" ;;
    graph-small) echo "--graph --size small" ;;
    graph-big) echo "--graph --scenarios medium_* large_*" ;;
    graph-medium) echo "--graph --scenarios medium_*" ;;
    graph-large-c4) echo "--graph --scenarios large_c4_*" ;;
    graph-large-rest) echo "--graph --scenarios large_c128_* large_state_*" ;;
    *) return 1 ;;
  esac
}

for s in "$@"; do
  case "$s" in
    --parallel)
      parallel=1 ;;
    --serial)
      join_parallel; parallel=0 ;;
    conformance:*:*)
      IFS=: read -r _ impls shard <<< "$s"
      if ! args="$(shard_args "$shard")"; then echo "unknown shard $shard in $s"; status=1; continue; fi
      impl_args=(); IFS=+ read -ra names <<< "$impls"; for n in "${names[@]}"; do impl_args+=(--impl "$n"); done
      set -f; step "conformance-$impls-$shard" "${SHARD_LIMIT:-420}" $PY -m dsv4_compressor conformance "${impl_args[@]}" $args --json "$LOGS/conformance-$impls-$shard.json"; set +f ;;
    conformance-runs:*)  # the split kernels and the step call's save on runs of tokens from T = 2 (every block size)
      shard="${s#conformance-runs:}"
      if ! args="$(shard_args "$shard")"; then echo "unknown shard $shard in $s"; status=1; continue; fi
      variants=dsv4_compressor.impl.cutedsl.variants
      set -f; step "$s" "${SHARD_LIMIT:-420}" $PY -m dsv4_compressor conformance --impl $variants:split_generic_runs $args --json "$LOGS/conformance-runs-$shard.json"; set +f ;;
    env)
      step env 60 bash -c "nvidia-smi; $PY -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'; $PY -c 'import cutlass; print(\"cutlass\", cutlass.__version__)'; git log -1 --format=%H 2>/dev/null || true" ;;
    conformance-triton)
      step conformance-triton 400 $PY -m dsv4_compressor conformance --impl triton --size all ;;
    conformance-cutedsl)
      step conformance-cutedsl 280 $PY -m dsv4_compressor conformance --impl cutedsl --size all ;;
    conformance-triton-small)
      step conformance-triton-small 200 $PY -m dsv4_compressor conformance --impl triton --size small ;;
    conformance-cutedsl-small)
      step conformance-cutedsl-small 110 $PY -m dsv4_compressor conformance --impl cutedsl --size small ;;
    conformance-both-big)
      step conformance-both-big 130 $PY -m dsv4_compressor conformance --impl cutedsl --impl triton --scenarios 'medium_*' 'large_*' --no-errors ;;
    host-time)
      step host-time 240 $PY -m dsv4_compressor.bench.host_time --ratio 4 128 --sizes 1 8 64 256 1024 ;;
    bench-main)
      step bench-main 280 $PY -m dsv4_compressor bench --trials 3 --out "$LOGS" ;;
    conformance-both)
      step conformance-both 500 $PY -m dsv4_compressor conformance --impl triton --impl cutedsl --size all ;;
    tests-gpu)
      step tests-gpu 480 $PY -m pytest -p no:cacheprovider -q -m gpu ;;
    tests-triton)
      step tests-triton 300 $PY -m pytest -p no:cacheprovider -q -m gpu impl/triton/tests ;;
    tests-floors)
      step tests-floors 120 $PY -m pytest -p no:cacheprovider -q -m gpu bench/tests/test_floor_kernels.py ;;
    bench-eager)
      step bench-eager 200 $PY -m dsv4_compressor bench --mode eager --sizes 1 64 1024 --impl cutedsl --trials 3 --tag eager --out "$LOGS" ;;
    bench-eager-bound)
      step bench-eager-bound 300 $PY -m dsv4_compressor bench --mode eager --sizes 1 64 1024 --impl cutedsl --impl cutedsl-bound --trials 3 --tag eager-bound --out "$LOGS" ;;
    host-time-bound)
      step host-time-bound 240 $PY -m dsv4_compressor.bench.host_time --ratio 4 128 --sizes 1 64 1024 ;;
    tests-bound)
      step tests-bound 400 $PY -m pytest -p no:cacheprovider -q -m gpu impl/cutedsl/tests/test_cutedsl_bound_gpu.py ;;
    tests-handoff)
      step tests-handoff 200 $PY -m pytest -p no:cacheprovider -q -m gpu impl/cutedsl/tests -k handoff ;;
    tests-early)
      step tests-early 200 $PY -m pytest -p no:cacheprovider -q -m gpu impl/cutedsl/tests -k "early or pdl_chain or handoff" ;;
    conformance-early)
      step conformance-early 300 $PY -m dsv4_compressor conformance --impl dsv4_compressor.impl.cutedsl.variants:early_metadata --size all ;;
    bench-early)
      step bench-early 300 $PY -m dsv4_compressor bench --ratio 128 --mode graph --sizes 1 8 16 32 64 128 256 1024 8192 --extra --impl cutedsl --impl cutedsl-early_metadata --impl cutedsl-split_block8 --impl cutedsl-split_block8+early_metadata=True --trials 3 --tag c128-early --out "$LOGS" ;;
    bench-c128-fourth)
      step bench-c128-fourth 240 $PY -m dsv4_compressor bench --ratio 128 --mode graph --sizes 1 8 16 32 64 96 128 256 1024 1056 1100 8192 --extra --impl cutedsl --impl cutedsl-split_block8 --impl cutedsl-fused_handoff --impl cutedsl-early_metadata --trials 3 --tag c128-fourth --out "$LOGS" ;;
    tests-combined)
      step tests-combined 150 $PY -m pytest -p no:cacheprovider -q -m gpu impl/cutedsl/tests -k "pdl_chain or save_and" ;;
    probe-pairs)
      step probe-pairs 240 $PY -m dsv4_compressor.bench.probe pairs --sizes 1 8 32 64 128 1024 ;;
    tests-cutedsl)
      step tests-cutedsl 240 $PY -m pytest -p no:cacheprovider -q -m gpu impl/cutedsl/tests ;;
    bench)
      step bench 500 $PY -m dsv4_compressor bench --out "$LOGS" ;;
    bench-triton)
      step bench-triton 300 $PY -m dsv4_compressor bench --impl triton --tag triton --out "$LOGS" ;;
    bench-extra)
      step bench-extra 200 $PY -m dsv4_compressor bench --extra --sizes 1 64 1024 --trials 3 --tag extra --out "$LOGS" ;;
    conformance-cluster16)
      step conformance-cluster16 200 $PY -m dsv4_compressor conformance --impl dsv4_compressor.impl.cutedsl.variants:cluster16 --size all ;;
    tune-c128)
      step tune-c128 240 $PY -m dsv4_compressor.bench.cutedsl_tune --ratio 128 --sizes 1 8 32 64 128 256 1024 8192 --settings fused_cluster fused_cluster+cluster.tile=64 fused_cluster+cluster.tile=32 fused_cluster+cluster.warps=16 fused_cluster+cluster.kv_in_smem=False split_block8 ;;
    conformance-nopdl)
      step conformance-nopdl 300 $PY -m dsv4_compressor conformance --impl dsv4_compressor.impl.cutedsl.variants:nopdl --size all ;;
    conformance-handoff)
      step conformance-handoff 300 $PY -m dsv4_compressor conformance --impl dsv4_compressor.impl.cutedsl.variants:fused_handoff --impl dsv4_compressor.impl.cutedsl.variants:nopdl --size all ;;
    probe-c4-floor)
      step probe-c4-floor 200 $PY -m dsv4_compressor.bench.probe c4-floor --head 512 --sizes 1 8 32 64 128 256 1024 2048 16384 ;;
    probe-floor)
      step probe-floor 240 $PY -m dsv4_compressor.bench.probe floor --sizes 1 8 32 64 128 256 1024 ;;
    probe-variants)
      step probe-variants 300 $PY -m dsv4_compressor.bench.probe variants --sizes 1 8 16 32 64 128 256 512 1024 8192 --variants nopdl fused_cluster fused_handoff fused_handoff+handoff_kv_after_max=False cluster16 cluster8 split_block8 ;;
    probe-noexp)
      step probe-noexp 180 $PY -m dsv4_compressor.bench.probe no-exp --sizes 1 32 64 128 1024 --variants cluster16 cluster8 split_block8 ;;
    tune-pipelined)
      step tune-pipelined 300 $PY -m dsv4_compressor.bench.cutedsl_tune --ratio 128 --sizes 1 8 32 64 128 256 1024 8192 --mixed --trials 3 --settings fused_pipelined fused_pipelined+pipelined_ctas_per_sm=2 fused_pipelined+pipelined_max_clusters=16 fused_handoff split_block8 ;;
    tests-pipelined)
      step tests-pipelined 240 $PY -m pytest -p no:cacheprovider -q -m gpu impl/cutedsl/tests/test_cutedsl_pipelined_gpu.py impl/cutedsl/tests/test_cutedsl_graphs_gpu.py impl/cutedsl/tests/test_cutedsl_paths_gpu.py -k "pipelined or graph or pdl or grid" -s ;;
    bench-c128-pipelined)
      step bench-c128-pipelined 260 $PY -m dsv4_compressor bench --ratio 128 --mode graph --sizes 1 8 32 64 128 256 1024 2048 8192 16374 --extra --impl cutedsl --impl cutedsl-fused_pipelined --impl cutedsl-fused_pipelined+pipelined_ctas_per_sm=2 --impl cutedsl-split_block8 --trials 3 --tag c128-pipelined --out "$LOGS" ;;
    bench-c128-final)
      step bench-c128-final 170 $PY -m dsv4_compressor bench --ratio 128 --mode graph --sizes 1 8 16 32 64 128 256 1024 8192 --extra --impl cutedsl --impl cutedsl-split_block8 --impl cutedsl-fused_handoff --trials 3 --tag c128-final3 --out "$LOGS" ;;
    bench-c128-third)
      step bench-c128-third 400 $PY -m dsv4_compressor bench --ratio 128 --mode graph --sizes 1 2 4 8 16 32 64 128 256 512 1024 8192 16374 --impl triton --impl cutedsl --impl cutedsl-nopdl --impl cutedsl-fused_handoff --impl cutedsl-fused_handoff+handoff_kv_after_max=False --impl cutedsl-split_block8 --impl cutedsl-cluster8 --trials 3 --tag c128-third --out "$LOGS" ;;
    bench-c4-third)
      step bench-c4-third 200 $PY -m dsv4_compressor bench --ratio 4 --sizes 1 128 1024 16384 --impl triton --impl cutedsl --impl cutedsl-nopdl --extra --trials 3 --tag c4-third --out "$LOGS" ;;
    ncu-cluster8-64|ncu-cluster16-1|ncu-split_block8-64|ncu-step512|ncu-indexer16384|ncu-pipelined16374|ncu-block816374|ncu-c4-1024|ncu-c4-128)
      case "$s" in  # profile-one's arguments: the case, its tokens, the variant
        ncu-cluster8-64) args="--case c128_decode --tokens 64 --variant cluster8" ;;
        ncu-cluster16-1) args="--case c128_decode --tokens 1 --variant cluster16" ;;
        ncu-split_block8-64) args="--case c128_decode --tokens 64 --variant split_block8" ;;
        ncu-step512) args="--case c128_decode_step --tokens 512 --variant auto" ;;
        ncu-indexer16384) args="--case indexer_fp8 --tokens 16384 --variant auto" ;;
        ncu-pipelined16374) args="--case c128_decode --tokens 16374 --variant fused_pipelined" ;;
        ncu-block816374) args="--case c128_decode --tokens 16374 --variant split_block8" ;;
        ncu-c4-1024) args="--case c4_decode --tokens 1024 --variant auto" ;;
        ncu-c4-128) args="--case c4_decode --tokens 128 --variant auto" ;;
      esac
      step "$s" 150 ncu --clock-control none --profile-from-start off --target-processes all --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats $PY -m dsv4_compressor.bench.probe profile-one $args ;;
    tests-indexer-cutedsl)
      step tests-indexer-cutedsl 300 $PY -m pytest -p no:cacheprovider -q -m gpu impl/cutedsl/tests/test_cutedsl_indexer_gpu.py ;;
    bench-indexer-cutedsl)
      step bench-indexer-cutedsl 400 $PY -m dsv4_compressor bench --head 128 --mode graph --extra --impl triton --impl cutedsl --impl cutedsl-indexer_c4_w1 --trials 3 --tag indexer-cutedsl --out "$LOGS" ;;
    bench-indexer-host)
      step bench-indexer-host 300 $PY -m dsv4_compressor bench --head 128 --mode eager --sizes 1 64 1024 --impl triton --impl triton-op --impl cutedsl --impl cutedsl-bound --impl cutedsl-op --trials 3 --tag indexer-host --out "$LOGS" ;;
    tests-host)
      step tests-host 300 $PY -m pytest -p no:cacheprovider -q -m gpu impl/cutedsl/tests/test_cutedsl_pipelined_gpu.py impl/cutedsl/tests/test_cutedsl_bound_gpu.py -s ;;
    bench-vllm)  # the C128 and C4 sweeps and serving steps beside vLLM's own kernels (vllm_adapter on PYTHONPATH)
      step bench-vllm 420 $PY -m dsv4_compressor bench --ratio 128 --ratio 4 --mode graph --extra --impl cutedsl --impl cutedsl-split_block8 --impl triton --impl vllm_adapter:cutedsl --baseline vllm_adapter:cutedsl --trials 2 --tag vllm --out "$LOGS" ;;
    bench-c128-c4)
      step bench-c128-c4 240 $PY -m dsv4_compressor bench --ratio 128 --ratio 4 --mode graph --sizes 1 8 32 64 128 256 1024 2048 8192 16374 --extra --impl cutedsl --impl cutedsl-split_block8 --trials 3 --tag c128-c4 --out "$LOGS" ;;
    tests-timing)
      step tests-timing 200 $PY -m pytest -p no:cacheprovider -q -m gpu bench/tests/test_timing.py ;;
    bench-c128-c4-sets4)
      step bench-c128-c4-sets4 200 $PY -m dsv4_compressor bench --ratio 128 --ratio 4 --mode graph --sizes 1 8 32 64 128 256 1024 --impl cutedsl --sets 4 --trials 3 --tag c128-c4-sets4 --out "$LOGS" ;;
    bench-indexer-sets4)
      step bench-indexer-sets4 200 $PY -m dsv4_compressor bench --head 128 --mode graph --sizes 1 8 32 128 256 512 1024 2048 4096 --impl triton --impl cutedsl --sets 4 --trials 3 --tag indexer-sets4 --out "$LOGS" ;;
    probe-indexer-floor)
      step probe-indexer-floor 200 $PY -m dsv4_compressor.bench.probe indexer-floor --sizes 1 8 32 128 1024 4096 16384 ;;
    conformance-graph)
      step conformance-graph 590 $PY -m dsv4_compressor conformance --impl triton --impl cutedsl --graph ;;
    conformance-graph-small)
      step conformance-graph-small 590 $PY -m dsv4_compressor conformance --impl triton --impl cutedsl --graph --size small ;;
    conformance-graph-big)
      step conformance-graph-big 590 $PY -m dsv4_compressor conformance --impl triton --impl cutedsl --graph --scenarios 'medium_*' 'large_*' ;;
    conformance-graph-variants)
      step conformance-graph-variants 590 $PY -m dsv4_compressor conformance --impl dsv4_compressor.impl.cutedsl.variants:fused_handoff --impl dsv4_compressor.impl.cutedsl.variants:fused_pipelined --impl dsv4_compressor.impl.cutedsl.variants:nopdl --impl dsv4_compressor.impl.cutedsl.variants:early_metadata --graph --size small ;;
    sanitize)
      step sanitize 3000 $PY -m dsv4_compressor.conformance.sanitize --logs "$LOGS" ;;
    sanitize-memcheck|sanitize-racecheck|sanitize-synccheck|sanitize-initcheck)
      step "$s" "${SANITIZE_LIMIT:-590}" $PY -m dsv4_compressor.conformance.sanitize --tools "${s#sanitize-}" --logs "$LOGS" ;;
    tests-serving)
      step tests-serving 400 $PY -m pytest -p no:cacheprovider -q -m gpu conformance/tests/test_graphs_gpu.py ;;
    conformance-v41)
      step conformance-v41 500 $PY -m dsv4_compressor conformance --impl triton --impl cutedsl --model v4.1 --size all ;;
    conformance-states)
      step conformance-states 500 $PY -m dsv4_compressor conformance --impl triton --impl cutedsl --scenarios 'state_*' 'medium_state_*' 'large_state_*' --no-errors ;;
    tests-v41)
      step tests-v41 500 $PY -m pytest -p no:cacheprovider -q -m gpu impl/triton/tests/test_triton_v41.py impl/cutedsl/tests/test_cutedsl_v41_gpu.py integrations/tests/test_vllm_v41_adapter.py ;;
    tests-states)
      step tests-states 500 $PY -m pytest -p no:cacheprovider -q -m gpu impl/triton/tests/test_triton_state_formats.py impl/cutedsl/tests/test_cutedsl_state_formats_gpu.py impl/cutedsl/tests/test_cutedsl_step_gpu.py integrations/tests/test_vllm_ring_adapter.py ;;
    tests-cutedsl-split-v41)  # the split paths, the saves, SPEC §13's formats and step call, and V4.1, CuTe DSL
      step tests-cutedsl-split-v41 "${TESTS_LIMIT:-400}" $PY -m pytest -p no:cacheprovider -q -n "${WORKERS:-4}" --dist "$DIST" -m gpu impl/cutedsl/tests/test_cutedsl_step_gpu.py impl/cutedsl/tests/test_cutedsl_state_formats_gpu.py impl/cutedsl/tests/test_cutedsl_paths_gpu.py impl/cutedsl/tests/test_cutedsl_save_gpu.py impl/cutedsl/tests/test_cutedsl_v41_gpu.py ;;
    bench-state-runs)  # the step call and the two calls with the split kernels' runs (default), none, and other thresholds
      step bench-state-runs 300 $PY -m dsv4_compressor.bench.steps state --cases serving --ratio 128 --mode graph --impl cutedsl --impl cutedsl-split_generic+split_runs=1073741824 --impl cutedsl-split_generic --trials 2 --tag c128-runs --out "$LOGS" ;;
    bench-state-dense-runs)
      step bench-state-dense-runs 300 $PY -m dsv4_compressor.bench.steps state --cases dense --ratio 128 --mode graph --sizes 64 1024 4096 16374 --impl cutedsl --impl cutedsl-split_generic+split_runs=1073741824 --trials 2 --tag dense-runs --out "$LOGS" ;;
    ncu-step-call)  # each kernel of SPEC §13's step call and of the two calls on the C128 serving steps, under ncu
      step ncu-step-call 240 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum $PY -m dsv4_compressor.bench.steps state --cases serving --ratio 128 --state-dtype fp32 --impl cutedsl --profile ;;
    soak-small)  # the small engine: light steps, so that a few minutes make about 10^5 layer steps
      minutes="${SOAK_MINUTES:-5.5}"
      step soak-small "$(awk -v m="$minutes" 'BEGIN { print int(m * 60) + 120 }')" $PY -m dsv4_compressor soak --size small --minutes "$minutes" --json "$LOGS/soak-small.json" ;;
    soak)
      step soak 540 $PY -m dsv4_compressor soak --minutes 6 --json "$LOGS/soak.json" ;;
    tests-bench-steps)
      step tests-bench-steps 200 $PY -m pytest -p no:cacheprovider -q bench/tests/test_bench_steps.py bench/tests/test_bench_steps_gpu.py ;;
    state-memory)
      step state-memory 60 $PY -m dsv4_compressor.bench.steps memory ;;
    bench-state-c128)  # both kernel families, each beside CuTe DSL's save + compress
      step bench-state-c128 300 $PY -m dsv4_compressor.bench.steps state --cases serving --ratio 128 --mode graph --impl cutedsl --impl triton --trials 2 --tag c128 --out "$LOGS" ;;
    bench-state-c4)
      step bench-state-c4 240 $PY -m dsv4_compressor.bench.steps state --cases serving --ratio 4 --mode graph --impl cutedsl --impl triton --trials 2 --tag c4 --out "$LOGS" ;;
    bench-state-dense)
      step bench-state-dense 300 $PY -m dsv4_compressor.bench.steps state --cases dense --mode graph --sizes 1 64 1024 2048 4096 16374 --impl cutedsl --impl triton --trials 2 --tag dense --out "$LOGS" ;;
    bench-v41-r1-fp32|bench-v41-r1-bf16|bench-v41-r2-fp32|bench-v41-r2-bf16)
      case "$s" in  # the ratio and the kv / score dtype; every small size rotates thousands of input sets
        bench-v41-r1-fp32) args="--ratio 1 --input-dtype fp32" ;;
        bench-v41-r1-bf16) args="--ratio 1 --input-dtype bf16" ;;
        bench-v41-r2-fp32) args="--ratio 2 --input-dtype fp32" ;;
        bench-v41-r2-bf16) args="--ratio 2 --input-dtype bf16" ;;
      esac
      step "$s" "${V41_LIMIT:-240}" $PY -m dsv4_compressor.bench.steps v41 $args --cases sweeps steps --mode graph --sizes 1 8 64 512 4096 16384 --impl cutedsl --impl triton --impl triton-split --impl vllm_v41_adapter:VllmV41 --trials 2 --tag "${s#bench-}" --out "$LOGS" ;;
    bench-v41-eager)
      step bench-v41-eager 200 $PY -m dsv4_compressor.bench.steps v41 --ratio 1 2 --input-dtype fp32 --cases sweeps --mode eager --sizes 1 64 1024 --impl cutedsl --impl triton --impl vllm_v41_adapter:VllmV41 --trials 2 --tag v41-eager --out "$LOGS" ;;
    bench-v41-index-key)
      step bench-v41-index-key "${V41_LIMIT:-200}" $PY -m dsv4_compressor.bench.steps v41 --cases index-key --ratio 2 --mode graph --sizes 1 16 256 4096 16384 --impl cutedsl --impl triton --impl vllm_v41_adapter:VllmV41 --trials 2 --tag index-key --out "$LOGS" ;;
    tests-gpu-triton)
      step tests-gpu-triton "${TESTS_LIMIT:-420}" $PY -m pytest -p no:cacheprovider -q -n "${WORKERS:-8}" --dist "$DIST" -m gpu --durations=15 impl/triton/tests docs/tests bench/tests ;;
    tests-gpu-cutedsl)
      step tests-gpu-cutedsl "${TESTS_LIMIT:-420}" $PY -m pytest -p no:cacheprovider -q -n "${WORKERS:-8}" --dist "$DIST" -m gpu --durations=15 impl/cutedsl/tests conformance/tests integrations/tests ;;
    soak-5)  # the limit leaves two minutes for the soak's set-up (about 40 s on a busy machine) and its report
      minutes="${SOAK_MINUTES:-5.2}"
      step soak-5 "${SOAK_LIMIT:-$(awk -v m="$minutes" 'BEGIN { print int(m * 60) + 120 }')}" $PY -m dsv4_compressor soak --minutes "$minutes" --json "$LOGS/soak-5.json" ;;
    host-time-eager)
      step host-time-eager 70 $PY -m dsv4_compressor.bench.host_time --ratio 128 4 --sizes 1 64 1024 --calls 1000 ;;
    pytest-bench)
      step pytest-bench 200 $PY -m pytest -p no:cacheprovider -q bench --benchmark-json "$LOGS/pytest-bench.json" ;;
    *)
      echo "unknown step $s"; status=1 ;;
  esac
done
join_parallel
tar czf "$OUT/logs.tgz" -C "$LOGS" .
echo "packed $(ls "$LOGS" | wc -l) files into $OUT/logs.tgz"
exit $status
