#!/usr/bin/env bash
# The GPU loop in one call, on the PyTorch engine's serving mode with decode graphs (no vLLM on
# the GPU machines):
# the device's ceilings and the engine's speed against them (benchmarks/engine_ceilings.py), a
# step grid, a calibration, then for each of three request workloads (Poisson, bursty, long
# decodes) a simulation and two live replays, each validated, with the live-vs-live spread
# beside the errors (benchmarks/loop_table.py).
#   scripts/gpu_loop.sh OUT_DIR            on the GPU: a Llama-3.1-8B shape, random weights
#   scripts/gpu_loop.sh OUT_DIR --cpu      on the CPU: the testbed model at a size that measures
#   scripts/gpu_loop.sh OUT_DIR --dry-run  on the CPU: the testbed model, small (the suite runs it)
# Then a Dynasor program workload (chain of thought stopped by certaindex) on the testbed model:
# a probes trace on the engine, the programs live twice (the first calibrates the replica on a
# run of other programs, the second reuses it), each against the simulator's decisions.
# WORKLOADS="long" runs only those. OUT_DIR gets ceilings.json, loop.json, loop.md, traces.tar.gz (grid, calibration, every run)
# and a log per command. Each command has its own time limit, so one that overruns costs its
# own results, not the rest.
set -u
out=${1:?usage: scripts/gpu_loop.sh OUT_DIR [--cpu | --dry-run]}
mode=${2:-}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"
work=$(mktemp -d)
if [ "$mode" = --dry-run ]; then
    export CUDA_VISIBLE_DEVICES=
    model=models/testbed/target-large fmt=auto device=cpu
    ceil="--dry-run" grid="--batch-sizes 1,3 --prompt-tokens 8,48 --output-tokens 6"
    limits="--max-num-seqs 4 --max-num-batched-tokens 64 --max-model-len 256"
    n=10 rate=6 plen="{kind: uniform, low: 8, high: 64}" olen="{kind: uniform, low: 4, high: 16}"
    long="{kind: uniform, low: 24, high: 48}" t=120 graphs=--graphs
    probes="--questions 1 --samples 2 --budget 64" programs=4
elif [ "$mode" = --cpu ]; then
    export CUDA_VISIBLE_DEVICES=
    model=models/testbed/target-large fmt=auto device=cpu
    ceil="--dry-run" grid="--batch-sizes 1,4,8 --prompt-tokens 16,64,200 --output-tokens 8,32"
    limits="--max-num-seqs 8 --max-num-batched-tokens 256 --max-model-len 512"
    n=40 rate=4 plen="{kind: uniform, low: 16, high: 200}" olen="{kind: uniform, low: 16, high: 100}"
    # no decode graphs: on the CPU their static shapes (batch and span padded to buckets) are
    # paid in compute, a step function of the shapes the step-time model does not carry
    long="{kind: uniform, low: 150, high: 250}" t=300 graphs=
    probes="--questions 1 --samples 4 --budget 128" programs=12
else
    model=models/configs/llama-3.1-8b fmt=dummy device=cuda
    ceil="" grid="--batch-sizes 1,4,16,32 --prompt-tokens 64,256,1024 --output-tokens 16,64"
    limits="--max-num-seqs 32 --max-num-batched-tokens 2048 --max-model-len 2048"
    n=60 rate=4 plen="{kind: uniform, low: 64, high: 1024}" olen="{kind: uniform, low: 16, high: 128}"
    long="{kind: uniform, low: 256, high: 512}" t=150 graphs=--graphs
    probes="--questions 2 --samples 4 --budget 256" programs=32
fi

run() {  # NAME SECONDS COMMAND...: one command, its log kept, stopped after SECONDS
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    echo "== $name: rc=$rc, $(($(date +%s) - start)) s"
    tail -c 400 "$out/$name.log"
    echo
    return $rc
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
run ceilings 120 "$py" benchmarks/engine_ceilings.py $ceil --json
tail -n 1 "$out/ceilings.log" > "$out/ceilings.json"
run grid "$t" "$py" -m reasonsim.cli trace steps --engine torch --serving $graphs --model "$model" \
    --load-format "$fmt" $grid $limits -o "$work/grid" --json -q
run calibrate 60 "$py" -m reasonsim.cli calibrate "$work/grid" -o "$work/loop.calib.json" --json
workloads=${WORKLOADS:-poisson bursty long dynasor}
for w in $workloads; do
    [ $w = dynasor ] && continue
    arrival="{kind: poisson, rate_per_s: $rate}" output=$olen
    [ $w = bursty ] && arrival="{kind: gamma, rate_per_s: $rate, cv: 3}"
    [ $w = long ] && output=$long
    cat > "$work/$w.yaml" <<EOF
seed: 7
workload:
  arrival: $arrival
  num_requests: $n
  prompt_tokens: $plen
  output_tokens: $output
cluster:
  replicas:
    - {calibration: $work/loop.calib.json, count: 1}
EOF
    run "sim-$w" 60 "$py" -m reasonsim.cli simulate "$work/$w.yaml" -o "$work/sim-$w" --json
    for r in 1 2; do
        run "live-$w-$r" "$t" "$py" -m reasonsim.cli replay "$work/$w.yaml" -o "$work/live-$w-$r" \
            --device $device --json -q &&
        run "validate-$w-$r" 60 "$py" -m reasonsim.cli validate "$work/sim-$w" "$work/live-$w-$r" \
            -o "$work/validate-$w-$r" --json
    done
done
case " $workloads " in *" dynasor "*)
    testbed=models/testbed/target-large
    run probes 120 "$py" -m reasonsim.cli trace probes --engine torch --device $device \
        --model $testbed $probes --stride 16 -o "$work/probes" --json -q
    dyn() {  # CALIBRATION: the program workload's config
        cat <<EOF
seed: 0
workload:
  programs: {trace: $work/probes, method: cot, count: $programs, rate_per_s: 4,
             policy: {type: certaindex, window: 3, interval_tokens: 32},
             deadline: {base_s: 1.0, slo_scale: 1.0}}
cluster:
  scheduler: dynasor
  replicas: [{calibration: $1, count: 1, max_num_seqs: 8}]
EOF
    }
    dyn $PWD/sim/data/testbed-large-programs-cpu.calib.json > "$work/dynasor-here.yaml"
    run dynasor-1 "$t" "$py" -m reasonsim.cli dynasor replay "$work/dynasor-here.yaml" \
        --engine torch --device $device --calibrate-here -o "$work/dynasor-1" --json &&
    dyn "$work/dynasor-1/calibration/target.calib.json" > "$work/dynasor.yaml" &&
    run dynasor-2 "$t" "$py" -m reasonsim.cli dynasor replay "$work/dynasor.yaml" \
        --engine torch --device $device -o "$work/dynasor-2" --json
esac
"$py" benchmarks/loop_table.py "$out" --json > "$out/loop.json"
"$py" benchmarks/loop_table.py "$out" > "$out/loop.md"
cat "$out/loop.md"
tar czf "$out/traces.tar.gz" -C "$work" . 2>/dev/null
