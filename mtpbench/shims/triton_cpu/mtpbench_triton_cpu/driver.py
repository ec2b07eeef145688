"""The "cpu" driver: active, and naming the CPU as the device (see the package docstring)."""

from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase


class InterpreterCpuDriver(DriverBase):

    @classmethod
    def is_active(cls):
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("mtpbench's Triton cpu backend compiles nothing: set TRITON_INTERPRET=1")

    def get_current_target(self):
        return GPUTarget("cpu", 0, 0)

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        import torch

        return torch.cpu

    def get_benchmarker(self):
        from triton.testing import do_bench

        return do_bench
