"""AWS plumbing of the ``cluster`` and ``endpoint`` commands: sessions, SDK imports, errors.

boto3, botocore and sagemaker-core form the ``aws`` extra; every function here imports them when
it runs, never at import time, so ``maze-infra --help`` starts without them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import warnings
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from maze_infra.errors import (
    CredentialsError,
    InfraError,
    MissingExtraError,
    OperationError,
    ServiceUnreachableError,
    SpecError,
)

AWS_EXTRA = "pip install 'maze-infra[aws]'"
REGION_PATTERN = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d")
# Error codes with which AWS refuses the caller's credentials: missing, expired or invalid.
CREDENTIAL_CODES = frozenset(
    {
        "AuthFailure",
        "ExpiredToken",
        "ExpiredTokenException",
        "IncompleteSignature",
        "InvalidAccessKeyId",
        "InvalidClientTokenId",
        "InvalidSignatureException",
        "MissingAuthenticationToken",
        "MissingAuthenticationTokenException",
        "RequestExpired",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
    }
)
# Error codes with which AWS refuses an action to credentials it accepted.
PERMISSION_CODES = frozenset({"AccessDenied", "AccessDeniedException"})
_CREDENTIAL_HINT = (
    "(set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or log in with `aws sso login`)"
)


def aws_options(*, profile_and_endpoint: bool) -> argparse.ArgumentParser:
    """An argparse parent with ``--region`` and, if asked, ``--profile`` and ``--endpoint-url``.

    Args:
        profile_and_endpoint: Add ``--profile`` and ``--endpoint-url``; without them the
            commands take both from ``AWS_PROFILE`` and ``AWS_ENDPOINT_URL`` only.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--region", help="AWS region (default: AWS_REGION, AWS_DEFAULT_REGION, the profile's)"
    )
    if profile_and_endpoint:
        parser.add_argument("--profile", help="named profile of the shared AWS config")
        parser.add_argument(
            "--endpoint-url", help="SageMaker API endpoint to use instead of the region's"
        )
    return parser


def _missing_extra(exc: ImportError, needs: str) -> MissingExtraError:
    missing = exc.name or "a module"
    return MissingExtraError(
        f"{needs} need boto3 and sagemaker-core ({missing} is missing): {AWS_EXTRA}"
    )


