"""The native engine on CUDA (marked ``gpu``; skipped where no GPU is visible)."""

import pytest
import torch

from mtpbench.engine import generate
from mtpbench.model import load_model
from mtpbench.prompts import BUILTIN_MODEL_DIR

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("mode", ["reuse", "chain"])
def test_cuda_greedy_speculative_equals_plain_and_cpu(prompt_ids, mode):
    gpu = load_model(BUILTIN_MODEL_DIR, "cuda", torch.float32)
    plain = generate(gpu, prompt_ids, 32, k=0).tokens
    assert generate(gpu, prompt_ids, 32, k=3, mode=mode).tokens == plain
    cpu = load_model(BUILTIN_MODEL_DIR)
    assert generate(cpu, prompt_ids[:1], 32, k=0).tokens[0] == plain[0]


def test_cuda_bf16_runs_and_accepts(prompt_ids):
    m = load_model(BUILTIN_MODEL_DIR, "cuda", torch.bfloat16)
    g = generate(m, prompt_ids, 32, k=2, mode="chain")
    assert all(len(t) == 32 for t in g.tokens)
    assert sum(c.num_accepted_tokens for c in g.counts) > 0


def test_cuda_sweep_fills_the_telemetry_columns(tmp_path):
    """On an NVIDIA GPU the native sweep's rows carry energy per token, power and peak memory."""
    from mtpbench.config import SweepConfig
    from mtpbench.sweep import run_sweep

    rows = run_sweep(SweepConfig(device="cuda", k=(0, 2), mode=("chain",), num_prompts=2, max_tokens=64,
                                 out=str(tmp_path / "s")))
    for r in (r for r in rows if r.category == "all"):
        assert r.energy_j_per_token > 0 and r.avg_power_w > 0 and r.peak_gpu_mem_bytes > 0, r
        assert r.energy_method in ("nvml_energy_counter", "integrated_power")
