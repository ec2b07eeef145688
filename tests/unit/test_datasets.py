"""vLLM's datasets as mtpbench reads them (mtpbench.datasets): the random dataset's lengths and prompts, ShareGPT
files and their refusals, and the options' checks. Pure logic and the built-in tokenizer: no model runs."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import one_line_error
from mtpbench.cli import app
from mtpbench.config import resolve, validate
from mtpbench.datasets import length_range, random_lengths, random_token_prompts, read_sharegpt
from mtpbench.errors import MtpBenchError
from mtpbench.prompts import BUILTIN_MODEL_DIR, load_prompts, load_tokenizer, run_prompts


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.floats(0.0, 0.99), st.integers(0, 2**32 - 1), st.integers(1, 64))
def test_random_lengths_lie_in_vllm_s_range_and_repeat_with_the_seed(n, r, seed, num):
    low, high = math.floor(n * (1 - r)), math.ceil(n * (1 + r))  # vLLM's get_sampling_params, written out
    lengths = random_lengths(num, n, r, seed)
    assert len(lengths) == num and all(max(1, low) <= x <= high for x in lengths)
    assert random_lengths(num, n, r, seed) == lengths


def test_random_lengths_spread_over_the_range_and_a_ratio_of_0_fixes_them():
    assert random_lengths(50, 100, 0.0, 0) == [100] * 50
    lengths = random_lengths(2000, 100, 0.5, 0)
    assert min(lengths) == 50 and max(lengths) == 150  # both ends reachable
    assert random_lengths(20, 100, 0.5, 1) != random_lengths(20, 100, 0.5, 2)
    assert length_range(100, 0.5, num_special=2) == (49, 147)  # the tokenizer's special tokens left out first


def test_random_prompts_read_back_as_their_lengths_and_repeat_with_the_seed():
    tok = load_tokenizer(BUILTIN_MODEL_DIR)
    made = random_token_prompts(tok, 12, 64, 0.5, 7)
    want = random_lengths(12, 64, 0.5, 7)
    assert [n for _, n in made] == [len(tok.encode(t, add_special_tokens=False).ids) for t, _ in made]
    # decode / read back converges for most; where it does not (a byte token cut mid-character reads back as more
    # tokens), a token or two off, as vLLM warns of the same
    assert sum(n == w for (_, n), w in zip(made, want)) >= 8
    assert all(abs(n - w) <= 2 for (_, n), w in zip(made, want))
    assert random_token_prompts(tok, 12, 64, 0.5, 7) == made
    assert random_token_prompts(tok, 12, 64, 0.5, 8) != made


def sharegpt(tmp_path, data, name="sg.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_a_sharegpt_file_gives_each_conversation_s_first_turn(tmp_path):
    conv = [{"id": "a", "conversations": [{"from": "human", "value": "Write a sort."}, {"from": "gpt", "value": "ok"}]},
            {"id": "b", "conversations": [{"from": "human", "value": "alone"}]},  # one turn: left out, as vLLM
            {"conversations": [{"from": "human", "value": "Explain MTP."}, {"from": "gpt", "value": "..."},
                               {"from": "human", "value": "more"}, {"from": "gpt", "value": "..."}]}]
    path = sharegpt(tmp_path, conv)
    assert read_sharegpt(path) == [("a", "Write a sort."), ("2", "Explain MTP.")]
    prompts = load_prompts(str(path))
    assert [p.text for p in prompts] == ["Write a sort.", "Explain MTP."] and prompts[0].category == "sharegpt"
    assert [p.text for p in load_prompts(str(path), 1)] == ["Write a sort."]


@pytest.mark.parametrize("data,message", [
    ("{not json", "not valid JSON"),
    ({"conversations": []}, "a JSON list of conversations"),
    ([{"id": 1}], "entry 0 has no 'conversations' list"),
    ([{"conversations": ["hi", "there"]}], "entry 0: a turn is"),
    ([{"conversations": [{"from": "human", "value": "x"}]}], "no conversation of two turns or more"),
])
def test_a_bad_sharegpt_file_is_refused_in_one_line(tmp_path, data, message):
    path = sharegpt(tmp_path, data)
    with pytest.raises(MtpBenchError, match=message) as err:
        read_sharegpt(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    r = CliRunner().invoke(app, ["sweep", "--prompts", str(path), "--out", str(tmp_path / "out")])
    one_line_error(r, message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,message", [
    (["--random-input-len", "64"], "--random-input-len applies to --prompts random"),
    (["--prompts", "random", "--random-range-ratio", "1"], "--random-range-ratio must be in [0, 1)"),
    (["--prompts", "random", "--random-input-len", "0"], "--random-input-len must be >= 1"),
    (["--prompts", "random", "--random-output-len", "8", "--max-tokens", "9"], "name the same thing"),
    (["--prompts", "random", "--context-tokens", "64"], "--prompts random has none"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--top-k", "-2"], "--top-k must be -1 or 0 (off) or >= 1"),
])
def test_workload_options_out_of_vllm_s_range_are_refused_in_one_line(tmp_path, args, message):
    for command in ("sweep", "check-lossless") if "--context-tokens" not in args else ("sweep",):
        r = CliRunner().invoke(app, [command, *args, "--out", str(tmp_path / command)])
        one_line_error(r, message)
        assert not (tmp_path / command).exists()


def test_what_vllm_takes_is_taken_and_random_output_len_sets_max_tokens(tmp_path):
    for top_k, top_p, t in ((-1, 1.0, 1.0), (0, 0.01, 1.0), (5, 1.0, 0.0), (1, 0.5, 0.0)):  # greedy ignores them
        validate(resolve(dict(top_k=top_k, top_p=top_p, temperature=t, out=str(tmp_path / "o"))), 3)
    cfg = resolve(dict(prompts="random", random_output_len=16, random_input_len=40, random_range_ratio=0.25,
                       num_prompts=5, seed=4))
    assert cfg.max_tokens == 16
    pset = run_prompts(cfg)
    tok = load_tokenizer(BUILTIN_MODEL_DIR)
    lengths = [len(tok.encode(p.text, add_special_tokens=False).ids) for p in pset.prompts]
    assert len(lengths) == 5 and all(28 <= n <= 52 for n in lengths), lengths  # 30-50, a token or two off
    assert pset.name == "random" and "30-50 random tokens" in pset.notes[0] and "16 tokens" in pset.notes[0]
    assert not any(p.templated for p in pset.prompts)


def test_compare_refuses_runs_that_sampled_other_laws_and_reads_an_older_run_as_uncut():
    from mtpbench.compare.checks import check_same_workload

    base = {"model": "builtin", "prompts": "builtin", "num_prompts": 8, "chat_template": "auto", "max_tokens": 8,
            "temperature": 1.0, "seed": 0}
    old, cut = {"config": base}, {"config": {**base, "top_p": 0.9, "top_k": 0}}
    check_same_workload(old, {"config": {**base, "top_p": 1.0, "top_k": 0}}, force=False)  # older: top_p 1, top_k 0
    with pytest.raises(MtpBenchError, match=r"top_p \(1.0 vs 0.9\)"):
        check_same_workload(old, cut, force=False)
    check_same_workload(old, cut, force=True)
