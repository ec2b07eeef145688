"""Help a person reads at 80 columns, plain text (no markup to eat brackets, no box to cut a name).

``-h`` is the brief help (as ripgrep's): the usage, the command's first sentence, then its options by group, one line
each, an option's help cut to its first sentence and to the line; ``--help`` gives every option in full, each name on
its own line and its whole help wrapped under it, with its default. docs/options.md lists every option by command.

``GROUPS`` places an option in a group by its parameter name: an option group's fields (``options.grouped``
records them) and the named sets below; the rest are the command's own ("Options")."""

from __future__ import annotations

import re
import shutil
import textwrap

from mtpbench.errors import EXIT_CODES

GROUPS: dict[str, str] = {}  # parameter name -> group title (options.grouped fills in the option groups' fields)
CLASS_TITLES = {"Workload": "Workload", "SweepWorkload": "Workload", "Earlier": "Output", "Rounds": "Rounds and noise",
                "Parallel": "Parallelism", "ServerAccess": "Reaching a server", "Reporting": "Reporting",
                "Served": "Serving"}
NAMED = {
    "What to measure": ("k", "mtp_layers", "mode", "repeats", "temperature", "batch_size", "seed", "max_tokens",
                        "num_prompts", "law"),
    "Engine": ("backend", "device", "dtype", "max_model_len", "engine_arg", "speculative_config", "threads",
               "force_spec_step_idx", "runner", "draft_model", "method", "profile"),
    "Output": ("out", "replace_earlier", "wide", "dry_run", "force"),
}
BY_NAME = {n: title for title, ns in NAMED.items() for n in ns}  # where no option group holds the name
ORDER = ["Arguments", "What to measure", "Workload", "Engine", "Parallelism", "Rounds and noise", "Serving",
         "Reaching a server", "Reporting", "Output", "Options", "Help"]
DOCS = "docs/options.md"


def width() -> int:
    """The terminal's width (COLUMNS where set; 80 through a pipe), at least 60."""
    return max(60, shutil.get_terminal_size((80, 24)).columns)


def names(p) -> str:
    """Every name of an option ("--batch-size, --max-num-seqs"; a switch "--aa-control/--no-aa-control"), or an
    argument's name in capitals."""
    if getattr(p, "param_type_name", "") == "argument":
        return p.name.upper()
    opts = ", ".join(p.opts)
    return opts + ("/" + ", ".join(p.secondary_opts) if p.secondary_opts else "")


# options whose default is the size of a run, set by each command for what it runs (how many prompts, tokens,
# repeats, sequences, loads; how many MTP layers there are; where the files go): the one kind of option whose
# default may differ between commands (with --dtype, see options_md)
SIZES = ("--num-prompts", "--max-tokens", "--repeats", "--batch-size", "--max-concurrency", "--num-mtp-layers",
         "--out")


def default_text(p) -> str | None:
    """The default as help prints it (an option's show_default text, or its value), None where there is none."""
    shown = p.show_default
    if isinstance(shown, str):
        return shown
    if getattr(p, "is_flag", False) and p.default is False:
        return "off"
    if shown is False or p.default is None or p.default == () or p.default == []:
        return None
    return ",".join(map(str, p.default)) if isinstance(p.default, (list, tuple)) else str(p.default)


def sections(params) -> list[tuple[str, list]]:
    """The parameters by group, in ``ORDER``, each group in the command's own order; hidden ones left out."""
    out: dict[str, list] = {}
    for p in params:
        if getattr(p, "hidden", False):
            continue
        if getattr(p, "param_type_name", "") == "argument":
            group = "Arguments"
        elif p.name in ("help", "brief_help"):
            group = "Help"
        else:
            group = GROUPS.get(p.name) or BY_NAME.get(p.name, "Options")
        out.setdefault(group, []).append(p)
    return [(g, out[g]) for g in ORDER if g in out] + [(g, ps) for g, ps in out.items() if g not in ORDER]


def first_sentence(text: str) -> str:
    """Up to the first ". " (or all of it), whitespace collapsed."""
    text = " ".join((text or "").split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!vs)\.(\s|$)", text)
    return text[: m.start() + 1] if m else text


def fit(text: str, room: int) -> str:
    """``text`` within ``room`` characters: whole where it fits, else cut at the last word that fits, with "…"."""
    if len(text) <= room:
        return text
    cut = text[: max(0, room - 1)].rsplit(" ", 1)[0].rstrip(",;:(")
    return cut + "…"


def brief(usage: str, about: str, params, command: str, w: int | None = None) -> str:
    """``-h``: one line an option."""
    w = w or width()
    lines = [usage, "", *textwrap.wrap(first_sentence(about), w), "",
             *textwrap.wrap(f"Brief help: each option's first sentence. In full: {command} --help; every option of "
                            f"every command: {DOCS}.", w)]
    for title, ps in sections(params):
        lines += ["", f"{title}:"]
        col = min(26, max(len(names(p)) for p in ps))
        for p in ps:
            name = names(p)
            room = w - 2 - max(col, len(name)) - 2
            say = first_sentence(p.help or "")
            if room < 12:  # a long name: its words on the next line
                lines += [f"  {name}", f"      {fit(say, w - 6)}"] if say else [f"  {name}"]
            else:
                lines.append(f"  {name:<{col}}  {fit(say, room)}".rstrip())
    return "\n".join(lines) + "\n"


