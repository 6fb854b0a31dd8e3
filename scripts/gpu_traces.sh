#!/usr/bin/env bash
# Record the PyTorch engine's traces on a GPU machine (torch + transformers, no vLLM): the
# testbed models' step grids, exits and greedy speculative decoding, a dummy-weight Llama-3.1-8B
# step grid, and draft/verify times of the Llama-3.1-8B / Llama-3.2-1B shape pair.
#   scripts/gpu_traces.sh OUT_DIR [TAG]     (TAG names the device in the trace names: h100)
# Each trace directory is tarred into OUT_DIR (with its log) as soon as it is written; unpack
# them under traces/data/ and check them with `reasonsim traces check`. The full set needs more
# than one 10-minute device call; QUICK=1 (smaller grids) fits one, ONLY="NAME ..." picks traces
# (NAME as written, e.g. ONLY="qwen2.5-7b-h100 testbed-spec-h100"). GRID=wide: the two 8B shapes
# and the draft over batch 1-64 with 50-ms idle gaps every other cell (one call: on the H200,
# 2026-11-26, Llama reached 47 of 48 cells in its 170 s, Qwen took 166 s, the draft 24 s). On the H200 (2026-11-26)
# QUICK=1 PROFILE=0 took 152 s for five traces; the full draft grid outran 50 s and the full
# Llama-3.1-8B grid did not finish in the ~4 minutes left of that call.
set -u
out=${1:?usage: scripts/gpu_traces.sh OUT_DIR [TAG]}
tag=${2:-h100}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
work=$(mktemp -d)
mkdir -p "$out"

trace() {  # NAME SECONDS REASONSIM-ARGS...: one trace, stopped after SECONDS
    local name=$1 limit=$2 start rc
    shift 2
    case " ${ONLY:-$name} " in *" $name "*) ;; *) return ;; esac  # ONLY="a b": just those
    start=$(date +%s)
    timeout "$limit" "$py" -m reasonsim.cli "$@" -o "$work/$name" --json -q >"$work/$name.log" 2>&1
    rc=$?
    echo "== $name: rc=$rc, $(($(date +%s) - start)) s"
    tail -c 700 "$work/$name.log"
    echo
    tar czf "$out/$name.tar.gz" -C "$work" "$name" "$name.log" 2>/dev/null
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
if [ "${QUICK:-0}" = 1 ]; then  # small grids: a few minutes of device time in all
    [ "${PROFILE:-1}" = 1 ] && for args in "--batch 8 --record-exits" "--model models/configs/llama-3.1-8b --load-format dummy --batch 16 --prompt 256"; do
        "$py" benchmarks/torch_engine_profile.py $args 2>&1 | grep -v -e USDT -e AttentionInterface
    done
    trace "testbed-large-$tag" 90 trace steps --engine torch --model models/testbed/target-large \
        --batch-sizes 1,4,16 --prompt-tokens 32,128,512 --output-tokens 16,64
    trace "testbed-exits-target-large-$tag" 70 trace exits --model models/testbed/target-large \
        --prompts-per-phase 8 --max-tokens 48
    trace "llama-3.1-8b-$tag" 100 trace steps --engine torch --model models/configs/llama-3.1-8b \
        --load-format dummy --batch-sizes 1,16 --prompt-tokens 128,1024 --output-tokens 16,64
    trace "qwen2.5-7b-$tag" 100 trace steps --engine torch --model models/configs/qwen2.5-7b \
        --load-format dummy --batch-sizes 1,16 --prompt-tokens 128,1024 --output-tokens 16,64
    trace "testbed-spec-$tag" 80 trace spec --engine torch --temperatures 0 \
        --target models/testbed/target-large --draft models/testbed/draft
    trace "llama-3.1-8b-spec-3.2-1b-$tag" 120 trace spec --engine torch --temperatures 0 \
        --load-format dummy --target models/configs/llama-3.1-8b \
        --draft models/configs/llama-3.2-1b --batch-sizes 1,4 --questions 4 --max-tokens 48
    exit 0
fi
if [ "${GRID:-}" = wide ]; then  # the 8B shapes over batch 1-64 and prompts to 2048, idle gaps
    trace "llama-3.1-8b-wide-$tag" 170 trace steps --engine torch --model models/configs/llama-3.1-8b \
        --load-format dummy --batch-sizes 1,4,16,64 --prompt-tokens 128,512,2048 \
        --output-tokens 16,64 --idle-ms 0,50
    trace "qwen2.5-7b-wide-$tag" 170 trace steps --engine torch --model models/configs/qwen2.5-7b \
        --load-format dummy --batch-sizes 1,4,16,64 --prompt-tokens 128,512,2048 \
        --output-tokens 16,64 --idle-ms 0,50
    trace "testbed-draft-wide-$tag" 100 trace steps --engine torch --model models/testbed/draft \
        --batch-sizes 1,4,16,64 --prompt-tokens 32,128,512 --output-tokens 16,64 --idle-ms 0,50
    exit 0
fi
if [ "${PROFILE:-1}" = 1 ]; then  # PROFILE=0 skips it (device time for traces)
    "$py" benchmarks/gpu_overheads.py --json
    "$py" benchmarks/gpu_overheads.py --json --batch 64
fi
trace "testbed-large-$tag" 70 trace steps --engine torch --model models/testbed/target-large
trace "testbed-draft-$tag" 120 trace steps --engine torch --model models/testbed/draft
trace "testbed-exits-target-large-$tag" 50 trace exits --model models/testbed/target-large
trace "testbed-exits-target-small-$tag" 40 trace exits --model models/testbed/target-small
trace "llama-3.1-8b-$tag" 270 trace steps --engine torch --model models/configs/llama-3.1-8b \
    --load-format dummy --batch-sizes 1,4,16,64 --prompt-tokens 128,512,2048 \
    --output-tokens 16,64,256
trace "testbed-spec-$tag" 120 trace spec --engine torch --temperatures 0 \
    --target models/testbed/target-large --draft models/testbed/draft
trace "llama-3.1-8b-spec-3.2-1b-$tag" 200 trace spec --engine torch --temperatures 0 \
    --load-format dummy --target models/configs/llama-3.1-8b --draft models/configs/llama-3.2-1b \
    --batch-sizes 1,4,8 --questions 8 --max-tokens 64
trace "qwen2.5-7b-$tag" 270 trace steps --engine torch --model models/configs/qwen2.5-7b \
    --load-format dummy --batch-sizes 1,4,16,64 --prompt-tokens 128,512,2048 \
    --output-tokens 16,64,256
