"""The domain exceptions, and the exit codes every command uses (one meaning each; README and ``mtpbench -h`` print
``EXIT_CODES``). The CLI turns MtpBenchError into a one-line message and exit code 2."""

OK = 0  # done: the command ran and, where it answers a question, the answer is the good one
NEGATIVE = 1  # the check's negative answer: lossy, worse beyond noise, the drafter differs, not the verdict expected
BAD_INPUT = 2  # bad input or an unusable model or config: one line names it, nothing half-written
INCONCLUSIVE = 3  # the check ran but could not decide (check-lossless, check-drafter)
PARTIAL = 4  # results written, but some points failed or are missing: the folder is partial
INTERRUPTED = 130  # stopped by Ctrl-C (SIGINT), as a shell reports it (128 + 2)
TERMINATED = 143  # stopped by SIGTERM (a scheduler's preemption; 128 + 15)

EXIT_CODES = ((OK, "done"), (NEGATIVE, "the check's negative answer: lossy, worse, differs, not as expected"),
              (BAD_INPUT, "bad input: one line names it, nothing half-written"),
              (INCONCLUSIVE, "the check could not decide (inconclusive)"),
              (PARTIAL, "partial: some points failed or are missing (said, and in the folder)"),
              (INTERRUPTED, "interrupted by Ctrl-C (SIGINT)"), (TERMINATED, "stopped by SIGTERM"))


def exit_codes_text() -> str:
    """The table as ``mtpbench -h`` and the README print it: one line a code."""
    return "\n".join(f"{code:>3}  {meaning}" for code, meaning in EXIT_CODES)


class MtpBenchError(Exception):
    """Bad input or an unusable model/config: the message names the problem in one line."""


class Unavailable(Exception):
    """A backend cannot measure this here (an optional part of a check); the message says why."""
