#!/usr/bin/env bash
# Runs the CPU test suite (what CI runs), spread over the cores by pytest-xdist: one worker per core
# (KERNELGRAFT_TEST_WORKERS=N sets another count, 0 runs in this process), a test module's tests on
# one worker (its module fixtures are built once). GPU tests: python -m pytest -m gpu on a CUDA machine.
source "$(dirname "$0")/_env.sh"
exec python -m pytest -q -m "not gpu and not slow" -p no:cacheprovider \
    -n "${KERNELGRAFT_TEST_WORKERS:-auto}" --dist loadscope "$@"
