"""check-lossless on served vLLM (``--backend vllm-server``) against real vllm-cpu servers, built-in checkpoint.

Launched: mtpbench starts a k = 0 and a k = 2 server and stops both. Attached: ``--server`` (drafting) plus
``--baseline-server`` (no drafting), a pair this module starts once. Never more than two servers at once:
the launched check runs (and ends) before the pair starts.
"""

import json
import os
from pathlib import Path

import pytest
from conftest import one_line_error
from typer.testing import CliRunner

from mtpbench.backends.vllm_server import free_port, http_get, parse_metrics
from mtpbench.cli import app

pytestmark = pytest.mark.vllm
if os.environ.get("CI") == "true":
    import vllm  # noqa: F401  CI must run these: a broken vLLM install fails, it does not skip
else:
    vllm = pytest.importorskip("vllm")

from test_vllm_server import assert_no_server_left, start_server, stop_server  # noqa: E402

TINY = ["--num-prompts", "2", "--max-tokens", "8"]
EXPAND_FIX = Path(__file__).parent / "vllm_cpu_expand_fix"


def check(*args: str):
    """Attached checks give no --k: the drafting server's own (2) is taken; --dtype: the servers' (a server does
    not report it, and greedy's numerical threshold needs it)."""
    return CliRunner().invoke(app, ["check-lossless", *TINY, "--dtype", "float32", *args])


def test_launched_greedy_check_starts_and_stops_both_servers(tmp_path):
    out = tmp_path / "greedy"
    r = check("--backend", "vllm-server", "--k", "2", "--temperature", "0", "--max-model-len", "512",
              "--engine-arg", "enforce_eager=true", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert_no_server_left(out)
    assert {p.name for p in out.glob("*.server.log")} == {"lossless-k0.server.log", "lossless-k2.server.log"}
    rec = json.loads((out / "lossless.json").read_text())
    # the same tokens, or divergences rounding can explain: never a divergent one
    assert rec["identical_share"] == 1.0 or rec["verdict"] == "numerical only", rec["per_prompt"]
    assert rec["num_divergent"] == 0 and rec["aa_batch_sizes"][1] == 1
    assert all(len(p["k0_tokens"]) == 8 and len(p["spec_tokens"]) == 8 for p in rec["per_prompt"])
    spec = rec["arms"]["spec"]
    assert spec["engine"]["k"] == 2 and spec["engine"]["runner"] == "v1" and not spec["engine"]["attached"]
    assert "speculative_config" in spec["engine"]["server_args"] and spec["acceptance"]["num_drafts"] > 0
    assert "speculative_config" not in rec["arms"]["k0"]["engine"]["server_args"]
    assert rec["engine"]["dtype"] == "float32"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(drafting server at k = 2, server without drafting), with different engine seeds: the arms' draws
    come from each server's own stream (no request seeds), so two fresh servers of one seed would be coupled."""
    d = tmp_path_factory.mktemp("pair")
    # the drafting server with vLLM's expand step done right (tests/vllm_cpu_expand_fix): vllm-cpu 0.32's V1
    # verifies at T > 0 against logits divided by uninitialised memory (backends/vllm.py EXPAND_FAULT), which a
    # sampling check calls lossy (or not, at this N: the garbage differs run to run); test_vllm_lossless pins that
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXPAND_FIX), os.environ.get("PYTHONPATH")])))
        spec, spec_url = start_server(d / "spec.log", "--seed", "1",
                                      "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}')
    try:
        base, base_url = start_server(d / "base.log", "--seed", "2")
    except BaseException:
        stop_server(spec)
        raise
    yield spec_url, base_url
    stop_server(base)
    stop_server(spec)


def test_attached_pair_sampling_check_is_lossless(tmp_path, pair):
    spec_url, base_url = pair
    spec_before = parse_metrics(http_get(spec_url + "/metrics")[1])
    out = tmp_path / "sampling"
    # one request in flight: each server's draws go to the requests in one order (no batching race)
    r = check("--server", spec_url, "--baseline-server", base_url, "--temperature", "1",
              "--samples-per-prompt", "4", "--batch-size", "1", "--max-detectable-shift", "5", "--out", str(out))
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["verdict"].startswith("lossless"), (rec["verdict"], rec["why"])
    assert rec["test"]["num_continuations_a"] == rec["test"]["num_continuations_b"] == 8
    assert {a["engine"]["server"] for a in rec["arms"].values()} == {spec_url, base_url}
    assert rec["arms"]["on"]["engine"]["server"] == spec_url and rec["arms"]["on"]["engine"]["attached"]
    # the drafting arm's acceptance is the /metrics delta around it: all of it, and only it, on that server
    spec_after = parse_metrics(http_get(spec_url + "/metrics")[1])
    assert 0 < rec["arms"]["on"]["acceptance"]["num_drafts"] == spec_after["num_drafts"] - spec_before["num_drafts"]
    assert rec["engine"]["dtype"] is None  # an attached server's dtype is not visible from outside
    assert http_get(spec_url + "/health")[0] == http_get(base_url + "/health")[0] == 200  # not ours to stop


def test_attached_pair_greedy_check(tmp_path, pair):
    spec_url, base_url = pair
    out = tmp_path / "greedy"
    r = check("--server", spec_url, "--baseline-server", base_url, "--temperature", "0", "--out", str(out))
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["num_divergent"] == 0 and rec["verdict"] in ("lossless", "numerical only"), rec["per_prompt"]
    assert rec["config"]["k"] == 2  # the server's k, with no --k given
    assert not list(out.glob("*.server.log"))


def test_attached_refusals_are_one_line_and_write_nothing(tmp_path, pair):
    spec_url, base_url = pair
    dead = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "o"
    cases = [
        (["--server", dead, "--baseline-server", base_url], f"cannot reach a server at {dead}"),
        (["--server", spec_url, "--baseline-server", dead], f"--baseline-server: cannot reach a server at {dead}"),
        (["--server", spec_url], "give --baseline-server URL"),
        (["--server", spec_url, "--baseline-server", spec_url], f"the --baseline-server at {spec_url} drafts "
                                                                "(num_speculative_tokens=2)"),
        (["--server", base_url, "--baseline-server", base_url], f"the --server at {base_url} does not draft"),
    ]
    for args, message in cases:
        one_line_error(check(*args, "--temperature", "0", "--out", str(out)), message)
        assert not out.exists(), args


def test_an_attached_sweep_has_no_k0_pass_without_a_baseline():
    """A greedy sweep asks for divergence margins from a k = 0 pass: an attached server alone has none."""
    from mtpbench.backends.vllm_server import VllmServerBackend
    from mtpbench.config import SweepConfig
    from mtpbench.errors import MtpBenchError

    b = VllmServerBackend()
    b.cfg = SweepConfig(backend="vllm-server", server="http://127.0.0.1:1")
    with pytest.raises(MtpBenchError, match="give --baseline-server"):
        b.greedy_divergences([[1, 2]], [[3, 4]], [[3, 5]])
