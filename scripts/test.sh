#!/usr/bin/env bash
# Runs the CPU test suite (what CI runs). GPU tests: python -m pytest -m gpu on a CUDA machine.
source "$(dirname "$0")/_env.sh"
exec python -m pytest -q -m "not gpu and not slow" -p no:cacheprovider "$@"
