"""Prompt sets: the built-in code prompts, Spec-Bench and its MT-Bench subset (shipped in
``mtpbench/data``), any JSONL file (MT-Bench/Spec-Bench ``turns`` lines or ``{"prompt": ...}`` lines), a
ShareGPT-format ``.json`` file and vLLM's random dataset (``random``; both in ``mtpbench.datasets``).

A chat model is benchmarked on what it is served: ``prompt_set`` renders each question through the
checkpoint's own chat template (``--chat-template auto``, the default, when the checkpoint has one) with
``add_generation_prompt``, as vLLM's chat endpoint does; such a prompt is then tokenized without adding
special tokens again. Multi-turn questions use their first turn, and the set's notes say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mtpbench.backend_info import info
from mtpbench.errors import MtpBenchError
from mtpbench.paths import BUILTIN_MODEL_DIR, DATA_DIR, SPEC_BENCH  # noqa: F401 (the prompt sets' homes)

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
NAMED_SETS = ("builtin", "spec-bench", "mt-bench", "random")
BUILTIN_DEFAULT_PROMPTS = 8  # the built-in set's default size; every other set defaults to all of it
CHAT_TEMPLATE_MODES = ("auto", "none")


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str = "none"
    id: str = ""
    templated: bool = False  # rendered through a chat template: tokenize without adding special tokens
    context_tokens: int = 0  # tokens of held-out text put before the question (--context-tokens)
    source: str = ""  # where the prompt came from, when the set says (the built-in set's source file)


@dataclass
class PromptSet:
    prompts: list[Prompt]
    name: str
    notes: list[str] = field(default_factory=list)  # what the output should say about the prompts

    def describe(self) -> dict:
        import hashlib

        digest = hashlib.sha256("\0".join(f"{p.id}\0{p.text}" for p in self.prompts).encode()).hexdigest()[:16]
        return {"set": self.name, "num_prompts": len(self.prompts), "sha256": digest,
                "categories": sorted({p.category for p in self.prompts}), "notes": self.notes}


def _read(spec: str) -> tuple[list[Prompt], set[str]]:
    """Every prompt of a set or file, and the ids of the multi-turn ones (their first turn is kept)."""
    if spec == "builtin":
        path = BUILTIN_MODEL_DIR / "prompts.jsonl"
    elif spec in ("spec-bench", "mt-bench"):
        path = SPEC_BENCH
    elif spec == "random":
        raise MtpBenchError("--prompts random (vLLM's random dataset) is the workload of sweep, tune and "
                            "check-lossless: give this command a prompt set or file")
    else:
        path = Path(spec)
    if not path.is_file():
        raise MtpBenchError(f"prompts file not found: {path}")
    if path.suffix == ".json":
        from mtpbench.datasets import read_sharegpt

        return [Prompt(text, "sharegpt", id_) for id_, text in read_sharegpt(path)], set()
    try:
        text_lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise MtpBenchError(f"{path}: not UTF-8 text") from None
    out, multi = [], set()
    for lineno, line in enumerate(text_lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise MtpBenchError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise MtpBenchError(f"{path}:{lineno}: expected a JSON object")
        if isinstance(row.get("turns"), list) and row["turns"] and isinstance(row["turns"][0], str):
            text = row["turns"][0]
        elif isinstance(row.get("prompt"), str):
            text = row["prompt"]
        else:
            raise MtpBenchError(f"{path}:{lineno}: needs a 'prompt' string or a non-empty 'turns' list")
        if not text:
            raise MtpBenchError(f"{path}:{lineno}: empty prompt")
        category = str(row.get("category", "code" if spec == "builtin" else "none"))
        if spec == "mt-bench" and category not in MT_BENCH_CATEGORIES:
            continue
        out.append(Prompt(text, category, str(row.get("question_id", row.get("id", lineno))),
                          source=str(row.get("source", ""))))
        if isinstance(row.get("turns"), list) and len(row["turns"]) > 1:
            multi.add(out[-1].id)
    if not out:
        raise MtpBenchError(f"{path}: no prompts")
    return out, multi


def _select(prompts: list[Prompt], n: int) -> list[Prompt]:
    """``n`` prompts spread over the categories (round robin), kept in file order."""
    by_cat: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        by_cat.setdefault(p.category, []).append(i)
    chosen: list[int] = []
    depth = 0
    while len(chosen) < n:
        for idx in by_cat.values():
            if depth < len(idx) and len(chosen) < n:
                chosen.append(idx[depth])
        depth += 1
    return [prompts[i] for i in sorted(chosen)]


def load_prompts(spec: str, num_prompts: int | None = None) -> list[Prompt]:
    """``num_prompts`` of a set or JSONL file (default: the built-in set's 8, every other set whole);
    asking for more than the set has is an error naming both numbers."""
    return _load(spec, num_prompts)[0]


def _load(spec: str, num_prompts: int | None) -> tuple[list[Prompt], set[str]]:
    prompts, multi = _read(spec)
    if num_prompts is None:
        num_prompts = min(BUILTIN_DEFAULT_PROMPTS, len(prompts)) if spec == "builtin" else len(prompts)
    if num_prompts > len(prompts):
        raise MtpBenchError(f"--num-prompts {num_prompts}: the prompt set {spec} has {len(prompts)} prompts")
    chosen = _select(prompts, num_prompts)
    return chosen, multi & {p.id for p in chosen}


def load_tokenizer(model_dir):
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise MtpBenchError(f"{model_dir} has no tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises its own exception types
        raise MtpBenchError(f"{path}: cannot load tokenizer ({str(e)[:200]})") from None


def token_ids(tokenizer, prompts: list[Prompt]) -> list[list[int]]:
    """Each prompt's token ids as every backend sends them: a prompt rendered through the chat template already
    holds its special tokens, any other gets the tokenizer's."""
    return [tokenizer.encode(p.text, add_special_tokens=not p.templated).ids for p in prompts]


def with_context(prompts: list[Prompt], spec: str, n_tokens: int, tokenizer) -> list[Prompt]:
    """Each prompt preceded by ``n_tokens`` tokens of real text held out from the measurement: prompts of
    the same set that are not measured in this run, then (if those run short) measured ones, never the
    prompt itself nor one from the same source (the built-in fragments come three per file, and one can
    hold the next one's answer). Each prompt starts its prefix at a different place in that text, so
    prefixes differ from prompt to prompt (no prefix cache serves them). The prefix is cut at a token
    boundary; ``context_tokens`` records its actual length as the tokenizer reads it back."""
    if n_tokens <= 0:
        return list(prompts)
    pool, _ = _read(spec)
    measured = {p.id for p in prompts}
    ordered = [q for q in pool if q.id not in measured] + [q for q in pool if q.id in measured]
    out = []
    for i, p in enumerate(prompts):
        usable = [q.text for q in ordered if q.id != p.id and (not p.source or q.source != p.source)]
        usable = usable or [q.text for q in ordered if q.id != p.id] or [q.text for q in pool]
        ids: list[int] = []
        j = i  # a different starting place for each prompt
        while len(ids) < n_tokens:  # round and round if the set is short
            ids += tokenizer.encode(usable[j % len(usable)] + "\n\n", add_special_tokens=False).ids
            j += 1
        prefix = tokenizer.decode(ids[:n_tokens], skip_special_tokens=False)
        actual = len(tokenizer.encode(prefix, add_special_tokens=False).ids)
        out.append(Prompt(prefix + "\n\n" + p.text, p.category, p.id, p.templated, actual, p.source))
    return out


def prompt_set(spec: str, num_prompts: int | None = None, model_dir: Path | None = None,
               chat_template: str = "auto", context_tokens: int = 0) -> PromptSet:
    """The prompts a run measures, with ``context_tokens`` of held-out text before each question, through
    the checkpoint's chat template where it has one (``auto``)."""
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise MtpBenchError(f"--chat-template takes auto or none, got {chat_template!r}")
    prompts, multi = _load(spec, num_prompts)
    if context_tokens:
        if model_dir is None:
            raise MtpBenchError("--context-tokens needs the model's tokenizer on this machine")
        prompts = with_context(prompts, spec, context_tokens, load_tokenizer(model_dir))
    notes = []
    if multi:
        notes.append(f"{len(multi)} multi-turn question(s) use their first turn only")
    template = chat_template_of(model_dir) if chat_template == "auto" and model_dir is not None else None
    if template is not None:
        special = special_tokens(model_dir)
        prompts = [Prompt(render(template, [{"role": "user", "content": p.text}], special), p.category, p.id, True,
                          p.context_tokens, p.source) for p in prompts]
        notes.append("the checkpoint's chat template was applied (--chat-template none for raw text)")
    elif chat_template == "auto" and model_dir is not None and spec != "builtin":
        notes.append("the checkpoint has no chat template: prompts are raw text")
    return PromptSet(prompts, spec, notes)


# ---- chat templates ----------------------------------------------------------------------------------

def _tokenizer_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "tokenizer_config.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise MtpBenchError(f"{path} is not valid JSON") from None


def chat_template_of(model_dir: Path) -> str | None:
    """The checkpoint's default chat template: ``chat_template.jinja``, ``chat_template.json`` or
    ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named templates)."""
    model_dir = Path(model_dir)
    if (model_dir / "chat_template.jinja").is_file():
        return (model_dir / "chat_template.jinja").read_text()
    for source in (model_dir / "chat_template.json", model_dir / "tokenizer_config.json"):
        if not source.is_file():
            continue
        value = (_tokenizer_config(model_dir) if source.name == "tokenizer_config.json"
                 else json.loads(source.read_text())).get("chat_template")
        if isinstance(value, list):
            value = next((t.get("template") for t in value if t.get("name") == "default"), None)
        if isinstance(value, str) and value:
            return value
    return None


def special_tokens(model_dir: Path) -> dict:
    """bos_token, eos_token, ... as strings, the variables chat templates read."""
    cfg = _tokenizer_config(model_dir)
    out = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def render(template: str, messages: list[dict], special: dict) -> str:
    """Render a Hugging Face chat template the way transformers does (sandboxed jinja2, trimmed blocks,
    ``raise_exception``, ``tojson``, ``strftime_now``), with ``add_generation_prompt``."""
    from datetime import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True, **special)
    except jinja2.exceptions.TemplateError as e:
        raise MtpBenchError(f"the checkpoint's chat template failed: {e}") from None


