"""A real PostgreSQL server for the tests: Debian's binaries, a temporary data folder, a free port.

    with running_postgres(tmp_dir) as pg:      # or the session fixture ``postgres`` (tests/conftest.py)
        pg.url("qwenchat")                       # postgresql+asyncpg://qwenchat:<password>@127.0.0.1:<port>/qwenchat
        pg.url("qwenchat", password="wrong")     # the same with a wrong password (scram: really refused)
        pg.create_database("other")

initdb and the server refuse to run as root: as root they run as the ``postgres`` OS user
(``runuser -u postgres --``). The server listens on 127.0.0.1 only, its socket in the temporary folder;
pg_hba.conf allows the test role with scram-sha-256 over TCP only, so a wrong password is refused for real.
Missing binaries are a clear failure, not a skip: ``./test.sh`` installs Debian's ``postgresql``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROLE = "qwenchat"
OS_USER = "postgres"


def pg_bin() -> Path:
    """The newest ``/usr/lib/postgresql/<v>/bin`` with initdb and pg_ctl; a clear error without one."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError(
            "PostgreSQL server binaries not found (/usr/lib/postgresql/<version>/bin/pg_ctl): "
            "install Debian's server with 'apt-get install postgresql' (./test.sh does)"
        )
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Postgres:
    folder: Path
    port: int
    password: str
    bin: Path
    as_user: list[str]

    def url(self, database: str = ROLE, *, password: str | None = None, port: int | None = None) -> str:
        pw = self.password if password is None else password
        return f"postgresql+asyncpg://{ROLE}:{pw}@127.0.0.1:{port or self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL as the superuser over the server's own socket (peer-less trust for the OS user)."""
        out = subprocess.run(
            [*self.as_user, str(self.bin / "psql"), "-h", str(self.folder), "-p", str(self.port), "-d", database]
            + ["-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"psql failed: {out.stderr.strip()}")
        return out.stdout

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: every connection closed, then nothing listening (the server going down)."""
        self._pg_ctl("-m", "fast", "-w", "-t", "30", "stop")

    def start(self) -> None:
        """``pg_ctl start`` again on the same port and data folder; returns once it accepts connections."""
        self._pg_ctl(
            "-l", str(self.folder / "server.log"), "-o", _options(self.folder, self.port), "-w", "-t", "60", "start"
        )

    def _pg_ctl(self, *args: str) -> None:
        out = subprocess.run(
            [*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            raise RuntimeError(f"pg_ctl {args[-1]} failed: {out.stderr.strip()}")

    def create_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}" OWNER {ROLE}')
        return self.url(name)


def _options(folder: Path, port: int) -> str:
    return f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder} -c fsync=off"


def _as_postgres() -> list[str]:
    if os.geteuid() != 0:
        return []
    if not shutil.which("runuser"):
        raise RuntimeError("running as root needs 'runuser' to start PostgreSQL as the postgres user")
    return ["runuser", "-u", OS_USER, "--"]


@contextlib.contextmanager
def running_postgres(parent: Path | None = None) -> Iterator[Postgres]:
    """Start a throwaway server; stop it (fast shutdown, then kill) and delete its folder afterwards."""
    bindir = pg_bin()
    as_user = _as_postgres()
    folder = Path(tempfile.mkdtemp(prefix="qwenchat-pg-", dir=parent))
    data = folder / "data"
    password = secrets.token_hex(12)
    if as_user:
        shutil.chown(folder, OS_USER)
    folder.chmod(0o700)
    pwfile = folder / "pw"
    pwfile.write_text(password + "\n")
    if as_user:
        shutil.chown(pwfile, OS_USER)
    run = {"capture_output": True, "text": True, "timeout": 120}
    init = subprocess.run(
        [*as_user, str(bindir / "initdb"), "-D", str(data), "-U", OS_USER, "--auth-local=trust"]
        + ["--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"],
        **run,  # type: ignore[call-overload]
    )
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed: {init.stderr.strip()}")
    # Only the test role over TCP with a password; the superuser over the socket in the folder.
    (data / "pg_hba.conf").write_text("local all postgres trust\nhost all qwenchat 127.0.0.1/32 scram-sha-256\n")
    port = free_port()
    opts = _options(folder, port)
    start = subprocess.run(
        [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-o", opts]
        + ["-w", "-t", "60", "start"],
        **run,  # type: ignore[call-overload]
    )
    if start.returncode != 0:
        log = (folder / "server.log").read_text(errors="replace") if (folder / "server.log").exists() else ""
        raise RuntimeError(f"PostgreSQL did not start: {start.stderr.strip()} {log[-2000:]}")
    pg = Postgres(folder, port, password, bindir, as_user)
    try:
        pg.psql(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{password}'")
        pg.create_database(ROLE)
        yield pg
    finally:
        stop = subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop"], **run
        )  # type: ignore[call-overload]
        if stop.returncode != 0:
            pid_file = data / "postmaster.pid"
            if pid_file.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid_file.read_text().split()[0]), 9)
                time.sleep(0.5)
        shutil.rmtree(folder, ignore_errors=True)
