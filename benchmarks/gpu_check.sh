#!/usr/bin/env bash
# One short device check for a session that is lent a GPU machine (it has PyTorch, no vLLM, and no
# package registry): what mtpbench sees, the gpu-marked tests, the native speed benchmark on CUDA, and a
# default sweep on CUDA with GPU telemetry (its summary.csv comes back).
# Before the run, here: pip download -d .wheels typer rich tabulate safetensors tokenizers matplotlib \
#   nvidia-ml-py pytest transformers aiohttp prometheus_client   (then carry .wheels; it is git-ignored)
set -uo pipefail
out=${OUT:-.}
if [ -d .wheels ]; then
  pip install -q --no-index --find-links .wheels typer rich tabulate safetensors tokenizers matplotlib \
    nvidia-ml-py pytest transformers aiohttp prometheus_client
fi
pip install -q --no-deps --no-build-isolation -e . || export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
python -m mtpbench env | tee "$out/env.txt"
python -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.txt"
python benchmarks/native_speed.py --device cuda --prompts 4 --max-tokens 128 2>&1 | grep -v Warning | tee "$out/gpu_speed.txt"
python -m mtpbench sweep --device cuda --out "$out/cuda_sweep" 2>&1 | tail -20 | tee "$out/cuda_sweep.txt"
