"""Errors a user can act on. The CLI prints these without a stack trace and maps them to exit codes."""


class HarnessError(Exception):
    """A problem with the user's input or configuration (exit code `exit_code`)."""

    exit_code = 1


class ConfigError(HarnessError):
    """Bad arguments, pipeline YAML or recipe."""

    exit_code = 2


class DataError(HarnessError):
    """Unreadable source, or nothing usable in it."""

    exit_code = 3


class ModelError(HarnessError):
    """A model that cannot be found or does not fit what loads it (e.g. encoder mismatch)."""

    exit_code = 4


class ClusterError(HarnessError):
    """Ray cannot be reached (a cluster's job API or GCS address) or a local Ray cannot start."""

    exit_code = 8
