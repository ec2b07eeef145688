"""The fingerprint: which settings a saved point was measured with, so a sweep never reuses (or reads)
a point made with other ones. Pure logic on hand-made files, plus the sweep's reuse step."""

import json
from dataclasses import fields

from mtpbench import config
from mtpbench.sweep import load
from mtpbench.config import FINGERPRINT_KEYS, NOT_MEASURED, SweepConfig, fingerprint
from mtpbench.metrics import GridPoint, PointRun

VERSIONS = {"vllm": None, "torch": "2.13.0", "mtpbench_code": "c0de"}

# Every SweepConfig field, classified by hand. A field added to SweepConfig fails this test until it is
# put here (and, if it does not change what a point measures, into config.NOT_MEASURED with a reason).
MEASURED = {"model", "backend", "method", "draft_model", "prompts", "num_prompts", "chat_template", "max_tokens",
            "repeats", "temperature", "top_p", "top_k", "batch_size",
            "random_input_len", "random_output_len", "random_range_ratio", "seed", "device", "dtype", "force_spec_step_idx",
            "max_model_len", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
            "distributed_executor_backend", "gpu_memory_utilization", "engine_args", "speculative_config", "server", "servers", "api",
            "runner",  # V1 and V2 draft differently: a point of one is never reused for the other
            # how many rounds a point gets and what runs beside it (issue 36): its timings' sample
            "max_repeats", "warmup", "aa_control",
            "law"}  # a point file read with --law holds its acceptance against its law (issue 46); one without, none
NOT_MEASURED_BY_HAND = {"out", "description", "label", "metadata", "percentile_metrics", "metric_percentiles", "k", "mtp_layers", "mode", "context_tokens", "concurrency",
                        "request_rate", "server_port", "server_start_timeout_s",
                        # how an attached server is reached (issue 18); header_values is never written
                        "api_key_env", "header", "header_env", "ca_cert", "insecure", "metrics_url",
                        "metrics_credentials", "header_values",
                        "replace",  # what to do with an earlier sweep in --out (issue 45), never written
                        "force",  # write beside files in --out that are not mtpbench's (issue 56), never written
                        "max_seconds"}  # a time budget (issue 36): the rounds a point got are in its file


def test_every_sweep_setting_is_classified():
    names = {f.name for f in fields(SweepConfig)}
    unclassified = names - MEASURED - NOT_MEASURED_BY_HAND
    assert not unclassified, f"classify the new SweepConfig field(s) {sorted(unclassified)} (see config.NOT_MEASURED)"
    assert set(FINGERPRINT_KEYS) == MEASURED and set(NOT_MEASURED) == NOT_MEASURED_BY_HAND
    assert set(NOT_MEASURED) <= names  # no stale entries
    assert all(reason for reason in NOT_MEASURED.values())
    # one list, not two: the sweep's reader (report.py before it moved to sweep/load.py) keeps no copy of its own
    assert getattr(load, "FINGERPRINT_KEYS", config.FINGERPRINT_KEYS) is config.FINGERPRINT_KEYS


def test_a_field_added_later_is_in_the_fingerprint_by_default():
    assert FINGERPRINT_KEYS == tuple(f.name for f in fields(SweepConfig) if f.name not in NOT_MEASURED)


def test_every_measured_setting_changes_the_fingerprint():
    base = SweepConfig().to_json()
    for key in FINGERPRINT_KEYS:
        changed = {**base, key: ["something else"]}
        assert fingerprint(changed, VERSIONS) != fingerprint(base, VERSIONS), key
    for key in NOT_MEASURED:
        assert fingerprint({**base, key: ["something else"]}, VERSIONS) == fingerprint(base, VERSIONS), key


def test_another_draft_model_is_another_fingerprint():
    a = SweepConfig(backend="vllm", draft_model="/models/drafter-a").to_json()
    b = SweepConfig(backend="vllm", draft_model="/models/drafter-b").to_json()
    assert fingerprint(a, VERSIONS) != fingerprint(b, VERSIONS)


class CountingBackend:
    def __init__(self):
        self.calls = []

    def run_point(self, cfg, point, prompts):
        self.calls.append((cfg.draft_model, point.name))
        return PointRun()


def test_the_sweep_measures_a_point_again_for_another_draft_model(tmp_path):
    """The sweep's reuse step (sweep.store.reused) keeps a saved point only for the same fingerprint: a sweep
    into the same --out with another drafter measures k > 0 again instead of reporting the old one's."""
    from mtpbench.sweep.run import run_one
    from mtpbench.sweep.store import reused

    point, backend = GridPoint("vllm", 2, 1), CountingBackend()
    for drafter, expect in (("/models/a", 1), ("/models/a", 1), ("/models/b", 2)):
        cfg = SweepConfig(backend="vllm", draft_model=drafter, out=str(tmp_path))
        fp = fingerprint(cfg.to_json(), VERSIONS)
        if point.name not in reused(tmp_path, fp, [point.name]):
            run_one(cfg, backend, point, [], tmp_path, fp)
        assert len(backend.calls) == expect, (drafter, backend.calls)
    assert json.loads((tmp_path / "vllm-L1-k2.json").read_text())["fingerprint"]["draft_model"] == "/models/b"


def _point(path, fp: dict, k: int = 0):
    path.write_text(json.dumps({"point": GridPoint("plain" if k == 0 else "chain", k, k and 1).to_json("native"),
                                "fingerprint": fp, "requests": [], "batches": [], "repeats": []}))


def test_older_sweeps_stay_readable(tmp_path):
    """A sweep from before run.json recorded its fingerprint: its points wrote down the settings of their
    time (no draft_model among them), and still belong to it; a point made with other settings does not."""
    cfg = SweepConfig().to_json()
    old_keys = [k for k in FINGERPRINT_KEYS if k != "draft_model"]
    old_fp = {**{k: cfg[k] for k in old_keys}, "versions": VERSIONS}
    (tmp_path / "run.json").write_text(json.dumps({"config": cfg, "provenance": {"versions": VERSIONS}}))
    _point(tmp_path / "k0.json", old_fp)
    _point(tmp_path / "chain-L1-k1.json", {**old_fp, "max_tokens": 7}, k=1)  # another sweep's leftover
    run, points, failures = load.load_run(tmp_path)
    assert [p["point"]["k"] for p in points] == [0] and failures == []
    # a sweep that recorded its fingerprint reads exactly the points that carry it
    new_fp = fingerprint(cfg, VERSIONS)
    (tmp_path / "run.json").write_text(json.dumps({"config": cfg, "provenance": {"versions": VERSIONS},
                                                   "fingerprint": new_fp}))
    assert load.load_run(tmp_path)[1] == []
    _point(tmp_path / "k0.json", new_fp)
    assert len(load.load_run(tmp_path)[1]) == 1
