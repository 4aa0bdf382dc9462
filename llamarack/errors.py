"""Errors llamarack raises (all pyinfra errors, so its CLI prints them cleanly), and ``Failure``:
what a rule or a plan refuses, in the words every refusal has."""

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Failure:
    rule: str
    found: str
    needed: str
    fix: str

    def message(self, host: str) -> str:
        return f"{host}: {self.rule}: found {self.found}; needed {self.needed}. Fix: {self.fix}"
