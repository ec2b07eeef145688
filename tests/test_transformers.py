"""The built-in checkpoint read by transformers as Qwen2ForCausalLM: same greedy tokens as the native engine."""

import pytest
import torch

from mtpbench.engine import generate
from mtpbench.prompts import BUILTIN_MODEL_DIR

transformers = pytest.importorskip("transformers")


def test_native_greedy_equals_transformers_qwen2(model, prompt_ids):
    hf = transformers.Qwen2ForCausalLM.from_pretrained(str(BUILTIN_MODEL_DIR), dtype=torch.float32).eval()
    native = generate(model, prompt_ids[:2], 32, k=0).tokens
    spec = generate(model, prompt_ids[:2], 32, k=3, mode="chain").tokens
    for ids, mine, mine_spec in zip(prompt_ids[:2], native, spec):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, min_new_tokens=32,
                              pad_token_id=0)
        theirs = out[0, len(ids):].tolist()
        assert mine == theirs
        assert mine_spec == theirs
