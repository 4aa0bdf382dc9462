"""Errors llamarack raises. All are pyinfra errors, so its CLI prints them cleanly."""

from pyinfra.api.exceptions import DeployError


class SettingsError(DeployError):
    """A host's data cannot become settings; raised before any host is touched."""

    def __init__(self, host: str, problems: list[str]):
        self.host = host
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"bad settings for host {host}:\n{lines}")


class ModelSourceError(DeployError):
    """The model's source cannot be listed or does not hold what the settings pin."""