def full(usage: str, about: str, params, w: int | None = None) -> str:
    """``--help``: every option's whole help, wrapped, and its default."""
    w = w or width()
    lines = [usage, ""]
    for para in (about or "").split("\n\n"):
        lines += [*textwrap.wrap(" ".join(para.split()), w), ""]
    for title, ps in sections(params):
        lines.append(f"{title}:")
        for p in ps:
            metavar = "" if getattr(p, "is_flag", False) else _metavar(p)
            lines.append(f"  {names(p)} {metavar}".rstrip())
            text = " ".join((p.help or "").split())
            d = default_text(p)
            if d is not None:
                text += f" [default: {d}]"
            lines += textwrap.wrap(text, w - 6, initial_indent="      ", subsequent_indent="      ",
                                   break_on_hyphens=False, break_long_words=False) or []
        lines.append("")
    return "\n".join(lines)


def _metavar(p) -> str:
    """An option's value as help names it: its metavar, else its type (TEXT, INT, FLOAT, PATH)."""
    if getattr(p, "param_type_name", "") == "argument":
        return ""
    if p.metavar:
        return p.metavar
    import typing

    kind = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    word = {str: "TEXT", int: "INT", float: "FLOAT", bool: "BOOL"}
    if typing.get_origin(kind) in (list, tuple):  # given once per value
        return word.get((typing.get_args(kind) or (str,))[0], "TEXT") + " (repeatable)"
    return word.get(kind, getattr(kind, "__name__", "VALUE").upper())


def commands_brief(usage: str, about: str, commands: list[tuple[str, str]], w: int | None = None,
                   full_about: bool = False) -> str:
    """The top-level help: what mtpbench is, then each command in a line (``full_about``: the whole description)."""
    w = w or width()
    paras = (about or "").split("\n\n")
    lines = [usage, ""]
    for para in (paras if full_about else paras[:1]):
        lines += [*textwrap.wrap(" ".join(para.split()), w), ""]
    lines.append("Commands:")
    col = max(len(n) for n, _ in commands)
    for n, text in commands:
        lines.append(f"  {n:<{col}}  {fit(first_sentence(text), w - col - 4)}".rstrip())
    lines += ["", *textwrap.wrap("Each command's options: mtpbench COMMAND -h (brief) or --help (in full); every "
                                 f"option of every command: {DOCS}; the model runners: docs/runners.md.", w)]
    lines += ["", "Exit codes (every command):", *(fit(f"  {code:>3}  {meaning}", w) for code, meaning in EXIT_CODES)]
    return "\n".join(lines) + "\n"


def options_markdown(root, commands: list[str]) -> str:
    """docs/options.md: every option of every command, by command (its help in full, its value and default), and
    an index of the option names that several commands share. ``root``: the click group; the text is what
    ``benchmarks/options_md.py`` prints, and tests/unit/test_help.py checks the file against it."""
    lines = ["# Every option, by command", "",
             "Generated from the code (`python benchmarks/options_md.py > docs/options.md`; tests/unit/test_help.py "
             "checks this file against it). `mtpbench COMMAND -h` lists a command's options one line each; "
             "`--help` prints them as below.", "",
             "One vocabulary: a name takes the same kind of value, means the same thing and has the same default in "
             "every command that has it (tests/unit/test_help.py checks), except the size of a run (" +
             ", ".join(f"`{n}`" for n in SIZES) + ": how much each command runs, set for what it runs; the index "
             "below) and `--dtype`, which a check (check-lossless, check-drafter) runs at float32 on every backend, "
             "for it compares numbers to a rounding bound. Where one command takes a list and another one value, "
             "the names differ: `--k 0,1,2,3` (sweep, tune) and `--num-speculative-tokens N` (vLLM's name; "
             "trace-layers, trace-matrix, check-lossless, check-drafter; default 2L, twice the MTP layers drafted "
             "with); `--mtp-layers 1,2,3` (sweep) and `--num-mtp-layers N`; `--modes reuse,chain` (sweep) and "
             "`--mode reuse`; `--batch-sizes 1,4,16` (tune) and `--batch-size N`. `--temperature` is the "
             "temperature sweep and tune decode at, default 0.0 (greedy) as in `vllm bench serve`; check-lossless's "
             "is `--check-temperature`, default 1.0: it checks the sampled law (0 checks greedy tokens). Given the "
             "other command's name, a command says which of its own to use. `--server` is repeatable wherever it is "
             "taken (each server's k read from it), `--out` is also `--result-dir`.", ""]
    seen: dict[str, list[tuple[str, str]]] = {}
    body = []
    for name in commands:
        cmd = root.commands[name]
        ctx = cmd.make_context(name, [], resilient_parsing=True)
        body += [f"## {name}", "", " ".join((cmd.help or "").split()), "",
                 "| option | value | default | what it does |", "|---|---|---|---|"]
        for title, ps in sections(cmd.get_params(ctx)):
            for p in ps:
                label = names(p)
                value = "" if getattr(p, "is_flag", False) else _metavar(p)
                d = default_text(p)
                seen.setdefault(label, []).append((name, ", ".join(x for x in (value, d and f"default {d}") if x)))
                cell = " ".join((p.help or "").split()).replace("|", "\\|")
                body.append(f"| `{label}` | {value} | {'' if d is None else d.replace('|', '/')} | "
                            f"{title}: {cell} |")
        body.append("")
    shared = sorted((label, cs) for label, cs in seen.items() if len(cs) > 1 and label not in ("-h", "--help"))
    lines += ["## Options several commands take", "", "Each with the value it takes and its default in each command.",
              "", "| option | commands (value, default) |", "|---|---|"]
    lines += [f"| `{label}` | " + "; ".join(f"{c} ({how})" if how else c for c, how in cs).replace("|", "/") + " |"
              for label, cs in shared] + [""]
    return "\n".join(lines + body)

