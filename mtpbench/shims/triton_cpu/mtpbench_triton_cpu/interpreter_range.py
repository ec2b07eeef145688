"""``tl.range`` in Triton's interpreter as compiled Triton has it: its loop variable a tensor, not a Python int.

Triton 3.x's interpreter maps ``tl.range`` to Python's ``range`` (``triton/runtime/interpreter.py``
``_patch_lang_core._new_range``), so a kernel that treats the loop variable as the tensor it is when compiled fails
there: vLLM's top-k/top-p kernel (``vllm/v1/sample/ops/topk_topp_triton.py``: ``row_id.to(tl.int64)``) stops Model
Runner V2 with ``AttributeError: 'int' object has no attribute 'to'`` whenever a request sets top-p or top-k. This
wraps the interpreter's patching so that, after it, ``tl.range`` yields each value as the interpreter's own int32
tensor (``_implicit_cvt``, what it makes of an int argument); ``tl.static_range`` stays Python's (compile-time
loops, whose variables are constants when compiled too). This package is imported while ``import triton`` runs,
before its interpreter can be: ``install_when_imported`` patches the interpreter module once it has loaded. In the
engine processes that run V2 on a CPU only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import operator
import sys

MODULE = "triton.runtime.interpreter"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the interpreter module's import, wraps its loader so ``install`` runs after it."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)  # once; the other finders find the module
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                install()

            spec.loader.exec_module = exec_module
        return spec


def install_when_imported() -> None:
    if MODULE in sys.modules:
        install()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def install() -> None:
    interpreter = sys.modules[MODULE]
    if getattr(interpreter._patch_lang, "mtpbench_range", False):
        return
    original = interpreter._patch_lang

    def tensor_range(arg1, arg2=None, step=None, **kwargs):
        start, end = (0, arg1) if arg2 is None else (arg1, arg2)
        for i in range(operator.index(start), operator.index(end), 1 if step is None else operator.index(step)):
            yield interpreter._implicit_cvt(i)

    def patch_lang(fn):
        scope = original(fn)
        for lang in {value for value in fn.__globals__.values()
                     if inspect.ismodule(value) and value in (interpreter.tl, interpreter.tl.core)}:
            scope.set_attr(lang, "range", tensor_range)  # restored first, before the interpreter's own
        return scope

    patch_lang.mtpbench_range = True
    interpreter._patch_lang = patch_lang
