#!/usr/bin/env bash
# Builds .carry/ (ignored by git), what benchmarks/gpu_session.sh expects beside the tree on the GPU
# machine, which cannot install from a registry: the CuTe DSL wheel unpacked and xz-compressed, the
# cuda-tile and liger-kernel wheels (cp312, the GPU machine's Python), cuTile cubins, a bundle of the
# add_relu and rmsnorm examples (every backend: CuTe DSL libraries need gcc, cuTile tileiras, both
# here), one of every example op (xz-compressed, for tests/gpu/test_gpu_runtime_all.py), and an older tree (its source, tests and cuTile cubins) for the host-cost A/B and the GPU tests' "before" (OLD=REV, default 3bbeaac). Run from the repository
# root after scripts/test.sh made .venv (minutes: the xz pass and the bundle):
#
#   bash benchmarks/make_carry.sh            then: run(..., carry=[".carry"])
#
# The whole of .carry plus the tree must stay under the device tool's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${CARRY_PY:-.venv/bin/python}"
# The bundles hold CuTe DSL's runtime library beside its kernels: build them with the CuTe DSL the GPU
# machine gets (4.3.5 here, whose runtime is small; 4.8.1's is 43 MB and does not fit the carry):
# CARRY_PY=<a venv's python with nvidia-cutlass-dsl==4.3.5, cuda-tile and tileiras>. The tree's src
# comes first on PYTHONPATH, whatever that venv has installed.
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OLD="${OLD:-3bbeaac}"
mkdir -p .carry/cutedsl .carry/cutile/wheels .carry/liger /tmp/kg-carry-dl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    "nvidia-cutlass-dsl==4.3.5" "cuda-tile==1.7.0" "liger-kernel==0.8.5" -d /tmp/kg-carry-dl
cp /tmp/kg-carry-dl/cuda_tile-*.whl .carry/cutile/wheels/
cp /tmp/kg-carry-dl/liger_kernel-*.whl .carry/liger/
if [ ! -f .carry/cutedsl/nvidia_cutlass_dsl-4.3.5-cp312.tar.xz ]; then
    rm -rf /tmp/kg-carry-cutedsl && mkdir -p /tmp/kg-carry-cutedsl
    "$PY" -m zipfile -e /tmp/kg-carry-dl/nvidia_cutlass_dsl-4.3.5-*.whl /tmp/kg-carry-cutedsl
    tar -C /tmp/kg-carry-cutedsl -cf - . | xz -T0 -6 > .carry/cutedsl/nvidia_cutlass_dsl-4.3.5-cp312.tar.xz
fi
"$PY" benchmarks/build_cutile_cubins.py --out .carry/cutile/cubins
rm -rf .carry/bundle
env -u TRITON_INTERPRET KERNELGRAFT_CACHE_DIR=/tmp/kg-carry-cache "$PY" -m kernelgraft aot \
    kernelgraft.examples.add_relu kernelgraft.examples.rmsnorm --arch sm_90 -o .carry/bundle
rm -rf /tmp/bundle_all
env -u TRITON_INTERPRET KERNELGRAFT_CACHE_DIR=/tmp/kg-carry-cache "$PY" -m kernelgraft aot \
    kernelgraft.examples.{add_relu,rmsnorm,rmsnorm_residual,softmax,swiglu,gemm,fp8_kcache_scatter} \
    --arch sm_90 --allow-partial -o /tmp/bundle_all
tar -C /tmp -cf - bundle_all | xz -T0 -6 > .carry/bundle_all.tar.xz
rm -rf .carry/old && mkdir -p .carry/old
git archive "$OLD" src benchmarks tests examples pyproject.toml | tar -x -C .carry/old
rm -rf .carry/old/benchmarks/results
# the older tree's own cuTile cubins (its names differ): gpu_session.sh alltests_old points at them
pyabs="$(realpath -s "$PY")"  # the venv's python, its link not followed
( cd .carry/old && env -u TRITON_INTERPRET PYTHONPATH="$PWD/src:$PWD/benchmarks" KERNELGRAFT_CACHE_DIR=/tmp/kg-carry-old-cache \
    "$pyabs" benchmarks/build_cutile_cubins.py --out cubins )
# the older tree's own bundle (its manifest version) for its GPU tests that take $KERNELGRAFT_TEST_BUNDLE:
# built by that tree with CuTe DSL 4.3.5 (COMPAT_PY, the version it supports) and cuTile's compiler on
# PATH (its lookup predates the pip package's bin folder); xz-compressed, unpacked by gpu_session.sh
compat_abs="$(realpath -s "${COMPAT_PY:-.venv-compat/bin/python}")"  # relative or absolute, before the cd below
tileiras="$(dirname "$(realpath "$(find .venv/lib/python*/site-packages/nvidia -name tileiras -type f | head -1)")")"
tiledir="$(mktemp -d)" && mkdir -p "$tiledir/cuda" && ln -s "$(realpath .venv/lib/python*/site-packages/cuda/tile)" "$tiledir/cuda/tile" \
    && for d in .venv/lib/python*/site-packages/{cutile_cache,cuda_tile-*.dist-info,nvidia_cuda_tileiras-*.dist-info}; do \
         ln -s "$(realpath "$d")" "$tiledir/$(basename "$d")"; done  # cuTile alone, with its metadata, beside 4.3.5
rm -rf /tmp/old_bundle && ( cd .carry/old && env -u TRITON_INTERPRET PATH="$tileiras:$PATH" PYTHONPATH="$PWD/src:$tiledir" \
    KERNELGRAFT_CACHE_DIR=/tmp/kg-carry-old-bundle "$compat_abs" -m kernelgraft aot \
    kernelgraft.examples.add_relu kernelgraft.examples.rmsnorm --arch sm_90 -o /tmp/old_bundle )
tar -C /tmp -cf - old_bundle | xz -T0 -6 > .carry/old/bundle.tar.xz
du -sh .carry
echo "tree: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes; keep both under 64 MiB"
