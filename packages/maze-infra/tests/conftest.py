"""Shared fixtures of maze-infra's tests."""

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """A moto server on 127.0.0.1 (a free port) for the whole session; yields its endpoint URL.

    Its state is shared by every test of the session: use unique resource names. Point boto3 at
    it with ``AWS_ENDPOINT_URL`` and dummy credentials.
    """
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request to stderr; tests assert on what the commands print there.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
