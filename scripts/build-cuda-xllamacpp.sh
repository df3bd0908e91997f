#!/bin/bash
# Build a CUDA wheel of xllamacpp from its source distribution, on a machine with the CUDA
# toolkit (nvcc), a C++ compiler and CMake; no network needed once the sdist is there.
#
#   usage: scripts/build-cuda-xllamacpp.sh [SDIST.tar.gz] [OUTDIR]
#
#   SDIST   xllamacpp-VERSION.tar.gz; without it, pip downloads the sdist of
#           $XLLAMACPP_VERSION (default: the version installed in this Python), which needs
#           the network:  pip download --no-binary :all: --no-deps xllamacpp==VERSION
#   OUTDIR  where the wheel goes (default: dist/)
#
# Environment:
#   PYTHON              the Python to build for (default: python3); it needs the build
#                       requirements already installed (no build isolation, so no network):
#                       pip install 'setuptools>=61' 'cython>=3.1' wheel 'versioneer[toml]'
#   CUDA_ARCHITECTURES  e.g. 90 (Hopper), 89 (Ada), 86, 80, or "86;90"; default: the compute
#                       capability of each GPU nvidia-smi lists, else CMake's "native"
#   NPROC               parallel compile jobs (default: all cores)
#
# LLGuidance (needs Rust crates) and BoringSSL (fetched at configure time) are switched
# off; xllamacpp's setup.py skips their archives when they are absent.  ollamatrio needs
# neither: runners listen on a Unix socket, and llama.cpp turns JSON schemas into grammars
# itself.  About 7-8 minutes on 16 cores for one architecture.
#
# Then:  pip install --force-reinstall --no-deps OUTDIR/xllamacpp-*.whl
# The wheel links the machine's CUDA runtime (libcudart, libcublas): install it where the
# same CUDA major version is installed.
set -euo pipefail

python=${PYTHON:-python3}
out=$(mkdir -p "${2:-dist}" && readlink -f "${2:-dist}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -n "${1:-}" ]; then
    sdist=$(readlink -f "$1")
else
    version=${XLLAMACPP_VERSION:-$("$python" -c 'import importlib.metadata as m; print(m.version("xllamacpp"))')}
    "$python" -m pip download --no-binary :all: --no-deps -d "$work" "xllamacpp==$version"
    sdist=$(ls "$work"/xllamacpp-*.tar.gz)
fi

"$python" -c 'import Cython, setuptools, versioneer, wheel' 2>/dev/null || {
    echo "$python lacks the build requirements: pip install 'setuptools>=61' 'cython>=3.1' wheel 'versioneer[toml]'" >&2
    exit 1
}
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { echo "nvcc not found: install the CUDA toolkit or put it on PATH" >&2; exit 1; }
if [ -z "${CUDA_ARCHITECTURES:-}" ]; then
    caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | sort -u | paste -sd';' || true)
    CUDA_ARCHITECTURES=${caps:-native}
fi

tar xzf "$sdist" -C "$work"
cd "$work"/xllamacpp-*/
export CUDA_PATH=$(dirname "$(dirname "$(readlink -f "$nvcc")")") PATH="$(dirname "$nvcc"):$PATH"
export XLLAMACPP_BUILD_CUDA=1 CUDA_ARCHITECTURES NPROC=${NPROC:-$(nproc)}
export CMAKE_ARGS="-DLLAMA_LLGUIDANCE=OFF -DLLAMA_BUILD_BORINGSSL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_CUDA_COMPILER=$nvcc"
echo "building $(basename "$sdist") for CUDA architectures $CUDA_ARCHITECTURES with $NPROC jobs" >&2
"$python" -m pip wheel --no-build-isolation --no-deps -w "$out" .
ls "$out"/xllamacpp-*.whl
