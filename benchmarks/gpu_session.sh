#!/usr/bin/env bash
# One batched run on the GPU machine: installs carried wheels, runs the selected sections with
# time limits, and packs every result into $OUT/results.tar.gz (plus the log).
#   bash benchmarks/gpu_session.sh SECTION...     sections: tests alltests alltests_old firstcall pool diagzygote pretune1 pretune2 pretunecmp core cute hostcost hostcost_ab hostcost_same rmsnorm
#                                                 examples libraries libserve tune tunequick ranks graft graftc graftck graftdc graftdk graftprofile graftdecode graftdecodecompile aot explore explore5 explore6 explore7 diagsoftmax diagtriton native devices verify verify2 firstsec diagsmall diagload diagcopies diagdecode aotipre compete llmquick llm suitetests gputests cpp cppbuild llamaaoti diagsuite test_FILE
# A "0:tests,aot|1:tune,rmsnorm" argument runs lanes side by side, each on its own GPU
# (CUDA_VISIBLE_DEVICES) with its own kernelgraft cache; the next argument starts when all end.
set -uo pipefail
# GPU_SESSION_BUDGET (seconds from the command's start, default 570): steps are cut to end before
# it, so the results are packed before the device tool's 600 s limit kills the command.
export SESSION_END=$(( $(date +%s) + ${GPU_SESSION_BUDGET:-570} ))
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
R="${OUT:-/tmp/out}/r"
mkdir -p "$R"
LOG="${OUT:-/tmp/out}/session.log"
wheels=$(ls .carry/cutedsl/*.whl .carry/cutile/wheels/*.whl .carry/liger/*.whl 2>/dev/null || true)
if [ -n "$wheels" ]; then
    python3 -m pip install -q --no-deps --no-compile --target /tmp/site $wheels >>"$LOG" 2>&1
fi
# The CuTe DSL wheel (59 MB deflated) and the tracked tree no longer fit the 64 MiB carry together:
# it travels as an xz tarball of its unpacked contents (41 MB), which is all a --target install is.
for t in .carry/cutedsl/*.tar.xz; do [ -f "$t" ] && mkdir -p /tmp/site && tar -xJf "$t" -C /tmp/site; done
export PYTHONPATH="/tmp/site/nvidia_cutlass_dsl/python_packages:/tmp/site:$ROOT/src:$ROOT/tests"
if [ -f /tmp/site48/.complete ]; then  # CuTe DSL 4.8.1 and quack, staged by benchmarks/stage_cutedsl48.sh
    export PYTHONPATH="/tmp/site48/nvidia_cutlass_dsl/dsl_packages:/tmp/site48/nvidia_cutlass_dsl/python_packages:/tmp/site48:$ROOT/src:$ROOT/tests"
fi
[ -d .carry/cutile/cubins ] && export KERNELGRAFT_CUTILE_CUBINS="$ROOT/.carry/cutile/cubins"
export KERNELGRAFT_CACHE_DIR=/tmp/kgcache KERNELGRAFT_TEST_INSTAFAIL=1
[ -d .carry/bundle ] && export KERNELGRAFT_TEST_BUNDLE="$ROOT/.carry/bundle"
# every example op, every backend (xz: cubins shrink tenfold): tests/gpu/test_gpu_runtime_all.py
if [ -f .carry/bundle_all.tar.xz ]; then
    tar -xJf .carry/bundle_all.tar.xz -C /tmp && export KERNELGRAFT_TEST_BUNDLE_ALL=/tmp/bundle_all
fi
[ -d .carry/bundle_bench ] && export KERNELGRAFT_BENCH_BUNDLE="$ROOT/.carry/bundle_bench"
section() { echo; echo "=================== $1 ($(date +%T))"; }
step() {  # step NAME SECONDS CMD...
    local name=$1 secs=$2; shift 2
    local left=$(( SESSION_END - $(date +%s) ))
    if [ "$left" -lt 15 ]; then echo "[$name] skipped: the session's budget is spent"; return; fi
    [ "$secs" -gt "$left" ] && secs=$left
    section "$name"
    timeout "$secs" "$@" 2>&1 | tee "$R/$name.txt" | tail -40
    echo "[$name] exit ${PIPESTATUS[0]}"
}
run_section() {
  case $1 in
    tests) for f in $(grep -l "mark.gpu" tests/*/test_*.py); do  # one process per file: a crash costs one file
             n=$(basename "$f" .py)
             step "$n" 150 python3 -m pytest -q -p no:cacheprovider -m gpu "$f" -rs --tb=short -o log_cli=true --log-cli-level=WARNING
           done ;;
    firstcall) step first_call 420 python3 benchmarks/bench_first_call.py --out "$R" ${FIRST_ARGS:-} ;;  # new shapes served while tuning runs off-path
    pool) step compile_pool 200 python3 benchmarks/bench_compile_pool.py --out "$R" ;;
    diagzygote) step diag_compile_zygote 240 python3 benchmarks/diag_compile_zygote.py ${DIAG_ARGS:-} ;;  # the zygote after each example op module, workers with and without GPUs
    pretune1) step pretune_one 560 python3 benchmarks/bench_pretune_suite.py --phase one --out "$R" ${PRETUNE_ARGS:-} ;;  # the 74-shape LLM suite tuned ahead on one GPU (PRETUNE_ARGS="--max-keys N" for a part)
    pretune2) step pretune_two 560 python3 benchmarks/bench_pretune_suite.py --phase two --out "$R" ${PRETUNE_ARGS:-} ;;  # the same on two torchrun ranks (one GPU each where two are lent, else both on GPU 0)
    pretunecmp) step pretune_compare 60 python3 benchmarks/bench_pretune_suite.py --phase compare --out "$R" ${PRETUNE_ARGS:-} ;;  # wall times, the ratio, decisions alike (after pretune1 and pretune2 on one warm machine)  # the GEMM's compile phase, serial against the pool
    core) step host_overhead 120 python3 benchmarks/bench_host_overhead.py --out "$R" ;;
    rmsnorm) step rmsnorm_backends 150 python3 benchmarks/bench_rmsnorm_backends.py --out "$R" ;;
    cute) step backend_host_cost 150 python3 benchmarks/bench_backend_host_cost.py --out "$R"
          step rmsnorm_backends 150 python3 benchmarks/bench_rmsnorm_backends.py --out "$R" ;;
    examples) run_section examples_a; run_section examples_b ;;
    examples_a) step bench_a 420 python3 -m kernelgraft bench kernelgraft.examples.add_relu kernelgraft.examples.rmsnorm kernelgraft.examples.rmsnorm_residual kernelgraft.examples.softmax --json "$R/bench_a.json" --png "$R/bench_a.png" ;;
    examples_b) step bench_b 420 python3 -m kernelgraft bench kernelgraft.examples.swiglu kernelgraft.examples.gemm kernelgraft.examples.fp8_kcache_scatter --json "$R/bench_b.json" --png "$R/bench_b.png" ;;
    explore) step explore 200 python3 research/explore_softmax_fp8.py ;;
    explore5) step explore_round5 200 python3 research/explore_softmax_stream.py ;;
    explore6) step explore_round6 200 python3 research/explore_softmax_regs.py ;;
    explore7) step explore_round7 200 python3 research/explore_softmax_tma.py ;;
    diagtriton) step diag_triton_state_fresh 90 python3 research/diag_triton_state.py --inductor-cache /tmp/ind_diag
                step diag_triton_state_hit 90 python3 research/diag_triton_state.py --inductor-cache /tmp/ind_diag ;;  # what Inductor's first compile changes in Triton's cache key
    diagsoftmax) step diag_softmax_choice 150 python3 research/diag_softmax_choice.py ;;
    native) step native_build 240 python3 -c "from kernelgraft import _native; m = _native.load(); print('native replay:', m.__file__ if m else _native.reason())"
            step test_native 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/integration/test_native.py -rs --tb=short ;;
    hostcost_ab)  # the host-cost bench of this tree and of .carry/old (an older tree), alternating
            step native_build 150 python3 -c "import kernelgraft as kg; print(kg.native.build())"
            for i in 1 2; do
              mkdir -p "$R/old$i" "$R/new$i"
              step host_cost_old_$i 120 env PYTHONPATH="${PYTHONPATH/$ROOT\/src/$ROOT/.carry/old/src}" python3 .carry/old/benchmarks/bench_backend_host_cost.py --out "$R/old$i"
              step host_cost_new_$i 120 python3 benchmarks/bench_backend_host_cost.py --out "$R/new$i"
            done ;;
    hostcost_same)  # hostcost_ab with this tree's bench script for both trees (no compile pool in either; each tree its own cuTile cubins, so both time the same paths)
            step native_build 150 python3 -c "import kernelgraft as kg; print(kg.native.build())"
            for i in 1 2; do
              mkdir -p "$R/old$i" "$R/new$i"
              step host_cost_old_$i 120 env PYTHONPATH="${PYTHONPATH/$ROOT\/src/$ROOT/.carry/old/src}" KERNELGRAFT_CUTILE_CUBINS="$ROOT/.carry/old/cubins" python3 benchmarks/bench_backend_host_cost.py --out "$R/old$i"
              step host_cost_new_$i 120 python3 benchmarks/bench_backend_host_cost.py --out "$R/new$i"
            done ;;
    hostcost) step backend_host_cost 110 python3 benchmarks/bench_backend_host_cost.py --out "$R" ;;
    tunequick) step tune_gemm 120 python3 benchmarks/bench_tune_gemm.py --quick --out "$R" ;;
    tune) step tune_gemm 310 python3 benchmarks/bench_tune_gemm.py --out "$R" ;;
    ranks) step tune_ranks 200 torchrun --nproc_per_node 2 benchmarks/bench_tune_ranks.py --out "$R" ;;
    graft) step graft_llama 240 python3 benchmarks/bench_graft_llama.py --out "$R/graft_llama.json" ;;
    graftprofile) step graft_llama_profile 260 python3 benchmarks/bench_graft_llama.py --profile ${GRAFT_ARGS:-} --out "$R/graft_llama.json" ;;
    graftdecodecompile) step graft_decode_compile 200 python3 benchmarks/bench_graft_llama.py --batch 1 --seq 1 --iters 200 --profile ${GRAFT_ARGS:-} --out "$R/graft_decode.json" ;;
    graftc) step graft_llama 170 python3 benchmarks/bench_graft_llama.py ${GRAFT_ARGS:-} --out "$R/graft_llama.json" ;;  # prefill, no profile
    graftdk) step graft_decode_copies 330 python3 benchmarks/bench_graft_llama.py --batch 1 --seq 1 --iters 200 --compiled-only --copies 7 ${GRAFT_ARGS:-} --out "$R/graft_decode.json" ;;  # decode, 8 plain programs against 7 grafted ones
    graftck) step graft_prefill_copies 330 python3 benchmarks/bench_graft_llama.py --compiled-only --copies 7 ${GRAFT_ARGS:-} --out "$R/graft_llama.json" ;;  # prefill, 8 plain programs against 7 grafted ones
    graftdc) step graft_decode 170 python3 benchmarks/bench_graft_llama.py --batch 1 --seq 1 --iters 200 ${GRAFT_ARGS:-} --out "$R/graft_decode.json" ;;  # decode, no profile
    graftdecode) step graft_decode 200 python3 benchmarks/bench_graft_llama.py --batch 1 --seq 1 --eager-only --iters 300 --out "$R/graft_decode.json" ;;
    aot) step test_gpu_aot 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu_aot.py --tb=short
         step aot_startup 150 python3 benchmarks/bench_aot_startup.py --repeats 3 --out "$R" ;;
    verify) step test_verify 480 python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_verify.py -rs --tb=short --durations=10 ;;  # checks every example (the GEMM's 30 configs take minutes)
    llmquick) step llm_suite_quick 280 python3 benchmarks/bench_llm_suite.py --quick --out "$R" --time-limit 240 ;;  # the LLM shape suite, short
    llm) limit=$(( SESSION_END - $(date +%s) - 60 )); [ "$limit" -gt 500 ] && limit=500  # ends writing its tables in time
         if [ "$limit" -lt 30 ]; then echo "[llm_suite] skipped: the session's budget is spent"
         else step llm_suite 560 python3 benchmarks/bench_llm_suite.py --out "$R" --time-limit "$limit" ${LLM_ARGS:-}; fi ;;
    libraries) step bench_libraries 500 python3 benchmarks/bench_libraries.py --out "$R" --time-limit 460 ${LIB_ARGS:-} ;;  # the library-backed ops vs quack, Liger, torch (LIB_ARGS="--ops rmsnorm,softmax" splits it)
    libserve) step lib_serve_check 560 python3 benchmarks/bench_libraries.py --serve-check --out "$R" --time-limit 540 ${LIB_BUNDLE:+--bundle "$LIB_BUNDLE"} ${SERVE_ARGS:-} ;;  # the C++ runtime serves them where neither library imports (SERVE_ARGS="--ops rmsnorm,softmax" narrows it)
    suitetests) step test_bench_suite 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_bench_suite.py tests/unit/test_example_kernels.py -rs --tb=short ;;
    hostcost_ab1)  # one alternation of hostcost_ab: old tree, then this one
            step native_build 150 python3 -c "import kernelgraft as kg; print(kg.native.build())"
            mkdir -p "$R/old1" "$R/new1"
            step host_cost_old_1 90 env PYTHONPATH="${PYTHONPATH/$ROOT\/src/$ROOT/.carry/old/src}" python3 .carry/old/benchmarks/bench_backend_host_cost.py --out "$R/old1"
            step host_cost_new_1 90 python3 benchmarks/bench_backend_host_cost.py --out "$R/new1" ;;
    gputests) step gpu_tests 300 python3 -m pytest -q -s -p no:cacheprovider -m gpu -rs --tb=short ${GPU_TESTS:-tests/unit/test_bad_input.py tests/integration/test_fuzz.py tests/gpu/test_tune_gpu.py tests/integration/test_compete.py tests/unit/test_bench_suite.py tests/integration/test_check_isolation.py tests/integration/test_graft_pattern_generic.py tests/unit/test_replace.py tests/gpu/test_gpu_core.py tests/gpu/test_gpu_runtime.py} ;;
    cppbuild)  # the runtime, examples/cpp and host_cost built with CMake; run_bundle
      step cpp_build 300 bash -c 'cmake -S benchmarks/cpp -B /tmp/cppbuild -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)")" >/dev/null && cmake --build /tmp/cppbuild -j"$(nproc)" 2>&1 | tail -5'
      step run_bundle 60 env KERNELGRAFT_BUNDLE_ALLOW_NATIVE=1 /tmp/cppbuild/examples/run_bundle "${KERNELGRAFT_TEST_BUNDLE:-.carry/bundle}" ;;
    cpp)  # cppbuild, then the host cost from C++
      run_section cppbuild
      step cpp_host_cost 240 python3 benchmarks/bench_cpp_host_cost.py --build-dir /tmp/cppbuild --out "$R" ;;
    diagcopies) step diag_decode_copies 300 python3 research/diag_decode_copies.py ;;  # why copies of one compiled decode read apart
    diagdecode) step diag_decode_compile 150 python3 research/diag_decode_compile.py ;;  # the compiled grafted decode's host time
    aotipre) step aoti_preflight 300 python3 research/aoti_preflight.py --fstring --llama ;;
    llamaaoti)  # the grafted Llama as an AOTInductor package run by examples/cpp/run_aoti (after cppbuild; aotipre first where Inductor's AOT path is in doubt)
      step build_llama_aoti 260 python3 benchmarks/build_llama_aoti.py --out-dir /tmp/llama_aoti
      step llama_python_warm_start 90 python3 benchmarks/build_llama_aoti.py --out-dir /tmp/llama_aoti --cold-start-only
      step run_aoti 60 /tmp/cppbuild/examples/run_aoti /tmp/llama_aoti/bundle /tmp/llama_aoti/llama.pt2 /tmp/llama_aoti/io.pt --atol 5e-2 --rtol 5e-2 --runs 20 --allow-native
      cp /tmp/llama_aoti/report.json "$R/llama_aoti_report.json" 2>/dev/null ;;
    firstfresh) step first_seconds_fresh 80 python3 benchmarks/bench_first_seconds.py --modes fresh --seconds 30 --gap 2 --skip-decisions --out "$R/fresh30" ;;  # past the moment the extension loads
    diagsmall) step diag_small_shapes 120 python3 research/diag_small_shapes.py ;;
    diagload) step diag_runtime_load 240 python3 research/diag_runtime_load.py "${KERNELGRAFT_TEST_BUNDLE:-.carry/bundle}" ;;  # the runtime's load crash of 2026-12-01
    diagsuite) step diag_suite_tuned 150 python3 research/diag_suite_tuned.py ;;  # the suite's small-shape rows
    compete) step bench_compete 240 python3 benchmarks/bench_compete.py --out "$R" ${COMPETE_ARGS:---limit 2} ;;
    firstsec) step first_seconds 420 python3 benchmarks/bench_first_seconds.py --out "$R" ;;  # 2 GPUs: decisions side by side
    verify2) step test_verify_2gpu 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_verify.py -k not_the_current_one -rs --tb=short ;;  # needs 2 GPUs
    devices) step gpu_devices 300 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/gpu/test_gpu_devices.py -rs --tb=short ;;  # needs 2 GPUs
    alltests_old)  # alltests on the older tree in .carry/old (3bbeaac: its src, tests, pyproject, examples),
      # its own source and tests on the path: the "before" of every GPU test file (results under old/).
      # Its own artifacts only: its tests build their bundles here (this tree's carried bundles are a
      # manifest version it cannot read), and its cuTile cubins are .carry/old/cubins (make_carry.sh)
      # and its bundle (.carry/old/bundle.tar.xz: add_relu and rmsnorm, every backend, built by make_carry.sh)
      ( cd .carry/old && unset KERNELGRAFT_TEST_BUNDLE KERNELGRAFT_TEST_BUNDLE_ALL KERNELGRAFT_BENCH_BUNDLE \
          && export KERNELGRAFT_CUTILE_CUBINS="$ROOT/.carry/old/cubins" \
          && if [ -f bundle.tar.xz ]; then tar -xJf bundle.tar.xz -C /tmp && export KERNELGRAFT_TEST_BUNDLE=/tmp/old_bundle; fi \
          && PYTHONPATH="${PYTHONPATH//$ROOT\/src/$ROOT/.carry/old/src}" \
          && export PYTHONPATH="${PYTHONPATH//$ROOT\/tests/$ROOT/.carry/old/tests}" && R="$R/old" && mkdir -p "$R" \
          && echo "the older tree: $(python3 -c 'import kernelgraft; print(kernelgraft.__file__)')" \
          && TESTS_AT=tests run_section alltests ) ;;
    alltests)  # every file with GPU tests, one process per file, PAR files at a time on this GPU;
      # FILES="test_a test_b" limits it to those, REPEAT=2 runs each file twice in a row (its own process each)
      at="${TESTS_AT:-tests/*}"  # where the test files are (alltests_old: the older tree's flat tests/)
      if [ -n "${FILES:-}" ]; then files=$(for n in $FILES; do ls $at/"$n".py; done)
      else  # the longest files first (from earlier runs), so that none starts last and runs alone
        heavy="test_verify test_cute_backends test_example_kernels test_autograd_routes test_cuda test_fuzz test_bench_suite test_gpu_core test_driver test_tune_offpath test_replace test_compete test_bench test_graft_llama test_check_isolation"
        all=$(grep -l "mark.gpu" $at/test_*.py 2>/dev/null | sort)
        files=$( (for n in $heavy; do echo "$all" | grep "/$n.py$"; done; echo "$all") | awk '!seen[$0]++'); fi
      left=$(( SESSION_END - $(date +%s) - 25 ))
      section "alltests ($(echo "$files" | wc -w) files, ${PAR:-4} at a time, ${REPEAT:-1} runs each, ${left}s)"
      export R FILE_LIMIT="${FILE_LIMIT:-300}" REPEAT="${REPEAT:-1}" TWICE="${TWICE:-}"  # TWICE="test_a": these files twice
      echo "$files" | timeout "$left" xargs -P "${PAR:-4}" -I{} bash -c 'n=$(basename {} .py); reps=$REPEAT
        case " $TWICE " in *" $n "*) reps=2 ;; esac
        for i in $(seq "$reps"); do
          timeout "$FILE_LIMIT" python3 -m pytest -q -p no:cacheprovider -m gpu {} -rs --tb=short --durations=5 > "$R/$n.$i.txt" 2>&1
          code=$?; echo "[$n run $i] exit $code $(tail -1 "$R/$n.$i.txt")"; [ "$code" -eq 0 ] || [ "$code" -eq 5 ] || break
        done'
      echo "[alltests] exit $?"
      for f in $files; do n=$(basename "$f" .py); for i in 1 2; do  # one line per file and run
        [ "$i" -gt "$REPEAT" ] && [ ! -f "$R/$n.$i.txt" ] && continue
        t="$R/$n.$i.txt"; if [ -f "$t" ]; then echo "[summary] $n run $i: $(tail -1 "$t")"; else echo "[summary] $n run $i: not run"; fi
      done; done ;;
    test_*) step "$1" 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/*/"$1".py -rs --tb=short ;;  # one GPU test file (tests/unit, integration or gpu)
    *) echo "unknown section $1" ;;
  esac
}
run_lane() {  # run_lane GPU SECTION,SECTION...
  local gpu=$1 list=$2
  export CUDA_VISIBLE_DEVICES=$gpu KERNELGRAFT_CACHE_DIR=/tmp/kgcache$gpu
  for sec in ${list//,/ }; do run_section "$sec"; done
}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for s in "$@"; do
  if [[ $s == *:* ]]; then
    section "lanes $s"
    IFS='|' read -ra lanes <<<"$s"
    for lane in "${lanes[@]}"; do
      run_lane "${lane%%:*}" "${lane#*:}" >"$R/lane_${lane%%:*}.log" 2>&1 &
    done
    wait
    for lane in "${lanes[@]}"; do echo "--- lane ${lane%%:*}"; grep -E "^\[.*\] exit|^=====" "$R/lane_${lane%%:*}.log"; done
  else
    run_section "$s"
  fi
done
} 2>&1 | tee -a "$LOG"
tar -czf "${OUT:-/tmp/out}/results.tmp.tar.gz" -C "$R" . 2>/dev/null
mv "${OUT:-/tmp/out}/results.tmp.tar.gz" "${OUT:-/tmp/out}/results.tar.gz"
