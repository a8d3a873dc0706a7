"""database.failure / database.transient: what a failure to reach PostgreSQL is called, and whether the start
waits for it ([history] wait). Real asyncpg exception classes (their SQLSTATEs), raised in chains as SQLAlchemy
and asyncio raise them."""

from __future__ import annotations

import socket

import asyncpg
import pytest
from sqlalchemy.exc import OperationalError

from backend.storage import database


def raised(exc: BaseException, wrap: bool) -> BaseException:
    """``exc`` as it reaches open_history: bare, or inside SQLAlchemy's OperationalError (``orig``)."""
    if not wrap:
        return exc
    try:
        try:
            raise exc
        except BaseException as inner:
            raise OperationalError("connect", {}, inner) from inner
    except OperationalError as outer:
        return outer


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize(
    "exc, transient, words",
    [
        (ConnectionRefusedError(111, "Connection refused"), True, "connection refused"),
        (TimeoutError(), True, "no answer within"),
        (socket.gaierror(-2, "Name or service not known"), True, "cannot connect (Name or service not known)"),
        (asyncpg.CannotConnectNowError("the database system is starting up"), True, "starting up"),
        (asyncpg.InvalidPasswordError("password authentication failed"), False, "authentication failed"),
        (asyncpg.InvalidCatalogNameError('database "x" does not exist'), False, "unknown database"),
        (asyncpg.InvalidAuthorizationSpecificationError("no pg_hba.conf entry"), False, "authentication refused"),
        (asyncpg.TooManyConnectionsError("too many clients"), False, "TooManyConnectionsError"),
        (ValueError("bad"), False, "ValueError: bad"),
    ],
)
def test_each_failure_is_named_and_only_the_ones_waiting_may_cure_are_transient(exc, transient, words, wrap):
    err = raised(exc, wrap)
    assert database.transient(err) is transient
    assert words in database.failure(err)


def test_a_server_answer_inside_an_os_error_chain_is_not_transient():
    """A wrong password seen while a socket error is also in the chain: the server answered, waiting won't help."""
    try:
        try:
            raise ConnectionResetError(104, "reset")
        except ConnectionResetError:
            raise asyncpg.InvalidPasswordError("password authentication failed") from None
    except asyncpg.InvalidPasswordError as exc:
        exc.__context__ = ConnectionResetError(104, "reset")
        assert not database.transient(exc) and "authentication failed" in database.failure(exc)


@pytest.mark.parametrize("url", ["postgresql://qw:s3cret@db:99999/h", "postgresql+asyncpg://qw:s3cret@db:abc/h"])
def test_a_url_with_a_bad_port_is_a_config_error_without_its_password(url):
    from pathlib import Path

    from backend.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        database.from_setting(url, Path("/unused"))
    assert "history.db" in str(info.value) and "s3cret" not in str(info.value)
