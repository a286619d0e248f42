#!/usr/bin/env bash
# The oldest legs of the compatibility matrix, on the CPU: a second small venv (.venv-compat) with
# kernelgraft's test tools, torch 2.13.0 and nvidia-cutlass-dsl 4.3.5 (the oldest supported release;
# the main venv, scripts/test.sh, holds the newest: 4.8.1 with quack-kernels and liger-kernel), and
# only the tests marked `cutedsl`. About 5 minutes on 2 cores after a first install of ~2 minutes.
# Re-installs only when this script or pyproject.toml changes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
VENV=.venv-compat
OLDEST_CUTEDSL="${OLDEST_CUTEDSL:-4.3.5}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.installed"
WANT="$(cat pyproject.toml "$0" | sha256sum | cut -d' ' -f1)-$OLDEST_CUTEDSL"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
    "$VENV/bin/python" -m pip install -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
    "$VENV/bin/python" -m pip install -q -e ".[test,cuda]" "nvidia-cutlass-dsl==$OLDEST_CUTEDSL" \
        2>&1 | grep -v '^WARNING: Location' || true
    "$VENV/bin/python" -c "import kernelgraft, cutlass.cute"
    echo "$WANT" > "$STAMP"
fi
export TRITON_INTERPRET=1
exec "$VENV/bin/python" -m pytest -q -m "cutedsl and not gpu and not slow" -p no:cacheprovider \
    -n "${KERNELGRAFT_TEST_WORKERS:-auto}" --dist loadscope "$@"
