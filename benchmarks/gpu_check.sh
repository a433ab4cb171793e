#!/usr/bin/env bash
# The checks to run when a GPU is lent, in one pass sized for a short lease (about 9 minutes
# after the machine starts). Each step has its own time limit and the results are packed into
# $OUT/gpu.tar after every step, so a step cut short loses only itself:
#   1. the machine and jax's devices;
#   2. bench scale: 10^6 clients, 10^4 per round (issue 34's GPU goal), uniform first;
#   3. bench throughput: the MLP (P = 1000) and the CNN (P = 100) with fixed steps, at the
#      default float32 matmul precision and at bfloat16 (JAX_DEFAULT_MATMUL_PRECISION), each
#      against its own precision's matmul peak (8192-cube product);
#   4. the test suite on the GPU, as far as its limit allows (one line per test in the log);
#   5. bench scale for the strategies with all-client work (CA-Fed, HeteRo-Select), as far as
#      the lease allows.
# The default steps are the canonical workloads' (about 8 minutes in all):
#   info; workloads_cnn: the FEMNIST CNN recipe's whole 1,500 rounds end to end (compile and
#   evaluations included; stand-in data of the published shapes where the files are absent, the
#   row says which), beside FLUTE's 8m22s; workloads_rest: the Shakespeare LSTM and the
#   CIFAR-100 ResNet-18 for a few rounds each, projected from steady rounds as the CPU rows are;
#   conv_choice: the convolution and client parallelism measured for the CNN (patches, XLA's
#   grouped convolution, one client at a time; benchmarks/conv_choice.py); suite_rate: a small
#   suite's cells per second, seeds and grid points batched against one at a time
#   (benchmarks/suite_rate.py).
# GPU_CHECK_STEPS picks and orders the steps (default: "info workloads_cnn conv_choice
# suite_rate workloads_rest"); the earlier checks: scale_uniform, throughput, tests,
# scale_all_client, kernel_ca_fed (CA-Fed's greedy get() at K clients) and scale_ca_fed. GPU_CHECK_DATA: a folder of the real data files for the tests
# (FEDJAX_SEL_DATA_DIR; without it the data tests skip).
# Run from the repository root with the image's jax on PYTHONPATH:
#   OUT=/tmp/out bash benchmarks/gpu_check.sh
# GPU_CHECK_CLIENTS / GPU_CHECK_PER_ROUND / GPU_CHECK_SCALE_S / GPU_CHECK_TP_S / GPU_CHECK_TESTS_S
# and GPU_CHECK_DRY=1 (the workloads on a few rounds, the measurements small) shrink it for a dry
# run on a CPU:
#   GPU_CHECK_DRY=1 OUT=/tmp/out bash benchmarks/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu_check_out}
RES=${GPU_CHECK_RES:-/tmp/gpu_check_res}
PY=${PY:-python3}
K=${GPU_CHECK_CLIENTS:-1000000}
P=${GPU_CHECK_PER_ROUND:-10000}
SCALE_S=${GPU_CHECK_SCALE_S:-120}
TP_S=${GPU_CHECK_TP_S:-70}
TESTS_S=${GPU_CHECK_TESTS_S:-150}
STEPS=${GPU_CHECK_STEPS:-info workloads_cnn conv_choice suite_rate workloads_rest}
DRY=${GPU_CHECK_DRY:-0}
WL_ROUNDS=1500 WL_CLIENTS="" CONV_ARGS="" RATE_ARGS=""
WL_REST="--workload lstm_shakespeare --workload resnet18_cifar100"
if [ "$DRY" = 1 ]; then
    WL_ROUNDS=3 WL_CLIENTS="--clients 60"
    WL_REST="--workload logreg_mnist --rounds 2"  # the step's plumbing: an LSTM round is minutes here
    CONV_ARGS="--per-round 4 --clients 20 --budget 10"
    RATE_ARGS="--task digits --seeds 2 --grid 1 --rounds 2 --clients 20"
