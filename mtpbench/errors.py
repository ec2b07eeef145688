"""The one domain exception. The CLI turns it into a one-line message and exit code 2."""


class MtpBenchError(Exception):
    """Bad input or an unusable model/config: the message names the problem in one line."""
