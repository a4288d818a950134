"""Real witnesses for the tests: ``truss witness serve`` subprocesses on 127.0.0.1, and a Truss home
whose operator config names them (``witness.toml`` and a tlog-policy file)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import truss_cmd
from truss._clock import SystemClock
from truss.ledger.entry import Record
from truss.ledger.keys import CosignerKey, IdentityKey
from truss.ledger.stores import open_store

ORIGIN = "witnessed.truss.test/log"
WAIT_S = 30


def truss(home: Path | None, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if home is not None:
        env["TRUSS_HOME"] = str(home)
    return subprocess.run([*truss_cmd(), *args], env=env, check=False, capture_output=True, text=True, timeout=timeout)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


@dataclass
class Witness:
    """One ``truss witness serve`` process and its directory."""

    name: str
    directory: Path
    key: CosignerKey
    process: subprocess.Popen[str] | None = None
    url: str = ""

    def configure(self, log_vkeys: Sequence[str], *, max_per_minute: int = 600) -> None:
        keys = ", ".join(json.dumps(v) for v in log_vkeys)
        (self.directory / "config.toml").write_text(
            f"max_per_minute = {max_per_minute}\n[[log]]\nkeys = [{keys}]\n", encoding="utf-8"
        )

    def start(self, port: int = 0) -> None:
        proc = subprocess.Popen(
            [*truss_cmd(), "witness", "serve", "--dir", str(self.directory), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        out = proc.stdout
        threading.Thread(target=lambda: lines.put(out.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=WAIT_S)
        except queue.Empty:
            proc.kill()
            proc.wait(timeout=WAIT_S)
            raise AssertionError(f"witness {self.name} did not start within {WAIT_S}s") from None
        assert line.startswith("listening on http://"), line + (proc.stderr.read() if proc.stderr else "")
        self.process = proc
        self.url = line.split()[-1]

    def stop(self) -> int:
        proc, self.process = self.process, None
        if proc is None:
            return 0
        proc.terminate()
        try:
            return proc.wait(timeout=WAIT_S)
        finally:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def policy_line(self, url: str | None = None) -> str:
        return f"witness {self.name} {self.key.verifier.vkey} {url or self.url}"

    def show(self, *args: str) -> Any:
        proc = truss(None, "witness", "show", "--dir", str(self.directory), "--json", *args)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


def make_witness(tmp_path: Path, name: str) -> Witness:
    directory = tmp_path / f"witness-{name}"
    proc = truss(None, "witness", "init", "--dir", str(directory), "--name", f"witness.test/{name}", "--json")
    assert proc.returncode == 0, proc.stderr
    return Witness(name, directory, CosignerKey.load(directory / "witness.key"))


def make_home(tmp_path: Path, name: str = "home", *, key: IdentityKey | None = None) -> tuple[Path, IdentityKey]:
    home = tmp_path / name
    home.mkdir(mode=0o700)
    if key is None:
        key = IdentityKey.create(home / "identity.key", name=ORIGIN)
    else:
        fd = os.open(home / "identity.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key.private_text() + "\n")
    return home, key


def write_policy(home: Path, lines: Sequence[str], *, name: str = "witnesses.policy", quorum: str) -> Path:
    path = home / name
    path.write_text("\n".join([*lines, quorum, ""]), encoding="utf-8")
    return path


def write_witness_config(home: Path, policy: str = "witnesses.policy", **settings: Any) -> None:
    values = {"min_interval": "1ms", "timeout": "5s", "retries": 0, **settings}
    body = [f"policy = {json.dumps(policy)}"]
    for k, v in values.items():
        body.append(f"{k} = {json.dumps(v)}")
    (home / "witness.toml").write_text("\n".join(body) + "\n", encoding="utf-8")


def record_sessions(home: Path, key: IdentityKey, sessions: Sequence[str], *, salt: str = "") -> None:
    with closing(open_store(home / "ledger.db", key=key, clock=SystemClock())) as store:
        for sid in sessions:
            store.append(
                sid,
                [
                    Record("session_started", {"contract": "witnessed", "salt": salt}),
                    Record("session_ended", {"status": "pass"}),
                ],
            )


def log_entries(home: Path) -> Iterator[dict[str, Any]]:
    with closing(open_store(home / "ledger.db", key=None, clock=SystemClock(), create=False)) as store:
        for item in store.read_session("@log"):
            yield {"kind": item.kind, **item.body}
