"""The app's database: SQLite (a file, the embedded default) or PostgreSQL (several UI processes, one history).

    db = database.from_setting(settings.history.db, default_file)   # ConfigError on a URL of another kind
    db.safe                                  # the URL with the password as ***: for logs and messages
    db.async_url                             # what Chainlit's SQLAlchemyDataLayer gets (aiosqlite / asyncpg)
    store = database.store(db)               # sync access for preferences, votes, the schema (any thread)
    store.run(lambda conn: conn.execute(...))   # one transaction; SQLAlchemy Core on a sync Connection
    database.ensure_tables(store, metadata, "history", version)  # create / upgrade, idempotent, race-free
    database.failure(exc)                    # "connection refused" / "authentication failed" / ... for a log line
    database.transient(exc)                  # True: refused, no answer, starting up (worth waiting for)
    database.cause(exc)                      # "locked" / "full" / "down" / "slow" / "error": why a write failed

SQLite runs on SQLAlchemy's sync pysqlite engine (one connection per call, WAL, busy timeout), as the raw
sqlite3 code did before. PostgreSQL has only an async driver here (asyncpg, which Chainlit's data layer uses
too): its engine lives on one event loop in a daemon thread of its own, and ``Store.run`` hands a sync
function to it (``AsyncConnection.run_sync``), so the callers stay plain sync code run in
``asyncio.to_thread``, on either database.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Column, Integer, MetaData, Table, Text, event, inspect, text
from sqlalchemy.engine import URL, Connection, Engine, create_engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex, CreateTable

from backend.errors import ConfigError
from backend.settings import HISTORY_DB_FORMS, without_password

logger = logging.getLogger(__name__)

T = TypeVar("T")
BUSY_TIMEOUT_MS = 5000  # SQLite: another connection writing: wait this long before "database is locked"
CONNECT_TIMEOUT = 5.0  # PostgreSQL: seconds to connect (asyncpg's own default is 60)
STARTING_UP = "57P03"  # PostgreSQL's SQLSTATE for "the database system is starting up" (cannot_connect_now)
CALL_TIMEOUT = 30.0  # PostgreSQL: a sync call waits at most this long for its transaction
SCHEMA_TABLE = "qwenchat_schema"  # one row per schema (name, version)
_LOCK_KEY = 0x7177656E63686174  # "qwenchat": pg_advisory_xact_lock key around the DDL


@dataclass(frozen=True)
class Database:
    """Where the history (and, on PostgreSQL, the preferences, votes and login secret) live."""

    url: URL  # with the async driver: sqlite+aiosqlite or postgresql+asyncpg

    @property
    def kind(self) -> str:
        return "postgresql" if self.url.get_backend_name() == "postgresql" else "sqlite"

    @property
    def is_postgres(self) -> bool:
        return self.kind == "postgresql"

    @property
    def path(self) -> Path | None:
        """The SQLite file; None on PostgreSQL."""
        return None if self.is_postgres else Path(self.url.database or "")

    @property
    def async_url(self) -> str:
        return self.url.render_as_string(hide_password=False)

    @property
    def connect_args(self) -> dict[str, Any]:
        """For ``create_async_engine`` (Chainlit's data layer too): PostgreSQL gives up connecting after
        ``CONNECT_TIMEOUT`` s instead of asyncpg's 60 (a dead server must not hold a chat for a minute)."""
        return {"timeout": CONNECT_TIMEOUT} if self.is_postgres else {}

    @property
    def safe(self) -> str:
        """The URL for logs and messages: never the password."""
        return safe_url(self.url)


def safe_url(url: URL | str) -> str:
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except (ArgumentError, ValueError):
        return without_password(str(url)) if "://" in str(url) else "(not a URL)"
    return parsed.render_as_string(hide_password=True)


def sqlite_file(path: Path) -> Database:
    return Database(URL.create("sqlite+aiosqlite", database=str(path)))


def from_setting(value: str, default_file: Path) -> Database:
    """``[history].db``: empty = ``default_file``; a path = that SQLite file; or a SQLAlchemy URL."""
    value = value.strip()
    if not value:
        return sqlite_file(default_file)
    if "://" not in value:
        return sqlite_file(Path(value).expanduser().resolve())
    try:
        url = make_url(value)
        port = url.port
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigError("history.db", safe_url(value), HISTORY_DB_FORMS) from None
    if port is not None and not 0 < port < 65536:
        raise ConfigError("history.db", safe_url(url), "a port from 1 to 65535: " + HISTORY_DB_FORMS)
    if url.drivername in ("sqlite", "sqlite+aiosqlite", "sqlite+pysqlite") and url.database:
        return sqlite_file(Path(url.database).expanduser().resolve())
    if url.drivername in ("postgresql", "postgresql+asyncpg"):
        if not url.host or not url.database:
            raise ConfigError("history.db", safe_url(url), "a host and a database name: " + HISTORY_DB_FORMS)
        return Database(url.set(drivername="postgresql+asyncpg"))
    raise ConfigError("history.db", safe_url(url), HISTORY_DB_FORMS)


# ---------------------------------------------------------------- sync access from any thread


class Store:
    """Runs sync SQLAlchemy Core functions in one transaction each, on SQLite or PostgreSQL."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._aengine: AsyncEngine | None = None
        self._engine: Engine | None = None
        if not db.is_postgres:
            self._engine = create_engine(f"sqlite:///{db.path}", poolclass=NullPool, hide_parameters=True)
            event.listen(self._engine, "connect", sqlite_pragmas)

    def run(self, fn: Callable[[Connection], T]) -> T:
        """``fn(conn)`` in one transaction: committed, or rolled back on an error (which is raised)."""
        if self._engine is not None:
            with self._engine.begin() as conn:
                return fn(conn)
        return self._call(self._arun(fn))

    async def _arun(self, fn: Callable[[Connection], T]) -> T:
        assert self._aengine is not None
        async with self._aengine.begin() as conn:
            return await conn.run_sync(fn)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._start()
        return asyncio.run_coroutine_threadsafe(coro, loop).result(CALL_TIMEOUT)

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="qwenchat-db", daemon=True).start()
                self._aengine = create_async_engine(
                    self.db.async_url,
                    connect_args=self.db.connect_args,
                    hide_parameters=True,
                    pool_pre_ping=True,  # a server restarted since: a fresh connection, not an error
                    pool_size=2,
                    max_overflow=4,
                )
                self._loop = loop
            return self._loop

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
        if self._loop is not None and self._aengine is not None:
            asyncio.run_coroutine_threadsafe(self._aengine.dispose(), self._loop).result(CALL_TIMEOUT)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = self._aengine = None


def sqlite_pragmas(dbapi_connection: Any, _record: Any = None) -> None:
    """On each new SQLite connection (sync here, aiosqlite in Chainlit's data layer): WAL, so readers never wait
    for a writer, and a busy timeout, so two writers wait instead of failing."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


@functools.cache
def _store(url: str) -> Store:
    return Store(Database(make_url(url)))


def store_at(where: Path | Store) -> Store:
    """A store given as itself, or as a SQLite file's path (preferences, votes)."""
    return where if isinstance(where, Store) else store(sqlite_file(where))


def store(db: Database) -> Store:
    """One store per database in this process (PostgreSQL: one pool, one loop thread)."""
    if not db.is_postgres and db.path is not None:
        db.path.parent.mkdir(parents=True, exist_ok=True)
    return _store(db.async_url)


# ---------------------------------------------------------------- schema: create and upgrade


def ensure_tables(st: Store, metadata: MetaData, name: str, version: int) -> list[str]:
    """Create the tables of ``metadata`` and add the columns an older database lacks; record ``version``
    under ``name`` in ``qwenchat_schema``. Idempotent; on PostgreSQL under an advisory lock, so two UI
    processes starting at once do not race. Returns what it changed ("table t", "column t.c")."""

    def work(conn: Connection) -> list[str]:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
        changed: list[str] = []
        insp = inspect(conn)
        have_tables = set(insp.get_table_names())
        for table in [*metadata.sorted_tables, _schema_table()]:
            if table.name not in have_tables:
                conn.execute(CreateTable(table, if_not_exists=True))
                changed.append(f"table {table.name}")
            else:
                have = {c["name"] for c in insp.get_columns(table.name)}
                for col in table.columns:
                    if col.name not in have:
                        conn.execute(text(_add_column(conn, table, col)))
                        changed.append(f"column {table.name}.{col.name}")
            for index in table.indexes:
                conn.execute(CreateIndex(index, if_not_exists=True))
        row = conn.execute(text(f"SELECT version FROM {SCHEMA_TABLE} WHERE name = :n"), {"n": name}).first()
        if row is None:
            conn.execute(text(f"INSERT INTO {SCHEMA_TABLE} (name, version) VALUES (:n, :v)"), {"n": name, "v": version})
        elif row[0] < version:
            conn.execute(text(f"UPDATE {SCHEMA_TABLE} SET version = :v WHERE name = :n"), {"n": name, "v": version})
        return changed

    changed = st.run(work)
    for what in changed:
        logger.info("database %s: added %s", st.db.safe, what)
    return changed


def schema_version(st: Store, name: str) -> int | None:
    def read(conn: Connection) -> int | None:
        if SCHEMA_TABLE not in inspect(conn).get_table_names():
            return None
        row = conn.execute(text(f"SELECT version FROM {SCHEMA_TABLE} WHERE name = :n"), {"n": name}).first()
        return int(row[0]) if row else None

    return st.run(read)


def _schema_table() -> Table:
    return Table(
        SCHEMA_TABLE,
        MetaData(),
        Column("name", Text(), primary_key=True),
        Column("version", Integer(), nullable=False),
    )


def _add_column(conn: Connection, table: Table, col: Column[Any]) -> str:
    """ALTER TABLE … ADD COLUMN, nullable and without constraints (SQLite cannot add those later)."""
    prep = conn.dialect.identifier_preparer
    kind = col.type.compile(dialect=conn.dialect)
    return f"ALTER TABLE {prep.quote(table.name)} ADD COLUMN {prep.quote(col.name)} {kind}"


# ---------------------------------------------------------------- what failed, for one clear log line


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and what caused it (SQLAlchemy's ``orig``, ``__cause__``, ``__context__``), at most 10."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen and len(seen) < 10:
        seen.append(cur)
        cur = getattr(cur, "orig", None) or cur.__cause__ or cur.__context__
    return seen


def transient(exc: BaseException) -> bool:
    """A failure that waiting may cure: the server refuses connections, does not answer, or says it is starting
    up (SQLSTATE 57P03), as a PostgreSQL started alongside the UI does for a few seconds. Not a wrong password, an
    unknown database or any other answer the server gave."""
    seen = _causes(exc)
    sqlstates = {getattr(e, "sqlstate", None) for e in seen} - {None}
    if sqlstates:
        return sqlstates == {STARTING_UP}
    return any(isinstance(e, OSError) for e in seen)  # refused, unreachable, DNS, timeouts (TimeoutError is one)


def failure(exc: BaseException) -> str:
    """What went wrong reaching the database, in a few words (never the URL or its password)."""
    seen = _causes(exc)
    names = {type(e).__name__ for e in seen}
    sqlstates = {getattr(e, "sqlstate", None) for e in seen}
    if STARTING_UP in sqlstates:
        return "the server is starting up"
    if "InvalidPasswordError" in names or "28P01" in sqlstates:
        return "authentication failed (wrong user name or password)"
    if "InvalidAuthorizationSpecificationError" in names or "28000" in sqlstates:
        return "authentication refused (no such role, or pg_hba.conf does not allow it)"
    if "InvalidCatalogNameError" in names or "3D000" in sqlstates:
        return "unknown database (create it first: createdb)"
    if any(isinstance(e, ConnectionRefusedError) for e in seen):
        return "connection refused (is PostgreSQL running on that host and port?)"
    if any(isinstance(e, TimeoutError | asyncio.TimeoutError) for e in seen):
        return f"no answer within {CONNECT_TIMEOUT:g} s (host unreachable or a firewall)"
    if any(isinstance(e, OSError) for e in seen):
        err = next(e for e in seen if isinstance(e, OSError))
        return f"cannot connect ({err.strerror or type(err).__name__})"
    last = seen[-1]
    return f"{type(last).__name__}: {str(last).splitlines()[0][:200] if str(last) else ''}".rstrip(": ")


# Why a history write failed, as a word the status line and /metrics use (outbox.py). SQLSTATE classes: 08 connection
# exception, 57P0x the server shutting down or not ready; 53100 disk full, 53xxx other insufficient resources.
CAUSES = ("locked", "full", "down", "slow", "error")
_DOWN_NAMES = {"ConnectionDoesNotExistError", "InterfaceError", "CannotConnectNowError", "ConnectionResetError"}


def cause(exc: BaseException) -> str:
    """One of ``CAUSES`` for a failed write: a SQLite lock, a full disk, a server down or unreachable, or anything
    else ("slow" is the outbox's own: a write still unanswered after its time)."""
    seen = _causes(exc)
    words = " ".join(str(e).lower() for e in seen)
    sqlstates = {str(getattr(e, "sqlstate", None) or "") for e in seen} - {""}
    if "database is locked" in words or "database table is locked" in words:
        return "locked"
    if "disk is full" in words or "no space left" in words or any(s.startswith("53") for s in sqlstates):
        return "full"
    if any(isinstance(e, OSError) and getattr(e, "errno", None) == 28 for e in seen):  # ENOSPC
        return "full"
    down = transient(exc) or any(s.startswith(("08", "57P")) for s in sqlstates)
    if down or any(type(e).__name__ in _DOWN_NAMES for e in seen) or "connection is closed" in words:
        return "down"
    return "error"
