#!/usr/bin/env bash
# Idempotent set-up: a Python virtual environment in .venv with the torch wheel whose libtorch
# flotilla links against (torch 2.11.0 <-> tch 0.24.0), hydra-core, the oracle the config
# tests compare against, and transformers + safetensors, the oracle the model tests compare
# against, peft, the oracle of the LoRA tests, and tensorboard, the oracle that reads the event
# files back, trl, the oracle of preference tuning (DPO), and pyarrow + datasets, which write the
# Parquet files and `save_to_disk` directories the data tests read (installed with uv, see
# below); then .venv/libtorch pointing at the wheel's torch/ folder;
# on Debian (as root) also fonts-dejavu-core, the font of `flotilla report --plot`'s PNG figures.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0
HYDRA_VERSION=1.3.8
TRANSFORMERS_VERSION=5.23.0
SAFETENSORS_VERSION=0.8.0
TENSORBOARD_VERSION=2.21.0
PEFT_VERSION=0.21.2
TRL_VERSION=1.16.0
PYARROW_VERSION=26.0.1
DATASETS_VERSION=5.2.0
UV_VERSION=0.13.9
PYTHON=${PYTHON:-python3}

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not on PATH; install a Rust toolchain (https://rustup.rs) first" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi

installed() { .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
want=()
installed torch "$TORCH_VERSION" || want+=("torch==$TORCH_VERSION")
installed hydra-core "$HYDRA_VERSION" || want+=("hydra-core==$HYDRA_VERSION")
installed transformers "$TRANSFORMERS_VERSION" || want+=("transformers==$TRANSFORMERS_VERSION")
installed safetensors "$SAFETENSORS_VERSION" || want+=("safetensors==$SAFETENSORS_VERSION")
installed tensorboard "$TENSORBOARD_VERSION" || want+=("tensorboard==$TENSORBOARD_VERSION")
installed peft "$PEFT_VERSION" || want+=("peft==$PEFT_VERSION")
installed trl "$TRL_VERSION" || want+=("trl==$TRL_VERSION")
installed pyarrow "$PYARROW_VERSION" || want+=("pyarrow==$PYARROW_VERSION")
installed datasets "$DATASETS_VERSION" || want+=("datasets==$DATASETS_VERSION")
# uv keeps one unpacked copy of each wheel in its cache and hardlinks environments to it:
# torch and its CUDA libraries (4.5 GB) are on disk once however many environments hold them
# (the wheels' test makes a fresh one with this uv), and no wheel archive is kept beside them.
if ! installed uv "$UV_VERSION"; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
if [ ${#want[@]} -gt 0 ]; then
    echo "setup: installing ${want[*]} into .venv"
    .venv/bin/uv pip install --quiet --python .venv/bin/python "${want[@]}"
fi

# `flotilla report --plot` draws the PNG figures' text with a system font.
if [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] && command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "setup: installing fonts-dejavu-core (the PNG figures' font)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fonts-dejavu-core >/dev/null) \
            || echo "setup: fonts-dejavu-core could not be installed; PNG figures will have no text" >&2
    else
        echo "setup: no DejaVu font; for text in the PNG figures run: sudo apt-get install fonts-dejavu-core" >&2
    fi
fi

torch_dir=$(.venv/bin/python -c "import os, torch; print(os.path.dirname(torch.__file__))" 2>/dev/null | tail -n 1)
if [ ! -f "$torch_dir/lib/libtorch_cpu.so" ]; then
    echo "setup: torch is installed but $torch_dir/lib/libtorch_cpu.so is missing" >&2
    exit 1
fi
ln -sfn "$torch_dir" .venv/libtorch
echo "setup: ready (torch $TORCH_VERSION at .venv/libtorch, hydra-core $HYDRA_VERSION, transformers $TRANSFORMERS_VERSION, peft $PEFT_VERSION, tensorboard $TENSORBOARD_VERSION, trl $TRL_VERSION, pyarrow $PYARROW_VERSION, datasets $DATASETS_VERSION)"
