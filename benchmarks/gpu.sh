#!/usr/bin/env bash
# GPU benchmark (issue 16), one prepared script for one GPU machine, offline: CUDA and TensorRT in fp32, fp16 and
# INT8 at batch 1 and 32 on the demo models and torchvision resnet18 / mobilenet_v2 (benchmarks/gpu.py does the
# work and writes benchmarks/gpu.json atomically). Finishes in under 8 minutes, installation included: gpu.py gets
# what is left of the budget, and a hard limit stops it (gpu.json then says which cells were cut).
#
# Usage: benchmarks/gpu.sh [--python PATH] [--wheelhouse DIR] [gpu.py options: --budget-s S, --dry-run, --out F]
#   --python PATH     the Python to run in: a path or a command on PATH (default .venv/bin/python)
#   --wheelhouse DIR  first install minreal with its GPU extras from DIR, with no index:
#                     pip install --no-index --find-links DIR '.[gpu,tensorrt]' (into --python's environment;
#                     without --python into a new .venv-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT_S=470          # hard limit of the whole script (7 min 50 s)
MARGIN_S=25          # left for gpu.py to start, write its document and for this script to end
start=$SECONDS
py=""
wheelhouse=""
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python) py="$2"; shift 2 ;;
    --wheelhouse) wheelhouse="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

export OMP_WAIT_POLICY=PASSIVE PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1

if [[ -n "$wheelhouse" ]]; then
  if [[ -z "$py" ]]; then
    python3 -m venv .venv-gpu
    py=.venv-gpu/bin/python
  fi
  "$py" -m pip install --no-index --find-links "$wheelhouse" '.[gpu,tensorrt]'
fi
py=${py:-.venv/bin/python}
# a command name (python3) is looked up on PATH, as a shell would
if [[ "$py" != */* ]] && command -v "$py" >/dev/null; then py=$(command -v "$py"); fi
if [[ ! -x "$py" ]]; then
  echo "gpu.sh: no Python at $py; give --python PATH or --wheelhouse DIR" >&2
  exit 2
fi

left=$(( LIMIT_S - (SECONDS - start) ))
budget=$(( left - MARGIN_S ))
if (( budget < 30 )); then
  echo "gpu.sh: the installation left ${left} s of the ${LIMIT_S} s limit; not enough to benchmark" >&2
  exit 3
fi
# gpu.py's own --budget-s, when given after ours, wins (argparse keeps the last).
exec timeout --signal=TERM --kill-after=10 "$left" "$py" benchmarks/gpu.py --budget-s "$budget" ${args[@]+"${args[@]}"}
