#!/usr/bin/env bash
# nvidia-cutlass-dsl 4.8.1 with quack-kernels on the GPU machine, staged over two calls of one warm
# machine: its wheels (about 92 MB compressed) and the tree do not fit one call's 64 MiB carry.
#
#   here:   bash benchmarks/stage_cutedsl48.sh pack
#           -> .carry48/ (ignored): part1_ir.tar.xz (52 MB: the DSL's one large shared library),
#              part2_rest.tar.xz (15 MB: the rest of the DSL, unpacked), the cp312 wheels of
#              quack-kernels, liger-kernel, apache-tvm-ffi, torch-c-dlpack-ext
#   call 1: carry [".carry48/part1_ir.tar.xz"]; command: bash benchmarks/stage_cutedsl48.sh unpack1
#   call 2, while the machine is warm (it keeps /tmp between calls; idle_release_s after a call):
#           carry [".carry48/part2_rest.tar.xz", ".carry48/wheels"]; command:
#           bash benchmarks/stage_cutedsl48.sh unpack2 && bash benchmarks/gpu_session.sh libraries libserve test_gpu_libraries
#           (gpu_session.sh puts /tmp/site48 first on the path when unpack2 completed it)
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=/tmp/site48
case "${1:-}" in
  pack)
    PY=.venv/bin/python
    dl=/tmp/kg-carry48-dl
    rm -rf "$dl" /tmp/kg-carry48-site && mkdir -p "$dl" .carry48/wheels
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_24_x86_64 \
        "nvidia-cutlass-dsl==4.8.1" "nvidia-cutlass-dsl-libs-base==4.8.1" "nvidia-cutlass-dsl-libs-core==4.8.1" \
        "nvidia-cutlass-dsl-libs-cu12==4.8.1" "quack-kernels==0.6.5" "liger-kernel==0.8.5" \
        "apache-tvm-ffi" "torch-c-dlpack-ext" -d "$dl"
    # the DSL is what a --target install unpacks (no compiled bytecode, no dependencies)
    "$PY" -m pip install -q --no-deps --no-compile --target /tmp/kg-carry48-site \
        --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 \
        "$dl"/nvidia_cutlass_dsl*.whl
    big=$(cd /tmp/kg-carry48-site && find . -name "_cutlass_ir*.so" | head -1)
    [ -n "$big" ] || { echo "no _cutlass_ir shared library in the 4.8.1 wheels" >&2; exit 1; }
    tar -C /tmp/kg-carry48-site -cf - "$big" | xz -T0 -6 > .carry48/part1_ir.tar.xz
    tar -C /tmp/kg-carry48-site --exclude="$big" -cf - . | xz -T0 -6 > .carry48/part2_rest.tar.xz
    cp "$dl"/quack_kernels-*.whl "$dl"/liger_kernel-*.whl "$dl"/apache_tvm_ffi-*.whl \
       "$dl"/torch_c_dlpack_ext-*.whl .carry48/wheels/
    du -sh .carry48/* ;;
  unpack1)
    rm -rf "$SITE" && mkdir -p "$SITE"
    tar -xJf .carry48/part1_ir.tar.xz -C "$SITE"
    echo "stage 1 of 2 in $SITE: $(du -sh "$SITE" | cut -f1)" ;;
  unpack2)
    [ -d "$SITE/nvidia_cutlass_dsl" ] || { echo "stage 1 is not on this machine (a fresh machine): run unpack1 first" >&2; exit 1; }
    tar -xJf .carry48/part2_rest.tar.xz -C "$SITE"
    python3 -m pip install -q --no-deps --no-compile --target "$SITE" .carry48/wheels/*.whl
    touch "$SITE/.complete"
    PYTHONPATH="$SITE/nvidia_cutlass_dsl/dsl_packages:$SITE/nvidia_cutlass_dsl/python_packages:$SITE" python3 -c \
        "import cutlass, quack; from importlib.metadata import version; print('nvidia-cutlass-dsl', version('nvidia-cutlass-dsl'), 'quack-kernels', version('quack-kernels'))" ;;
  *) echo "usage: $0 pack|unpack1|unpack2" >&2; exit 2 ;;
esac
