"""A resume starts its servers while its verified read goes on: only from a proven ``session_started``,
and a read that fails later stops them again, with nothing recorded and no process left."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import threading
from collections.abc import AsyncGenerator, Iterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.durability.support import TIMEOUT, long_counting_contract, make_home, truss
from truss._errors import VerificationError
from truss.ledger.reader import unverified
from truss.runtime import Runtime
from truss.session import resume_session

STEPS = 200  # 3 entries a call: the session is past the reader's first proven batch of 512
pytestmark = pytest.mark.slow


def _started(path: Path) -> list[int]:
    """The pids of the counting servers that answered ``initialize``, in order."""
    return [int(line) for line in path.read_text(encoding="utf-8").split()] if path.exists() else []


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended; only its parent's wait is left


def _count(home: Path, session: str) -> int:
    with closing(sqlite3.connect(home / "ledger.db")) as conn:
        [(count,)] = conn.execute("SELECT count(*) FROM entries WHERE session = ?", (session,)).fetchall()
    return int(count)


def _tamper(home: Path, session: str, seq: int) -> None:
    """Change one byte of the signed entry at ``seq`` (a digit of its time stamp)."""
    with closing(sqlite3.connect(home / "ledger.db")) as conn, conn:
        [(raw,)] = conn.execute("SELECT raw FROM entries WHERE session = ? AND seq = ?", (session, seq)).fetchall()
        data = bytes(raw)
        at = data.index(b'"ts":') + len(b'"ts":')
        digit = b"1" if data[at : at + 1] != b"1" else b"2"
        forged = data[:at] + digit + data[at + 1 :]
        conn.execute("UPDATE entries SET raw = ? WHERE session = ? AND seq = ?", (forged, session, seq))


def _long_session(tmp_path: Path) -> tuple[Path, Path]:
    """A home whose session s1 ran STEPS calls and was killed while sealing (resumable), and the
    file the counting server writes its pid to when it starts."""
    home = make_home(tmp_path / "home")
    starts = tmp_path / "starts.txt"
    contract = long_counting_contract(tmp_path, STEPS)
    text = contract.read_text(encoding="utf-8").replace(
        "env = { ", f"env = {{ START_FILE = {json.dumps(str(starts))}, "
    )
    contract.write_text(text, encoding="utf-8")
    crashed = truss(home, "run", str(contract), "--session", "s1", env={"TRUSS_FAULT": "during_verdict"})
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr
    assert _count(home, "s1") > 512 + 20
    return home, starts


class _PausedAfterFirstBatch:
    """The home's store, with a whole read of a session paused before its entry 512 (past the
    verified reader's first batch) until ``resume`` is set: the read fails only once the servers
    started from the proven first batch have connected, whatever the machine's speed."""

    def __init__(self, raw: Any, resume: threading.Event) -> None:
        self._raw = raw
        self._resume = resume

    def read_session(self, session: str, *, from_seq: int = 0) -> Iterator[Any]:
        for item in self._raw.read_session(session, from_seq=from_seq):
            if from_seq == 0 and item.seq == 512:
                assert self._resume.wait(TIMEOUT), "the servers never connected"
            yield item

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


@pytest.mark.anyio
async def test_a_resume_whose_read_fails_after_its_servers_started_stops_them_and_records_nothing(
    tmp_path: Path,
) -> None:
    from truss.mcp.client import connect

    home, starts = _long_session(tmp_path)
    before, ran = _count(home, "s1"), len(_started(starts))
    _tamper(home, "s1", before - 10)  # in the second batch: the first proved, the servers may start
    connected = threading.Event()
    entered: list[str] = []

    @asynccontextmanager
    async def connector(contract: Any, **kwargs: Any) -> AsyncGenerator[Any]:
        async with connect(contract, **kwargs) as mounts:
            entered.append("connected")
            connected.set()
            yield mounts
        entered.append("closed")

    seen: list[Any] = []
    with Runtime.open(home=home, connector=connector, events=(seen.append,)) as opened:
        runtime = dataclasses.replace(opened, store=_PausedAfterFirstBatch(unverified(opened.store), connected))
        with pytest.raises(VerificationError) as refused, anyio.fail_after(TIMEOUT):
            await resume_session(runtime, "s1")
    assert refused.value.exit_code == 1 and refused.value.seq == before - 10  # the error an in-order read gives
    assert entered == ["connected", "closed"]  # started from the proven session_started, then stopped
    pids = _started(starts)[ran:]
    assert len(pids) == 1 and not _running(pids[0])  # no process left behind
    assert seen == []  # no run event
    assert _count(home, "s1") == before  # nothing appended


def test_a_resume_whose_session_started_was_tampered_starts_no_server(tmp_path: Path) -> None:
    home, starts = _long_session(tmp_path)
    forged = tmp_path / "forged"
    shutil.copytree(home, forged)
    before, ran = _count(forged, "s1"), len(_started(starts))
    _tamper(forged, "s1", 0)

    resumed = truss(forged, "resume", "s1")
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "does not verify" in resumed.stderr and "Traceback" not in resumed.stderr
    assert _started(starts)[ran:] == []  # no server started from unverified bytes
    assert _count(forged, "s1") == before

    # The same session untampered resumes to its end, its servers started once.
    finished = truss(home, "resume", "s1")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert len(_started(starts)[ran:]) == 1
    assert not any(_running(pid) for pid in _started(starts))
