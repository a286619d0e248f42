# Sourced by scripts/*.sh: creates .venv on first use and installs kernelgraft with what the tests
# and the demo need. Re-installs only when pyproject.toml changes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
STAMP=".venv/.kernelgraft-installed"
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
    # torch 2.13.0, the version the tests target. pip takes the CPU build where one is offered (this
    # project's machines keep it in a local wheel directory, PIP_FIND_LINKS); from PyPI alone, Linux
    # gets the multi-GB CUDA build: set PIP_INDEX_URL=https://download.pytorch.org/whl/cpu to avoid it.
    python -m pip install -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
    python -m pip install -q -e ".[ci]" 2>&1 | grep -v '^WARNING: Location' || true
    python -c "import kernelgraft, torch, triton" 
    echo "$WANT" > "$STAMP"
fi
export TRITON_INTERPRET="${TRITON_INTERPRET:-$(python -c 'import torch; print(0 if torch.cuda.is_available() else 1)')}"
