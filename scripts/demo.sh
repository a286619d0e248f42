#!/usr/bin/env bash
# Runs the demo: the example ops through `kernelgraft check` and a small compiled model.
source "$(dirname "$0")/_env.sh"
exec python -m kernelgraft demo "$@"
