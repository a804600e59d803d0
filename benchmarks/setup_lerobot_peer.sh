#!/usr/bin/env bash
# A virtual environment with LeRobot 0.6.1 and its MetaWorld env: the peer side of
# bench_lerobot_eval_metaworld.py (`lerobot-eval` on MetaWorld) and of scripts/make_lerobot_fixtures.py's
# ACT and dataset kinds. (The PushT peers, bench_peer.py and bench_peer_eval.py, also need gym-pusht, and
# the Diffusion Policy kinds diffusers, at LeRobot's bounds: `$LEROBOT_VENV/bin/pip install
# "gym-pusht>=0.1.5,<0.2" "pymunk>=6.6,<7" "diffusers>=0.38,<0.40" torch==2.14.1`; not installed here.)
#
#     bash benchmarks/setup_lerobot_peer.sh            # venv at $LEROBOT_VENV, default <repo>/lerobot-venv
#     LEROBOT_VENV=/tmp/lr312 bash benchmarks/setup_lerobot_peer.sh
#
# Idempotent: a rerun reuses the venv and installs only what is missing or at another version.
#
# LeRobot 0.6.1 needs Python >= 3.12 ($LEROBOT_PYTHON, default pyenv's 3.12.1, else python3.12 on PATH).
# It pins torch < 2.12; this project runs torch 2.14.1, so LeRobot goes in with --no-deps beside the same
# torch (2.14.1 / torchvision 0.29.1: both sides of a comparison then run the same kernels) and its
# runtime dependencies are listed here, at LeRobot 0.6.1's own bounds (pip then reports that lerobot wants
# torch < 2.12 and torchvision < 0.27: expected, and harmless here). Torch comes from the CPU index
# (download.pytorch.org/whl/cpu) when it answers, else from PyPI ($TORCH_INDEX_URL picks another).
# MetaWorld is LeRobot's own pin (its `metaworld` extra: metaworld==3.0.0, scipy); metaworld 3.0.0 asks
# only mujoco>=3.0.0, which today resolves to MuJoCo 4, so MuJoCo is pinned to 3.3.0, the version this
# project's metaworld runs on (both sides simulate with the same MuJoCo).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LEROBOT_VENV:-$REPO/lerobot-venv}"
BASE_PYTHON="${LEROBOT_PYTHON:-/root/.pyenv/versions/3.12.1/bin/python}"
if [[ ! -x "$BASE_PYTHON" ]]; then
    BASE_PYTHON="$(command -v python3.12 || true)"
fi
if [[ -z "$BASE_PYTHON" ]]; then
    echo "no Python 3.12 found: set LEROBOT_PYTHON to a Python >= 3.12" >&2
    exit 1
fi

TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
LEROBOT_VERSION=0.6.1
DEPS=(
    # lerobot 0.6.1 core (its pyproject's bounds)
    "numpy>=2.0,<2.3" "opencv-python-headless>=4.9,<4.14" "Pillow>=10,<13" "einops>=0.8,<0.9"
    "draccus>=0.11.6,<0.12" "huggingface-hub>=1.6,<2" "requests>=2.32,<3" "gymnasium>=1.1.1,<2"
    "safetensors>=0.4.3,<1" "packaging>=24.2,<26" "termcolor>=2.4,<4" "tqdm>=4.66,<5"
    "setuptools>=71,<82" "cmake>=3.29.0.1,<4.2"
    # its `dataset` extra (lerobot-eval imports LeRobotDataset) and `av-dep` (evaluation videos)
    "datasets>=4.8,<5" "pandas>=2,<3" "pyarrow>=21,<30" "jsonlines>=4,<5" "av>=15,<16"
    # its `metaworld` extra
    "metaworld==3.0.0" "scipy>=1.14,<2" "mujoco==3.3.0" imageio
    # the benchmark samples memory with it
    psutil
)

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV with $BASE_PYTHON"
    "$BASE_PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1

have() {  # have MODULE VERSION: the venv imports MODULE at that version (a prefix: 2.14.1 matches 2.14.1+cpu)
    "$PY" -c "import importlib.metadata as m, sys; sys.exit(not m.version('$1').startswith('$2'))" \
        2>/dev/null
}

if have torch "$TORCH_VERSION" && have torchvision "$TORCHVISION_VERSION"; then
    echo "torch $TORCH_VERSION and torchvision $TORCHVISION_VERSION present"
else
    INDEX="${TORCH_INDEX_URL:-}"
    CPU_INDEX=https://download.pytorch.org/whl/cpu
    if [[ -z "$INDEX" ]] && curl -fsS --max-time 15 -o /dev/null "$CPU_INDEX/torch/"; then
        INDEX="$CPU_INDEX"
    fi
    if [[ -n "$INDEX" ]]; then
        echo "installing torch $TORCH_VERSION from $INDEX"
        "$PY" -m pip install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" --index-url "$INDEX"
    else
        echo "download.pytorch.org not reachable: installing torch $TORCH_VERSION from PyPI (CUDA build)"
        "$PY" -m pip install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
    fi
fi

if have lerobot "$LEROBOT_VERSION"; then
    echo "lerobot $LEROBOT_VERSION present"
else
    "$PY" -m pip install --no-deps "lerobot==$LEROBOT_VERSION"
fi
# Constrain torch so that no dependency moves it.
"$PY" -m pip install "${DEPS[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"

# A check from outside the repository, so that LeRobot's `lerobot` is imported, not this project's.
(cd / && PYTHONPATH= "$PY" - <<'EOF'
import importlib.metadata as m

import metaworld  # noqa: F401
import torch

import lerobot
from lerobot.envs.metaworld import MetaworldEnv  # noqa: F401
from lerobot.policies.act.modeling_act import ACTPolicy  # noqa: F401
from lerobot.scripts.lerobot_eval import eval_main  # noqa: F401

versions = ", ".join(f"{p} {m.version(p)}" for p in ("metaworld", "mujoco", "gymnasium", "numpy"))
print(f"ok: lerobot {lerobot.__version__} at {lerobot.__file__}, torch {torch.__version__}, {versions}")
EOF
)
echo "LeRobot's Python: $PY"
