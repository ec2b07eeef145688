"""The sweep's own orchestration on the native engine: repeats are timed round robin across points."""






def test_the_default_sweep_times_six_repeats_on_the_native_backend_only():
    from mtpbench.config import resolve

    assert resolve({}).repeats == 6  # the fewest that give tokens/s an interval
    assert resolve({"repeats": 2}).repeats == 2
    for backend in ("vllm", "vllm-server"):  # the fewest that give the speedup an interval, not 1 without any
        assert resolve({"backend": backend}).repeats == 3
    assert resolve({}, defaults={"repeats": 3}).repeats == 3


def test_vllm_backends_default_to_vllms_dtype_and_the_native_engine_to_float32(tmp_path):
    """vLLM's default is auto (the checkpoint's dtype): float32 doubles a real checkpoint's memory and is not what a
    deployment runs. The native engine keeps float32 (its exact comparisons). A dtype given anywhere wins."""
    from mtpbench.config import resolve

    assert resolve({}).dtype == "float32"
    assert resolve({"backend": "vllm"}).dtype == "auto" and resolve({"backend": "vllm-server"}).dtype == "auto"
    assert resolve({"backend": "vllm", "dtype": "float32"}).dtype == "float32"
    assert resolve({"backend": "vllm"}, defaults={"dtype": "bfloat16"}).dtype == "bfloat16"
    profile = tmp_path / "p.toml"
    profile.write_text('backend = "vllm"\ndtype = "float16"\nrepeats = 1\n')
    cfg = resolve({}, str(profile))
    assert cfg.dtype == "float16" and cfg.repeats == 1


def test_the_numerical_count_trusts_only_records_that_describe_the_tokens():
    from mtpbench.sweep.load import greedy_numerical

    saved = {"dtype": "float32", "threshold": 3.05e-5, "threshold_source": "the float32 floor",
             "records": [{"prompt_id": "a", "position": 1, "margin": 1e-6, "k0_token": 5, "spec_token": 6,
                          "logit_gap": 1e-6, "class": "numerical"},
                         {"prompt_id": "b", "position": 0, "margin": 2.0, "k0_token": 1, "spec_token": 2,
                          "logit_gap": 2.0, "class": "divergent"}]}
    differ = [("a", [4, 5, 7], [4, 6, 7]), ("b", [1, 1], [2, 1])]
    assert greedy_numerical(saved, differ)[0] == 1
    assert "1 of 2 divergences from k = 0 is numerical" in greedy_numerical(saved, differ)[1]
    assert greedy_numerical(saved, []) == (None, None)
    # the k = 0 point measured again since, with other tokens: that record no longer holds
    count, note = greedy_numerical(saved, [("a", [4, 9, 7], [4, 6, 7]), ("b", [1, 1], [2, 1])])
    assert count is None and "prompt(s) a" in note
    count, note = greedy_numerical({"unavailable": "no k = 0 pass"}, differ)
    assert count is None and note.endswith("no k = 0 pass")


def test_the_table_prints_an_interval_as_it_is_never_in_scientific_notation():
    """An asymmetric interval (tokens/s 350 in [221, 1653]) is printed as its two ends, not as "350 ± 7.2e+02"."""
    from mtpbench.metrics import PointResult
    from mtpbench.sweep.table import table

    row = PointResult("native", "chain", 1, 1, "all", "ok", output_tokens_per_sec=350.0,
                      output_tokens_per_sec_ci_low=221.0, output_tokens_per_sec_ci_high=1653.0, speedup=1.21,
                      speedup_ci_low=1.02, speedup_ci_high=1.65, ttft_ms_p50=1234.5, ttft_ms_p50_ci_low=1001.0,
                      ttft_ms_p50_ci_high=2400.25)
    text = table([row])
    assert "350.0 [221.0, 1653.0]" in text and "1.21 [1.02, 1.65]" in text and "1234.5 [1001.0, 2400.2]" in text
    assert "±" not in text and "e+" not in text
