"""Typed errors; each carries the exit code ``maze-infra`` returns for it."""

from __future__ import annotations


class InfraError(Exception):
    """Base class of every error this package raises on purpose."""

    exit_code = 1


class SpecError(InfraError):
    """A cluster spec, endpoint spec or dashboard input is malformed; the message names the field."""

    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class MissingExtraError(InfraError):
    """A command needs an optional extra (``aws``, ``dashboards``) that is not installed."""

    exit_code = 3


class ServiceUnreachableError(InfraError):
    """The AWS or Grafana endpoint does not answer."""

    exit_code = 4


class CredentialsError(InfraError):
    """Credentials are missing, expired or refused."""

    exit_code = 5


class OperationError(InfraError):
    """The service refused or failed the operation; anything half-created was rolled back."""

    exit_code = 1