def batches(prompts: list[Prompt], batch_size: int) -> list[list[Prompt]]:
    """Batches that never mix categories, so per-category timing is exact."""
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    return [g[i: i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]


def run_prompts(cfg, context_tokens: int = 0) -> PromptSet:
    """A run's prompts as its config (a ``config.SweepConfig``) asks for them (a sweep's, a check's), with ``context_tokens`` of held-out text first, through the model's chat template
    unless the server applies its own (--api chat) or its files are not here (an attached server)."""
    local = None if cfg.server else cfg.model_dir
    if cfg.prompts == "random":
        return random_set(cfg)
    if info(cfg.backend).served and cfg.api == "chat":
        pset = prompt_set(cfg.prompts, cfg.num_prompts, local, "none", context_tokens)
        pset.notes.append("the server applies its chat template (--api chat)")
    elif cfg.server:
        pset = prompt_set(cfg.prompts, cfg.num_prompts, None, "none", context_tokens)
        if cfg.chat_template == "auto":
            pset.notes.append("no chat template applied: an attached server's files are not read over "
                              "/v1/completions (--api chat has the server apply its own)")
    else:
        pset = prompt_set(cfg.prompts, cfg.num_prompts, cfg.model_dir, cfg.chat_template, context_tokens)
    return pset


def random_set(cfg) -> PromptSet:
    """vLLM's random dataset (``mtpbench.datasets``) as a run's config asks for it: ``num_prompts`` (default the
    built-in set's 8) random-token prompts of the model's tokenizer, seeded by ``seed``, as raw text."""
    from mtpbench.datasets import length_range, random_token_prompts

    n = cfg.num_prompts or BUILTIN_DEFAULT_PROMPTS
    tokenizer = load_tokenizer(cfg.model_dir)
    made = random_token_prompts(tokenizer, n, cfg.random_input_len, cfg.random_range_ratio, cfg.seed)
    low, high = length_range(cfg.random_input_len, cfg.random_range_ratio,
                             len(tokenizer.encode("", add_special_tokens=True).ids))
    prompts = [Prompt(text, "random", f"random-{i}") for i, (text, _) in enumerate(made)]
    note = (f"vLLM's random dataset: prompts of {low}-{high} random tokens (seed {cfg.seed}), each output "
            f"{cfg.max_tokens} tokens; no chat template")
    return PromptSet(prompts, "random", [note])
