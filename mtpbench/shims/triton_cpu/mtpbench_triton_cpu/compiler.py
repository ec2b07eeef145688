"""The "cpu" compiler: refuses to compile; under TRITON_INTERPRET=1 Triton never asks it to."""

from triton.backends.compiler import BaseBackend, GPUTarget


class InterpreterCpuBackend(BaseBackend):

    @staticmethod
    def supports_target(target: GPUTarget):
        return target.backend == "cpu"

    def hash(self) -> str:
        return "mtpbench-triton-cpu-interpreter"

    def parse_options(self, options: dict) -> object:
        return options

    def add_stages(self, stages: dict, options: object, language) -> None:
        raise NotImplementedError("mtpbench's Triton cpu backend compiles nothing: set TRITON_INTERPRET=1")

    def load_dialects(self, context):
        pass

    def get_module_map(self):
        return {}