fi
mkdir -p "$RES" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
START=$(date +%s)

pack() { tar -C "$RES" -cf "$OUT/gpu.tar" . ; }
step() {  # step SECONDS NAME COMMAND...
    local limit=$1 name=$2
    shift 2
    echo "== $name: start at +$(($(date +%s) - START)) s, limit $limit s"
    timeout "$limit" "$@" 2>&1 | tee "$RES/$name.log"
    echo "== $name: rc=${PIPESTATUS[0]} at +$(($(date +%s) - START)) s"
    pack
}
scale() {  # scale NAME STRATEGY
    step "$SCALE_S" "scale_$1" "$PY" -m fedjax_sel bench scale --strategy "$2" \
        --clients "$K" --per-round "$P" --out "$RES/scale_$1.json"
}
throughput() {  # throughput MODEL PER_ROUND PRECISION
    step "$TP_S" "tp_$1_$3" env JAX_DEFAULT_MATMUL_PRECISION="$3" "$PY" -m fedjax_sel \
        bench throughput --model "$1" --per-round "$2" --mode vmap --work steps \
        --local-steps 10 --batch-size 32 --out "$RES/tp_$1_$3.json"
}

run_step() {
    case $1 in
    info) step 60 info bash -c "nvidia-smi; $PY -c 'import jax, flax, optax, chex; \
print(jax.__version__, flax.__version__, optax.__version__, chex.__version__, jax.devices())'" ;;
    scale_uniform) scale uniform uniform ;;
    throughput)
        throughput mlp 1000 default
        throughput cnn 100 default
        throughput mlp 1000 bfloat16
        throughput cnn 100 bfloat16 ;;
    tests)  # one line per test (-v) and each traceback straight into $OUT as it fails, so a
        # run cut short still names its failures and says why
        step "$TESTS_S" tests env ${GPU_CHECK_DATA:+FEDJAX_SEL_DATA_DIR="$GPU_CHECK_DATA"} \
            FEDJAX_SEL_FAILURE_LOG="$OUT/test_failures.log" \
            "$PY" -m pytest -v -rfEs -n "${GPU_CHECK_WORKERS:-12}" --dist loadfile \
            -p no:cacheprovider --timeout 300 --junitxml "$RES/tests.xml" tests ;;
    workloads_cnn) step 240 workloads_cnn "$PY" -m fedjax_sel bench workloads \
        --workload cnn_femnist --rounds "$WL_ROUNDS" $WL_CLIENTS \
        ${GPU_CHECK_DATA:+--data-dir "$GPU_CHECK_DATA"} --out "$RES/workloads_cnn.json" ;;
    workloads_rest) step 90 workloads_rest "$PY" -m fedjax_sel bench workloads \
        $WL_REST $WL_CLIENTS \
        ${GPU_CHECK_DATA:+--data-dir "$GPU_CHECK_DATA"} --out "$RES/workloads_rest.json" ;;
    conv_choice) step 90 conv_choice "$PY" benchmarks/conv_choice.py $CONV_ARGS \
        --out "$RES/conv_choice.json" ;;
    suite_rate) step 90 suite_rate "$PY" benchmarks/suite_rate.py $RATE_ARGS \
        --out "$RES/suite_rate.json" ;;
    kernel_ca_fed) step 90 kernel_ca_fed "$PY" -m fedjax_sel bench kernels \
        --kernel ca_fed_get --clients "$K" --out "$RES/kernel_ca_fed.json" ;;
    scale_ca_fed) scale ca_fed ca_fed ;;
    scale_all_client)
        scale ca_fed ca_fed
        scale hetero_select hetero_select ;;
    *) echo "unknown step $1" >&2; exit 2 ;;
    esac
}
for s in $STEPS; do run_step "$s"; done
echo "== done at +$(($(date +%s) - START)) s"
