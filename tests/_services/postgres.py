"""A real PostgreSQL server for the tests, started from the Debian ``postgresql`` package's binaries.

``TempPostgres`` runs ``initdb`` into a temporary directory and ``pg_ctl start`` with the server
listening on a Unix socket in that directory only (no TCP port), and removes everything when it
stops. As root, the server runs as the ``postgres`` system user (``initdb`` refuses root): the
directory is given to that user, and the package creates it. The benchmarks use the class too.

The pytest fixtures (registered by ``tests/conftest.py``):

- ``postgres_server``: one server for the whole test session (started on first use);
- ``postgres_url``: a URL naming a fresh, empty schema of that server, one per test;
- ``postgres_urls``: a callable returning a new such URL each time (conformance checks).

Where the binaries or psycopg are missing, a test using these fixtures is skipped with what to
install, except under CI (``CI`` set), where it fails: a green CI means PostgreSQL ran. A test module
that imports the PostgreSQL store itself calls ``require_psycopg()`` before that import.
"""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

INSTALL_HINT = (
    "PostgreSQL is not installed: run `make venv` (it installs psycopg) and, as root, "
    "`apt-get install postgresql` (Debian/Ubuntu), or set TRUSS_PG_BINDIR to a directory holding initdb and pg_ctl"
)
_START_TIMEOUT_S = 120


def find_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: ``$TRUSS_PG_BINDIR``, the newest Debian install, or PATH."""
    given = os.environ.get("TRUSS_PG_BINDIR")
    candidates = [Path(given)] if given else []
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: _version(Path(p).parent.name))
    candidates += [Path(p) for p in reversed(versions)]
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    for path in candidates:
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    return None


def _version(name: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in name.split("."))
    except ValueError:
        return (0,)


class TempPostgres:
    """A throw-away PostgreSQL server on a Unix socket; ``with TempPostgres() as pg: pg.url()``."""

    def __init__(self, bindir: Path, *, settings: dict[str, str] | None = None) -> None:
        self.bindir = bindir
        self.settings = {"max_connections": "200", **(settings or {})}
        self.root = Path(tempfile.mkdtemp(prefix="truss-pg-"))  # short: a socket path has ~100 bytes
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 5432  # the socket is in our own directory, so the default port cannot clash
        self.user = "truss"
        self._run_as: dict[str, Any] = {}
        self._schemas = itertools.count(1)
        if os.geteuid() == 0:
            account = _postgres_account()  # initdb refuses to run as root
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self._run_as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def _tool(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=_START_TIMEOUT_S,
            check=False,
            cwd=self.root,
            **self._run_as,
        )

    def start(self) -> TempPostgres:
        done = self._tool("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8", "-N")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr.strip()}")
        options = " ".join(
            [f"-k {self.root}", "-c listen_addresses=", f"-p {self.port}"]
            + [f"-c {name}={value}" for name, value in self.settings.items()]
        )
        done = self._tool("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start")
        if done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed ({done.returncode}): {done.stderr.strip()}\n{log[-2000:]}")
        return self

    def stop(self) -> None:
        if self.data.exists():
            self._tool("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> TempPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, database: str = "postgres", **params: str) -> str:
        """A ``postgresql://`` URL for ``database`` over the socket (no password: trust auth)."""
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in {"host": str(self.root), **params}.items())
        return f"postgresql://{self.user}@/{database}?{query}"

    def admin(self) -> Any:
        """A new autocommit psycopg connection as the superuser (create schemas, tamper with tables)."""
        import psycopg

        return psycopg.connect(self.url(), autocommit=True)

    def new_schema(self) -> str:
        """A URL naming a fresh schema: every test's ledger starts empty, on one server."""
        name = f"t{os.getpid()}_{next(self._schemas)}"
        return self.url(schema=name)


def _postgres_account() -> pwd.struct_passwd:
    """The ``postgres`` system user the Debian package creates; made here if the binaries came another way."""
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return pwd.getpwnam("postgres")


def _missing(message: str, *, module: bool = False) -> None:
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=module)


def require_psycopg() -> None:
    """For a test module that imports the PostgreSQL store: skip it whole without psycopg (fail under CI).

    Call it before that import, so the module is reported as skipped (or failed) rather than as a
    collection error.
    """
    if importlib.util.find_spec("psycopg") is None or importlib.util.find_spec("psycopg_pool") is None:
        _missing(INSTALL_HINT, module=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[TempPostgres]:
    if importlib.util.find_spec("psycopg") is None:
        _missing(INSTALL_HINT)
    bindir = find_bindir()
    if bindir is None:
        _missing(INSTALL_HINT)
    assert bindir is not None
    server = TempPostgres(bindir)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: TempPostgres) -> str:
    return postgres_server.new_schema()


@pytest.fixture
def postgres_urls(postgres_server: TempPostgres) -> Callable[[], str]:
    return postgres_server.new_schema
