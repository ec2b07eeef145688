"""Prompt sets shipped with the package, chat templates, and the real-model profiles' prompt settings."""

import json

from typer.testing import CliRunner

from mtpbench.cli import app
from mtpbench.prompts import BUILTIN_MODEL_DIR, load_prompts, prompt_set





def test_a_templated_prompt_gets_its_bos_once(chat_model):
    from mtpbench.backends.native import load_tokenizer, NativeBackend

    backend = NativeBackend()
    backend.tokenizer = load_tokenizer(chat_model)
    templated = prompt_set("mt-bench", 1, chat_model).prompts
    raw = load_prompts("mt-bench", 1)
    ids_t, ids_r = backend.encode(templated)[0], backend.encode(raw)[0]
    assert ids_r[0] == 0 and ids_r[1] != 0  # raw text: the tokenizer adds BOS
    assert ids_t[0] == 0 and ids_t[1] != 0  # templated: the template's BOS, not a second one


def test_a_sweep_on_a_chat_checkpoint_applies_its_template_and_says_so(tmp_path, chat_model):
    out = tmp_path / "s"
    r = CliRunner().invoke(app, ["sweep", str(chat_model), "--prompts", "spec-bench", "--num-prompts", "13",
                                 "--k", "0,1", "--modes", "reuse", "--max-tokens", "4", "--repeats", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())  # the terminal wraps its lines at 120 columns
    assert "prompts: spec-bench, 13 in 13 categories" in said
    assert "the checkpoint's chat template was applied" in said
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert {x["category"] for x in rows if x["k"] == 1} == {"all", *{p.category for p in load_prompts("spec-bench", 13)}}
    k0 = json.loads((out / "k0.json").read_text())
    # the templated prompt is longer than the raw question by the template's tokens, counted once
    raw = load_prompts("spec-bench", 13)
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(BUILTIN_MODEL_DIR / "tokenizer.json"))
    assert k0["requests"][0]["num_prompt_tokens"] > len(t.encode(raw[0].text).ids)


def test_context_dimension_gives_rows_the_plot_and_says_when_the_window_is_too_small(tmp_path):
    out = tmp_path / "ctx"
    r = CliRunner().invoke(app, ["sweep", "--k", "0,2", "--modes", "chain", "--num-prompts", "4", "--max-tokens", "16",
                                 "--context-tokens", "0,256,4096", "--repeats", "1", "--out", str(out)])
    assert r.exit_code == 4, r.output  # partial: the 4096-token points failed (errors.PARTIAL)
    assert "partial: 4 of 6 points measured (failed: " in r.output and "-ctx4096" in r.output, r.output
    rows = [x for x in json.loads((out / "summary.json").read_text())["rows"] if x["k"] == 2]
    by_ctx = {x["context_tokens"]: x for x in rows}
    assert by_ctx[0]["status"] == "ok" and by_ctx[0]["context_tokens_actual"] == 0
    assert by_ctx[256]["status"] == "ok" and abs(by_ctx[256]["context_tokens_actual"] - 256) <= 2
    assert by_ctx[256]["acceptance_length"] > 1 and by_ctx[256]["position_bucket_start"]
    # the built-in model holds 2048 positions: the 4096-token point is refused, and says why
    assert by_ctx[4096]["status"] == "failed" and "max_position_embeddings is 2048" in by_ctx[4096]["error"]
    points = json.loads((out / "chain-L3-k2-ctx256.json").read_text())["requests"]
    assert all(q["context_tokens"] >= 254 and q["num_prompt_tokens"] > 254 for q in points)
    assert (out / "acceptance_vs_context.png").stat().st_size > 1000


def test_a_sweep_whose_every_point_failed_exits_partial_with_its_summary_written(tmp_path):
    """Nothing measured is not a result: a script reading the exit code must not take it for one."""
    out = tmp_path / "none"
    r = CliRunner().invoke(app, ["sweep", "--k", "0,2", "--modes", "chain", "--num-prompts", "2", "--max-tokens", "8",
                                 "--context-tokens", "4096", "--repeats", "1", "--out", str(out)])
    assert r.exit_code == 4, r.output  # errors.PARTIAL, never the code of a negative answer
    assert "every point of the sweep failed" in r.output
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert len(rows) == 2 and all(x["status"] == "failed" for x in rows)