def bounded_session(
    region: str | None,
    *,
    profile: str | None,
    endpoint_url: str | None,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_attempts: int,
    needs: str,
) -> Any:
    """A boto3 session whose every client has bounded timeouts and retries.

    sagemaker-core builds its own clients from the session it is given (asking for 10 retry
    attempts); the session's ``client()`` is the one place every client passes through, so it
    merges the bounds, and ``endpoint_url`` when given, into each.

    Args:
        region: AWS region; else ``AWS_REGION``, else what boto3 finds (``AWS_DEFAULT_REGION``,
            the profile).
        profile: A named profile of the shared AWS config (default: ``AWS_PROFILE``'s).
        endpoint_url: Another SageMaker endpoint (a VPC endpoint, an emulator); without it
            ``AWS_ENDPOINT_URL`` applies as usual.
        connect_timeout_s: Seconds to open a connection.
        read_timeout_s: Seconds to wait for a response.
        max_attempts: Attempts per call, the first included (unless ``AWS_MAX_ATTEMPTS`` or
            ``AWS_RETRY_MODE`` say otherwise).
        needs: What needs the extra, for the :class:`MissingExtraError` message.

    Returns:
        A ``boto3.session.Session`` with ``region_name`` set.

    Raises:
        MissingExtraError: The ``aws`` extra is not installed.
        CredentialsError: The profile does not exist.
        SpecError: No region is given or configured, or it is not an AWS region name.
    """
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import ProfileNotFound
    except ImportError as exc:
        raise _missing_extra(exc, needs) from exc
    options: dict[str, Any] = {"connect_timeout": connect_timeout_s, "read_timeout": read_timeout_s}
    if not (os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE")):
        options["retries"] = {"total_max_attempts": max_attempts, "mode": "standard"}
    bounded = Config(**options)  # only the options given here override a client's config

    class _BoundedSession(boto3.Session):
        def client(self, *args: Any, **kwargs: Any) -> Any:
            config = kwargs.get("config")
            kwargs["config"] = bounded if config is None else config.merge(bounded)
            if endpoint_url and not kwargs.get("endpoint_url"):
                kwargs["endpoint_url"] = endpoint_url
            return cast(Any, super()).client(*args, **kwargs)

    try:
        session: Any = _BoundedSession(
            region_name=region or os.environ.get("AWS_REGION") or None, profile_name=profile
        )
        resolved: str | None = session.region_name
    except ProfileNotFound as exc:
        raise CredentialsError(str(exc)) from exc
    if not resolved:
        raise SpecError(
            "no AWS region: set AWS_REGION (or AWS_DEFAULT_REGION) or pass --region", field="region"
        )
    if not REGION_PATTERN.fullmatch(resolved):
        raise SpecError(f"{resolved!r} is not an AWS region", field="region")
    return session


def sagemaker_core(*modules: str, needs: str) -> list[Any]:
    """sagemaker-core's modules ``sagemaker.core.<name>`` for each name, in order.

    Args:
        *modules: Module names under ``sagemaker.core``, e.g. ``"resources"``, ``"utils.utils"``.
        needs: What needs the extra, for the :class:`MissingExtraError` message.

    Raises:
        MissingExtraError: sagemaker-core is not installed.
    """
    try:
        with warnings.catch_warnings():
            # Its generated docstrings hold invalid escapes; compiling them warns on first import.
            warnings.simplefilter("ignore", SyntaxWarning)
            # The package first, as `from sagemaker.core import x` does: import_module returns
            # a submodule already in sys.modules without looking at its package.
            importlib.import_module("sagemaker.core")
            return [importlib.import_module(f"sagemaker.core.{name}") for name in modules]
    except ImportError as exc:
        raise _missing_extra(exc, needs) from exc


def one_line(text: str, max_chars: int | None = None) -> str:
    """``text`` on one line (white space folded), cut to ``max_chars`` with ``...`` if given."""
    text = " ".join(text.split())
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[: max_chars - 3] + "..."


def client_error(exc: Any) -> tuple[str, str]:
    """The error code and message of a botocore ``ClientError`` (empty strings where absent)."""
    err: dict[str, Any] = cast(dict[str, Any], exc.response).get("Error", {})
    code, message = str(err.get("Code") or ""), str(err.get("Message") or "")
    # A JSON-protocol client cannot parse an XML error body: the code is then the HTTP
    # status and the message the raw body.
    xml = re.search(r"<Code>([^<]+)</Code>(?:.*?<Message>([^<]*)</Message>)?", message, re.S)
    if xml:
        code, message = xml[1], xml[2] or message
    return code, message


def is_not_found(exc: BaseException) -> bool:
    """Whether ``exc`` is SageMaker's answer for a missing resource."""
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return False
    code, message = client_error(exc)
    message = message.lower()
    # The service says ResourceNotFound; some implementations a ValidationException.
    return code == "ResourceNotFound" or (
        code == "ValidationException" and ("not find" in message or "not found" in message)
    )


def noted(exc: InfraError, note: str) -> InfraError:
    """The same kind of error (same exit code), with ``note`` appended."""
    return type(exc)(f"{exc}; {note}")


@dataclass(frozen=True)
class ErrorStyle:
    """How a command group turns the SDKs' exceptions into one-line typed errors.

    Attributes:
        max_chars: Cut messages to this many characters (``None``: never).
        denied_is_credentials: Whether an AccessDenied answer is a :class:`CredentialsError`
            (exit 5) rather than an :class:`OperationError` (exit 1).
        invalid_model_is_input: Whether sagemaker-core's model validation failing means the
            request was malformed (:class:`SpecError`) rather than the answer
            (:class:`OperationError`).
    """

    max_chars: int | None
    denied_is_credentials: bool
    invalid_model_is_input: bool

    @contextmanager
    def calling(self, doing: str) -> Generator[None]:
        """Raises the typed error for an SDK exception raised inside; messages start with ``doing``.

        Raises:
            CredentialsError: Credentials are missing or refused.
            ServiceUnreachableError: The service does not answer.
            SpecError: The request is malformed or no region is set.
            OperationError: The service refused or failed the call.
        """
        try:
            yield
        except InfraError:
            raise
        except Exception as exc:
            typed = self._translate(exc, doing)
            if typed is None:
                raise
            raise typed from exc

    def _translate(self, exc: Exception, doing: str) -> InfraError | None:
        from botocore import exceptions as bex

        def line(text: str) -> str:
            return one_line(f"{doing}: {text}", self.max_chars)

        if isinstance(exc, bex.ClientError):
            code, message = client_error(exc)
            code, message = code or "Error", message or str(exc)
            if code in CREDENTIAL_CODES:
                return CredentialsError(line(f"credentials refused: {message}"))
            if self.denied_is_credentials and code in PERMISSION_CODES:
                return CredentialsError(line(f"{code}: {message}"))
            return OperationError(line(f"{code}: {message}"))
        credential_errors = (
            bex.NoCredentialsError,
            bex.PartialCredentialsError,
            bex.CredentialRetrievalError,
            bex.ProfileNotFound,
            bex.SSOError,
            bex.TokenRetrievalError,
        )
        if isinstance(exc, credential_errors):
            return CredentialsError(line(f"{exc} {_CREDENTIAL_HINT}"))
        if isinstance(exc, bex.ReadTimeoutError):
            return ServiceUnreachableError(line(f"no answer in time: {exc}"))
        if isinstance(exc, bex.ConnectionError | bex.HTTPClientError):  # refused, DNS, TLS, proxy
            return ServiceUnreachableError(line(str(exc)))
        if isinstance(exc, bex.NoRegionError):
            return SpecError(line(f"{exc}; set AWS_REGION or pass --region"))
        if isinstance(exc, bex.ParamValidationError):
            return SpecError(line(str(exc)))
        if isinstance(exc, bex.BotoCoreError):
            return OperationError(line(str(exc)))
        try:
            from pydantic import ValidationError
        except ImportError:  # pragma: no cover - pydantic comes with sagemaker-core
            return None
        if not isinstance(exc, ValidationError):
            return None
        errors = exc.errors()
        detail = (
            f"{'.'.join(str(part) for part in errors[0]['loc'])}: {errors[0]['msg']}"
            if errors
            else str(exc)
        )
        if self.invalid_model_is_input:
            return SpecError(line(f"sagemaker-core rejected {detail}"))
        return OperationError(line(f"unexpected answer: {detail}"))
