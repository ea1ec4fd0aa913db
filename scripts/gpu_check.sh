#!/usr/bin/env bash
# GPU check: every training path of nmt on a machine with an NVIDIA GPU, in one run of about
# 8 minutes at most (--budget 480), and a table of what passed (scripts/gpu_check.py,
# benchmarks/gpu_check.py). First the PyTorch version against nmt's floor and the GPU's compute
# capability; then both models in bf16, fp16 and fp32, a resume after SIGKILL, the CTranslate2
# engine on the GPU, torch.compile and two-process DDP. The JSON goes to --out.
#
#   bash scripts/gpu_check.sh                       # or: make gpu-check
#   bash scripts/gpu_check.sh --parts transformer,resume --out outputs/gpu_check/short.json
#   bash scripts/gpu_check.sh --parts quality       # 3 minutes of gpu_quick, BLEU over time
#
# Needs PyTorch (CUDA), numpy, sentencepiece, sacrebleu and tensorboard on the machine. What
# else nmt imports (hydra-core, omegaconf, matplotlib, sacremoses, ...) is installed, without
# network, from the wheels of `make gpu-wheels` (scripts/gpu_wheels/, or NMT_GPU_WHEELS) into
# /tmp/nmt-site (NMT_GPU_SITE), only where this Python lacks them; ctranslate2 too where its
# wheel is in scripts/gpu_wheels/optional/. Multi30k comes from NMT_MULTI30K_MIRROR or
# data/multi30k/. PYTHON picks the interpreter (default python3). Exit status 0: no part failed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
PYTHON=${PYTHON:-python3}
WHEELS=${NMT_GPU_WHEELS:-$HERE/gpu_wheels}
SITE=${NMT_GPU_SITE:-/tmp/nmt-site}
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"

device=cuda
prev=
for arg in "$@"; do
  case "$arg" in
    --device=*) device=${arg#--device=} ;;
    *) if [ "$prev" = --device ]; then device=$arg; fi ;;
  esac
  prev=$arg
done

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "error: cannot run $PYTHON as Python >= 3.10 (set PYTHON to the interpreter to use)" >&2
  exit 2
fi

# Wheels for the packages this Python lacks (a clear error when there are none to install).
if ! needed=$("$PYTHON" "$HERE/gpu_check.py" missing-wheels "$WHEELS"); then
  exit 3
fi
if [ -n "$needed" ]; then
  mapfile -t wheels <<<"$needed"
  echo "installing ${#wheels[@]} wheels from $WHEELS into $SITE" >&2
  if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
      "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade \
      --target "$SITE" "${wheels[@]}"
  else
    "$PYTHON" "$HERE/gpu_check.py" unpack-wheels "$SITE" "${wheels[@]}"
  fi
fi

if ! "$PYTHON" -c 'import torch'; then
  echo "error: $PYTHON cannot import torch: the check needs PyTorch installed" >&2
  exit 4
fi
if [ "$device" != cpu ]; then
  if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "error: torch.cuda.is_available() is False for $PYTHON (--device $device);" \
      "use --device cpu to run the check without a GPU" >&2
    exit 4
  fi
fi

exec "$PYTHON" "$HERE/gpu_check.py" "$@"
