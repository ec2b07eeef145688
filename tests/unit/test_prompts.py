"""Prompt sets shipped with the package, chat templates, and the real-model profiles' prompt settings."""


import pytest
from typer.testing import CliRunner

from conftest import SHARED
from mtpbench.cli import app
from mtpbench.config import resolve
from mtpbench.profile import list_profiles
from mtpbench.prompts import BUILTIN_MODEL_DIR, SPEC_BENCH, load_prompts, prompt_set



def test_spec_bench_ships_480_prompts_in_13_categories():
    prompts = load_prompts("spec-bench")
    cats = {p.category for p in prompts}
    assert len(prompts) == 480 and len(cats) == 13
    assert sum(p.category == "translation" for p in prompts) == 80
    assert (SPEC_BENCH.parent / "LICENSE-Apache-2.0").read_text().lstrip().startswith("Apache License")
    assert "Spec-Bench" in (SPEC_BENCH.parent / "README.md").read_text()
    shared = SHARED / "data" / "spec_bench_question.jsonl"
    if shared.exists():
        assert SPEC_BENCH.read_bytes() == shared.read_bytes()  # an unmodified copy


def test_mt_bench_is_the_spec_bench_subset_and_says_it_keeps_first_turns():
    ps = prompt_set("mt-bench")
    assert len(ps.prompts) == 80 and sorted({int(p.id) for p in ps.prompts}) == list(range(81, 161))
    assert len({p.category for p in ps.prompts}) == 8
    assert "80 multi-turn question(s) use their first turn only" in ps.notes
    assert ps.prompts[0].text.startswith("Compose an engaging travel blog post")


def test_a_subset_spreads_over_the_categories():
    assert len({p.category for p in load_prompts("spec-bench", 13)}) == 13
    assert [p.category for p in load_prompts("builtin", 3)] == ["code"] * 3


def test_asking_for_more_prompts_than_a_set_has_names_both_numbers(tmp_path):
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["sweep", "--prompts", "spec-bench", "--num-prompts", "500", "--out", str(out)])
    assert r.exit_code == 2 and r.output.strip() == \
        "error: --num-prompts 500: the prompt set spec-bench has 480 prompts"
    assert not out.exists()


def test_chat_template_rendering_matches_transformers(chat_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(chat_model))
    ps = prompt_set("mt-bench", 3, chat_model)
    raw = load_prompts("mt-bench", 3)
    for p, q in zip(ps.prompts, raw):
        want = tok.apply_chat_template([{"role": "user", "content": q.text}], tokenize=False,
                                       add_generation_prompt=True)
        assert p.text == want and p.templated
    assert p.text.startswith("<|endoftext|><|im_start|>user\n") and p.text.endswith("<|im_start|>assistant\n")
    assert not prompt_set("mt-bench", 3, chat_model, "none").prompts[0].templated


@pytest.mark.parametrize("name", ["deepseek-v3", "glm-4.5-air", "mimo-7b-rl", "qwen3-next-80b-a3b", "qwen3.5"])
def test_real_model_profiles_benchmark_spec_bench_through_the_chat_template(name):
    cfg = resolve({}, name)
    assert cfg.prompts == "spec-bench" and cfg.chat_template == "auto"
    assert cfg.num_prompts is None or cfg.num_prompts <= 480
    assert name in list_profiles()


def test_the_server_is_told_not_to_add_special_tokens_to_a_templated_prompt(chat_model):
    from mtpbench.loadgen import payload

    templated, raw = prompt_set("mt-bench", 1, chat_model).prompts[0], load_prompts("mt-bench", 1)[0]
    assert payload("completions", "m", templated, 8, 0.0, 0)["add_special_tokens"] is False
    assert "add_special_tokens" not in payload("completions", "m", raw, 8, 0.0, 0)


def test_context_is_real_held_out_text_of_the_set_of_the_asked_length():
    from mtpbench.prompts import load_tokenizer, with_context

    tok = load_tokenizer(BUILTIN_MODEL_DIR)
    prompts = load_prompts("builtin", 3)
    longer = with_context(prompts, "builtin", 300, tok)
    others = [q.text for q in load_prompts("builtin", 64)]
    same_source = {p.id: [q.text for q in load_prompts("builtin", 64) if q.source == p.source] for p in prompts}
    prefixes = []
    for p, q in zip(prompts, longer):
        prefix = q.text[: -len(p.text) - 2]
        prefixes.append(prefix)
        assert q.text.endswith("\n\n" + p.text) and abs(q.context_tokens - 300) <= 2
        assert not any(t[:60] in prefix for t in same_source[p.id])  # never itself nor a sibling of its file
        assert not any(m.text[:60] in prefix for m in prompts)  # the measured prompts are held out
        assert prefix[:40] in "\n\n".join(o for o in others if o != p.text)  # text of the set, not padding
    assert len(set(prefixes)) == 3  # each prompt its own prefix: no shared prefix for a cache to serve


def test_prompts_longer_than_the_window_are_said_before_an_engine_fails():
    from mtpbench.config import SweepConfig
    from mtpbench.sweep.run import context_window, window_problem

    cfg = SweepConfig(prompts="spec-bench", max_tokens=64, k=(0, 2))
    window = context_window(cfg)
    assert window == (2048, "the model's max_position_embeddings")
    problem = window_problem(cfg, load_prompts("spec-bench"), window)
    assert problem.startswith("context window: the longest prompt is ") and "2048" in problem
    assert window_problem(cfg, load_prompts("builtin"), window) is None
    vllm = SweepConfig(backend="vllm", max_model_len=1024)
    assert context_window(vllm) == (1024, "max_model_len")
