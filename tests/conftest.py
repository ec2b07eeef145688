import json
import shutil
from pathlib import Path

import pytest
import torch

from mtpbench.backends.native import load_tokenizer
from mtpbench.model import load_model
from mtpbench.prompts import BUILTIN_MODEL_DIR

SHARED = Path(__file__).resolve().parents[2] / "shared"
CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_chat_model(d):
    """The built-in checkpoint with a ChatML chat template, and a tokenizer that adds a BOS token as
    Llama-style tokenizers do (so a template's own bos_token would be doubled if added again)."""
    shutil.copytree(BUILTIN_MODEL_DIR, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = json.loads((d / "tokenizer.json").read_text())
    bos = {"id": "<|endoftext|>", "type_id": 0}
    tok["post_processor"] = {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}},
                                      {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                                                  "tokens": ["<|endoftext|>"]}}}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    return d


@pytest.fixture(scope="session")
def model():
    torch.manual_seed(0)
    return load_model(BUILTIN_MODEL_DIR)


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(BUILTIN_MODEL_DIR)


@pytest.fixture(scope="session")
def prompt_ids(tokenizer):
    lines = (BUILTIN_MODEL_DIR / "prompts.jsonl").read_text().splitlines()
    # three prompts of different lengths, so batched rows sit at different positions
    texts = [json.loads(line)["prompt"] for line in lines[:3]]
    return [tokenizer.encode(t[: 80 + 60 * i]).ids for i, t in enumerate(texts)]


@pytest.fixture
def no_mtp_model(tmp_path):
    """A copy of the built-in checkpoint whose config declares no MTP layers."""
    d = tmp_path / "no-mtp"
    shutil.copytree(BUILTIN_MODEL_DIR, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 0
    (d / "config.json").write_text(json.dumps(cfg))
    return d
