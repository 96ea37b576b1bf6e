"""Errors and exit codes. Exit codes are defined here and nowhere else.

EXIT_OK (0): nothing at or above ``--fail-on``; EXIT_FINDINGS (1): findings at or above it;
EXIT_USAGE (2): unusable input, usage error or rule-load error (one-line message on stderr);
EXIT_NOTHING_IN_RANGE (3): ``diagnose --since`` / ``--until``: no line of the logs fell in that span,
so nothing was judged (neither healthy nor not; the report says when the logs begin and end).
"""

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_NOTHING_IN_RANGE = 3


class VllmDoctorError(Exception):
    """Base of vllm-doctor's own errors; ``str(e)`` is a one-line message for the user."""


class RuleLoadError(VllmDoctorError):
    """A rule file is invalid: bad YAML, unknown field or name, duplicate id or name."""


class InputError(VllmDoctorError):
    """An input cannot be read: missing file, a directory, permission denied, not a log."""
