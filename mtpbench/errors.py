"""The domain exceptions. The CLI turns MtpBenchError into a one-line message and exit code 2."""


class MtpBenchError(Exception):
    """Bad input or an unusable model/config: the message names the problem in one line."""


class Unavailable(Exception):
    """A backend cannot measure this here (an optional part of a check); the message says why."""
