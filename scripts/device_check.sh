#!/usr/bin/env bash
# Builds and runs every GPU test and benchmark on the GPU machine in one go; logs under $OUT.
# Uses the machine's torch 2.11 and packages (installs nothing); carry .whl for Liger-Kernel.
# DEVICE_BUNDLE=FILE (carried): run the binaries scripts/pack_device_bundle.sh packed on the CPU
# machine instead of building them here (about 300 s of device time saved).
# Usage: scripts/device_check.sh
#          [all|tests|gspo|target|attention|vocab|gemm|train|step|profile|testbed|soak|decode|ab]
# (tests: every GPU test binary of `all`, test_trainer included, and no benchmark; gspo: the GSPO
# policy and logit-row tests and the RL step; target: only the Qwen3 target test and the
# online-target step, scripts/bench_online_target.sh; attention: the block attention test, the
# fused step test, `dspine-bench attention` and attention-check at the recipe's shapes; vocab: the
# fused vocabulary objective's tests, the fused step test and `dspine-bench vocab`; gemm: only
# `dspine-bench gemm` (the step's largest GEMMs, at::mm against each cuBLASLt algorithm); train:
# only dspine-bench and the recipe-size training step with its kernel profile,
# scripts/bench_train.sh; step: the attention, vocabulary, fused-step and fused AdamW tests, then
# the attention, vocabulary, GEMM and training-step benchmarks; profile: only the fused recipe
# step, profiled, its kernels by launching code and its trace; attention and step also run the
# q/k norm + RoPE test; ab: dspine-bench of this tree against that of the tree in .ab-base/,
# runs alternating, scripts/bench_ab.sh, AB_ROUNDS rounds of `dspine-bench AB_ARGS` (default: the
# recipe's replay at A = 1); make .ab-base with `git archive --prefix=.ab-base/ REV | tar -x`
# and carry it; soak: no test, every GSPO ablation variant run to its end on the gpu testbed,
# SOAK_JOBS side by side, scripts/gspo_soak.sh; decode: the decoding tests (captured rounds against
# eager ones, the draft's cache, the target), then real speculative decoding on the gpu testbed at
# batch 1, 16 and 64, greedy and sampled, scripts/bench_decode.sh)
set -uo pipefail
PHASE="${1:-all}"
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/dspine-out}"; mkdir -p "$OUT"
# A runner may bring back only a few files: at exit the logs and tables (*.log, *.md, *.txt) are
# packed into $OUT/logs.tgz in their place; traces stay beside it.
pack_logs() {
  local logs
  mapfile -t logs < <(cd "$OUT" && ls -- *.log *.md *.txt 2>/dev/null)
  ((${#logs[@]})) && tar czf "$OUT/logs.tgz" -C "$OUT" "${logs[@]}" && (cd "$OUT" && rm -f -- "${logs[@]}")
}
trap pack_logs EXIT
BUILD_DIR=build-device
[[ $PHASE != ab || -f .ab-base/CMakeLists.txt ]] ||
  { echo "ab: no .ab-base/: git archive --prefix=.ab-base/ REV | tar -x, then carry .ab-base"; exit 1; }
[[ $PHASE != ab || -z ${DEVICE_BUNDLE:-} ]] ||
  { echo "ab builds both trees here; DEVICE_BUNDLE serves the other phases"; exit 1; }
start=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/device.txt" 2>&1
if compgen -G ".whl/liger_kernel-*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/liger_kernel-*.whl >> "$OUT/device.txt" 2>&1 && export PYTHONPATH=/tmp/site
fi
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
source scripts/gpu_tests.sh
targets=("${gpu_tests[@]}" dspine-bench attention-check)
[[ $PHASE == train || $PHASE == profile || $PHASE == ab || $PHASE == gemm ]] && targets=(dspine-bench)
[[ $PHASE == testbed ]] && targets=(test_qwen3_model_gpu dspine-train dspine-eval)
[[ $PHASE == soak ]] && targets=(dspine-train)
[[ $PHASE == decode ]] && targets=(dspine-train dspine-decode dspine-data test_speculative_decoder_gpu
  test_draft_decoding_gpu test_qwen3_model_gpu test_injection_gate_gpu)
[[ $PHASE == gspo ]] && targets=(test_gspo_policy_gpu test_logit_rows_gpu test_vocab_objective_gpu dspine-bench)
[[ $PHASE == tests ]] && targets=("${gpu_tests[@]}")  # no benchmark binaries
# ab: the base tree builds beside this one, each on half the cores (together about 250 s on the
# H200 machine's 16 cores).
build_jobs=$(nproc)
if [[ $PHASE == ab ]]; then
  build_jobs=$(( (build_jobs + 1) / 2 ))
  { cmake -S .ab-base -B .ab-base/build-device -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" && ninja -C .ab-base/build-device -j "$build_jobs" dspine-bench; } \
    > "$OUT/build_ab_base.log" 2>&1 &
  base_build=$!
fi
if [[ -n ${DEVICE_BUNDLE:-} ]]; then
  # Binaries built on the CPU machine (scripts/pack_device_bundle.sh) instead of a build here:
  # torch's and CUDA's libraries come from this machine's python3, the rest from the bundle.
  rm -rf "$BUILD_DIR" && mkdir -p "$BUILD_DIR" && xz -dc "$DEVICE_BUNDLE" | tar -xf - -C "$BUILD_DIR" ||
    { echo "DEVICE_BUNDLE=$DEVICE_BUNDLE: cannot unpack it"; exit 1; }
  source_dir=$(cat "$BUILD_DIR/source_dir.txt")  # where the tests look for configs and data
  [[ -e $source_dir ]] || { mkdir -p "$(dirname "$source_dir")" && ln -s "$PWD" "$source_dir"; }
  site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  nvidia_libs=$(ls -d "$site"/nvidia/*/lib 2>/dev/null | tr '\n' ':')
  export LD_LIBRARY_PATH="$site/torch/lib:$nvidia_libs/usr/local/cuda/lib64:$PWD/$BUILD_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  missing=$(ldd "$BUILD_DIR"/tests/* "$BUILD_DIR"/bin/* | grep "not found" | sort -u)
  [[ -z $missing ]] || { echo "DEVICE_BUNDLE: libraries not found:"; echo "$missing"; exit 1; }
  echo "bundle unpacked in $(( $(date +%s) - start )) s"
else
  { cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" &&
    ninja -C "$BUILD_DIR" -j "$build_jobs" "${targets[@]}"; } > "$OUT/build.log" 2>&1 ||
    { grep -E -A12 "error|FAILED" "$OUT/build.log" | head -80; exit 1; }
  echo "build ok in $(( $(date +%s) - start )) s"
fi

status=0
# test_dspine_fused_step: the recipe-size fused-vs-reference window (about 2 minutes; a run short
# of device time may pass DSPINE_RECIPE_PARITY=0, and then the test reports it skipped).
export DSPINE_RECIPE_PARITY="${DSPINE_RECIPE_PARITY:-1}"
# The recipe-size DSpine step: fused, reference kernels, accumulation 2, the fused run profiled
# (docs/benchmarks.md, "Training step benchmark"); tables in $OUT/bench_train.md.
train_step() {
  scripts/bench_train.sh "$BUILD_DIR" > "$OUT/bench_train.log" 2>&1 || status=1
  cat "$OUT/bench_train.md" 2>/dev/null || tail -20 "$OUT/bench_train.log"
}
if [[ $PHASE == profile ]]; then
  "$BUILD_DIR/bin/dspine-bench" step --config configs/qwen3-8b-dspine.yaml --steps 3 \
    --set data.source=random --set training.accumulation_steps=1 \
    --profile-trace "$OUT/trace.json" > "$OUT/bench_profile.log" 2>&1 || status=1
  python3 scripts/profile_by_op.py "$OUT/trace.json" > "$OUT/by_op.md" 2>&1 || status=1
  gzip -f "$OUT/trace.json"
  grep -E "^(replay|forward|objective|backward|window) " "$OUT/bench_profile.log"
  head -30 "$OUT/by_op.md"
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
if [[ $PHASE == ab ]]; then
  wait "$base_build" || { grep -E -A12 "error|FAILED" "$OUT/build_ab_base.log" | head -40; exit 1; }
  echo "base build ok at $(( $(date +%s) - start )) s"
  ab_args=()
  if [[ -n ${AB_ARGS:-} ]]; then read -r -a ab_args <<<"-- $AB_ARGS"; fi
  scripts/bench_ab.sh .ab-base/build-device/bin/dspine-bench "$BUILD_DIR/bin/dspine-bench" \
    "${AB_ROUNDS:-3}" "${ab_args[@]}" | tee "$OUT/bench_ab.md"
  status=${PIPESTATUS[0]}
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
if [[ $PHASE == train ]]; then
  train_step
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
# The step's largest GEMMs as ATen runs them and with each algorithm cuBLASLt offers, and the
# project's GEMM beside them.
gemm_bench() {
  "$BUILD_DIR/bin/dspine-bench" gemm > "$OUT/bench_gemm.md" 2>&1 || status=1
  cat "$OUT/bench_gemm.md"
}
if [[ $PHASE == gemm ]]; then
  gemm_bench
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
# The recipe-size RL window beside the supervised replay, with the window's kernel profile
# (docs/benchmarks.md, "GSPO RL step"); from random inputs, no checkpoint.
gspo_rl_step() {
  scripts/bench_gspo_step.sh "$BUILD_DIR" > "$OUT/bench_gspo_step.md" 2>&1 || status=1
  cat "$OUT/bench_gspo_step.md"
}
tests=("${gpu_tests[@]}")
[[ $PHASE == gspo ]] && tests=(test_gspo_policy_gpu test_logit_rows_gpu test_vocab_objective_gpu)
[[ $PHASE == target || $PHASE == testbed ]] && tests=(test_qwen3_model_gpu)
[[ $PHASE == soak ]] && tests=()
[[ $PHASE == decode ]] && tests=(test_speculative_decoder_gpu test_draft_decoding_gpu test_qwen3_model_gpu
  test_injection_gate_gpu)
[[ $PHASE == attention ]] && tests=(test_wgmma_probe_gpu test_block_attention_gpu
  test_qk_norm_rope_gpu test_dspine_fused_step)
[[ $PHASE == vocab ]] && tests=(test_vocab_objective_gpu test_dspine_fused_step test_fused_vocabulary)
[[ $PHASE == step ]] && tests=(test_wgmma_probe_gpu test_block_attention_gpu test_qk_norm_rope_gpu test_vocab_objective_gpu
  test_fused_vocabulary test_injection_residual_gpu test_dspine_fused_step test_kernel_profile_gpu
  test_master_adamw_gpu test_cosine_alignment_gpu test_candidate_scores_gpu)
# test_trainer trains on the device `auto` picks: the GPU here.
for test in "${tests[@]}"; do
  "$BUILD_DIR/tests/$test" > "$OUT/$test.log" 2>&1 || status=1
  echo "$test: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$test.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|fused vs reference|relative error|reference vs reference|max diff" "$OUT/$test.log" | head -40
done
echo "tests done at $(( $(date +%s) - start )) s"
# The gpu testbed (docs/testbed.md): its target made, the supervised start, the acceptance
# evaluation's time with the cached verifier and with one target forward per block (the same τ),
# then scripts/gspo_testbed_ablation.sh's variants $TESTBED_VARIANTS over seeds $TESTBED_SEEDS;
# results.jsonl comes back in $OUT.
if [[ $PHASE == testbed ]]; then
  work=runs/testbed-ablation
  ablation() {
    DSPINE_BUILD_DIR=$BUILD_DIR scripts/gspo_testbed_ablation.sh -s "${TESTBED_SEEDS:-1 2 3}" \
      "$work" "$@" 2>&1 | tee -a "$OUT/ablation.log" || status=1
    cp "$work/results.jsonl" "$OUT/" 2>/dev/null
  }
  ablation  # the target and the supervised start
  echo "testbed ready at $(( $(date +%s) - start )) s"; cat data/testbed-gpu/testbed.json
  [[ ${TESTBED_EVAL_TIMING:-1} == 1 ]] && for verifier in "" --per-block-verifier; do
    "$BUILD_DIR/bin/dspine-eval" --acceptance --json -c configs/testbed-gpu-dspine.yaml \
      -w "$work/start/checkpoints/step-000600" $verifier 2>>"$OUT/eval_timing.log" |
      tee -a "$OUT/eval_timing.txt" || status=1
  done
  read -r -a variants <<<"${TESTBED_VARIANTS:-}"
  ((${#variants[@]})) && ablation "${variants[@]}"
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
# The GSPO soak: results.jsonl of both tables back in $OUT (soak_short.jsonl, soak_full.jsonl).
if [[ $PHASE == soak ]]; then
  DSPINE_BUILD_DIR=$BUILD_DIR scripts/gspo_soak.sh runs/soak "${SOAK_JOBS:-8}" 2>&1 |
    tee "$OUT/soak.log"
  status=${PIPESTATUS[0]}
  for table in short full; do cp "runs/soak/$table/results.jsonl" "$OUT/soak_$table.jsonl" 2>/dev/null; done
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
# Real speculative decoding on the gpu testbed (docs/decoding.md): its table in $OUT/decode.md.
if [[ $PHASE == decode ]]; then
  TRACE_DIR=$OUT scripts/bench_decode.sh "$BUILD_DIR" runs/decode-bench 2>&1 | tee "$OUT/decode.md"
  status=${PIPESTATUS[0]}
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
if [[ $PHASE == tests ]]; then
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
# The block attention of one layer through the autograd op and as kernels alone, then the
# torch-free kernel check (fp64 reference, both instruction sets, timings).
attention_bench() {
  "$BUILD_DIR/bin/dspine-bench" attention > "$OUT/bench_attention.md" 2>&1 || status=1
  cat "$OUT/bench_attention.md"
  "$BUILD_DIR/bin/attention-check" > "$OUT/attention_check.log" 2>&1 || status=1
  grep -E "FAIL|wgmma:|mma.sync:|attention-check:" "$OUT/attention_check.log"
}
if [[ $PHASE == attention ]]; then
  attention_bench
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
online_target_step() {
  scripts/bench_online_target.sh "$BUILD_DIR" > "$OUT/bench_online_target.md" 2>&1 || status=1
  cat "$OUT/bench_online_target.md"
}
# The recipe-size backbone vocabulary terms (docs/model.md, "Fused vocabulary objective").
vocab_bench() {
  "$BUILD_DIR/bin/dspine-bench" vocab > "$OUT/bench_vocab.log" 2>&1 || status=1
  tail -32 "$OUT/bench_vocab.log"
}
if [[ $PHASE == step ]]; then
  attention_bench
  vocab_bench
  gemm_bench
  train_step
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
if [[ $PHASE == vocab ]]; then
  vocab_bench
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
if [[ $PHASE == target ]]; then
  online_target_step
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi
if [[ $PHASE == gspo ]]; then
  gspo_rl_step
  echo "done in $(( $(date +%s) - start )) s, status $status"
  exit $status
fi

scripts/bench_kernels.sh "$BUILD_DIR" "$OUT" > "$OUT/bench_kernels.log" 2>&1 || status=1
grep -E "^\||copy bandwidth" "$OUT/bench_kernels.log" | head -40
"$BUILD_DIR/bin/dspine-bench" gspo --tokens 4096,1048576 --segments 16,1024,65536 --vocab 32768,151936 \
  --logit-rows 16384 > "$OUT/bench_gspo.log" 2>&1 || status=1
cat "$OUT/bench_gspo.log" | head -60
python3 scripts/check_gspo_file.py "$BUILD_DIR/bin/dspine-bench" /tmp/gspo-file > "$OUT/gspo_file.log" 2>&1 || status=1
cat "$OUT/gspo_file.log"
"$BUILD_DIR/bin/dspine-bench" step --config configs/tiny.yaml --set training.device=cuda --steps 6 \
  --profile > "$OUT/bench_step.log" 2>&1 || status=1
head -60 "$OUT/bench_step.log"
gspo_rl_step
online_target_step
attention_bench
vocab_bench
gemm_bench
train_step
echo "done in $(( $(date +%s) - start )) s, status $status"
exit $status
