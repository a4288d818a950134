"""The bwrap command line for one confined server, and its canonical description. Pure.

``plan_sandbox`` turns an effective ``Profile``, the command's ``Resolution`` and the host's
``SystemLayout`` into a ``SandboxPlan``: bwrap's options (without environment values, which the
launcher passes through a memory file so they never appear in a process listing), the command
run after ``--`` (Truss's small supervisor, which applies the limits and execs the server), the
environment variable names the server gets, and ``description``: the JSON recorded for the
session and hashed into each tool's identity.

Order of the mounts (bwrap applies them in order, later ones on top): fresh ``/proc``, ``/dev``,
``/dev/shm`` and ``/tmp``; the system trees; a fresh, empty home; every bind at its real path,
with the tmpfs over each protected file's directory among them (parents before children;
symlinks met on the way recreated; then those tmpfs remounted read-only); Truss's own files
under ``/run/truss``; masks over Truss's protected paths; the root and ``/dev`` remounted read-only.

Truss's home, the identity key, the ledger and the sandbox's own runtime directory are never
visible inside: a bind inside one of them is refused (``SandboxError``, cause ``protected_path``),
and a bind or a system tree containing one has it masked (an empty read-only tmpfs over a
directory). A protected file (the key, a ledger kept outside the home) is hidden with its whole
directory, where SQLite makes the ledger's ``-journal``, ``-wal`` and ``-shm`` files after the
plan, with binds inside it mounted on top; a bind that is that directory, a working
directory hidden by it, or a write bind holding a symlink on the way to a protected path (the
server could point it elsewhere before Truss next opens the ledger by that name) is refused
(cause ``exposes_ledger``). Paths are compared after resolving symlinks; hard links are not detected.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from truss._errors import SandboxError
from truss._sandbox_profile import NEVER_BIND, Profile
from truss.mcp.sandbox._resolve import SYSTEM_ROOTS, Bind, FsView, Resolution, SystemLayout, is_system, walk

__all__ = [
    "DEFAULT_TMP_BYTES",
    "INNER_PATH",
    "PROXY_SOCKET",
    "RELAY_PORT",
    "RUN_DIR",
    "SandboxPlan",
    "plan_sandbox",
    "proxy_env",
]

RUN_DIR = "/run/truss"
INNER_PATH = f"{RUN_DIR}/inner.py"
PROXY_SOCKET = f"{RUN_DIR}/proxy.sock"
RELAY_PORT = 3128
# Each fresh tmpfs (/tmp, /dev/shm, the home) is bounded: by the memory limit, else by this.
DEFAULT_TMP_BYTES = 512 * 1024 * 1024
# Truss's own processes inside (bwrap's init, the supervisor) are not the server's.
HELPER_TASKS = 2
_PATH_VARS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "NODE_PATH")
# Paths inside the sandbox, each a fresh tmpfs of its own: not the host's shared temporary directories.
_TMP = "/tmp"  # noqa: S108
_SHM = "/dev/shm"  # noqa: S108


@dataclass(frozen=True)
class SandboxPlan:
    """Everything the launcher needs, and what the sandbox looks like from inside."""

    options: tuple[str, ...]
    command: tuple[str, ...]
    env_names: tuple[str, ...]
    extra_env: tuple[tuple[str, str], ...]
    binds: tuple[Bind, ...]
    masked: tuple[str, ...]
    not_visible: tuple[tuple[str, str], ...]
    description: dict[str, Any]


def proxy_env(port: int = RELAY_PORT) -> tuple[tuple[str, str], ...]:
    """The variables ordinary HTTP clients read to find a proxy, all pointing at the egress listener."""
    url = f"http://127.0.0.1:{port}"
    return tuple((name, url) for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def plan_sandbox(
    profile: Profile,
    resolution: Resolution,
    helper: Resolution,
    system: SystemLayout,
    fs: FsView,
    *,
    command: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    protected: Sequence[str],
    runtime_dir: str | None = None,
    inner_script: str,
    proxy_socket: str | None,
    bwrap_version: str,
    userns: bool = True,
    server: str = "",
) -> SandboxPlan:
    """The bwrap options and supervisor command for one server. Raises ``SandboxError``."""
    tmp_bytes = profile.limits.memory or DEFAULT_TMP_BYTES
    opts: list[str] = []
    namespaces = ["mount", "pid", "ipc", "uts", "cgroup"]
    opts += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if userns:
        # Own user namespace, and none nested inside it: less kernel surface for the server.
        opts += ["--unshare-user", "--disable-userns"]
        namespaces.append("user")
    if profile.network != "host":
        opts.append("--unshare-net")
        namespaces.append("net")
    opts += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "truss-sandbox"]
    opts += ["--proc", "/proc", "--dev", "/dev"]
    opts += ["--size", str(tmp_bytes), "--tmpfs", _SHM, "--size", str(tmp_bytes), "--tmpfs", _TMP]

    for path in system.dirs:
        opts += ["--ro-bind", path, path]
    for link, target in system.symlinks:
        opts += ["--symlink", target, link]
    for path in system.etc:
        opts += ["--ro-bind-try", path, path]

    home = env.get("HOME", "")
    fresh = [_TMP]
    if home.startswith("/") and posixpath.normpath(home) != "/" and not is_system(home) and not _inside(home, _TMP):
        home = posixpath.normpath(home)
        opts += ["--size", str(tmp_bytes), "--tmpfs", home]
        fresh.append(home)

    chosen, needed, links = _binds(profile, resolution, helper, fs, server)
    protected_real = _protected(fs, [*protected, *([runtime_dir] if runtime_dir else [])])
    # Everything the sandbox shows of the host: the binds and the system trees, which are bound
    # whole (a system-wide install may keep Truss's home or key under /usr/local).
    system_shown = [*system.dirs, *system.etc]
    folders = _sidecar_dirs(protected_real, [b.path for b in (*chosen, *needed)] + system_shown, server)
    binds = _layered(chosen, needed, folders, protected_real)
    for bind in binds:
        for secret in protected_real:
            if _inside(bind.path, secret):
                raise SandboxError(
                    f"cannot confine MCP server {server!r}: {bind.path} ({bind.why}) is inside {secret}, "
                    "which a sandbox never shows",
                    remedy="Bind a path outside Truss's home, identity key and ledger",
                    server=server,
                    cause="protected_path",
                    path=bind.path,
                )
    for link, secret in _links_to(fs, protected):
        writable = next((b.path for b in binds if b.mode == "rw" and _inside(link, b.path)), None)
        if writable is not None:
            # Truss opens the ledger, its sidecars and the key by these names, again at every run.
            raise _exposes(server, link, f"may write {writable}, which holds {link}, a symlink on the way to {secret}")
    visible = [b.path for b in binds]
    hiding = _hidden_by(cwd, [*visible, *SYSTEM_ROOTS], folders)
    if hiding is not None:  # an empty directory there would not be the working directory asked for
        raise _exposes(server, cwd, f"runs in {cwd}, inside {hiding}, which is hidden")
    # Parents before children: the tmpfs over a ledger's directory goes on top of the bind that
    # shows it, and a bind inside that directory on top of the tmpfs.
    for path, bind in sorted([*((b.path, b) for b in binds), *((f, None) for f in folders)], key=lambda i: i[0]):
        if bind is None:
            opts += ["--size", "4096", "--tmpfs", path]
        elif bind.mode == "rw":
            opts += ["--bind", bind.path, bind.path]
        elif bind.mode == "overlay":
            opts += ["--overlay-src", bind.path, "--tmp-overlay", bind.path]
        else:
            opts += ["--ro-bind", bind.path, bind.path]
    for link, target in links:
        # Inside a bind or a system tree the link is already there; anywhere else (the fresh
        # home and /tmp included, which start empty, and a ledger's hidden directory) it is made again.
        if not any(_inside(link, root) for root in (*visible, *SYSTEM_ROOTS)) or _hidden_by(
            link, [*visible, *SYSTEM_ROOTS], folders
        ):
            opts += ["--symlink", target, link]
    for folder in folders:
        opts += ["--remount-ro", folder]

    opts += ["--ro-bind", inner_script, INNER_PATH]
    if proxy_socket is not None:
        opts += ["--ro-bind", proxy_socket, PROXY_SOCKET]

    masked: list[str] = list(folders)
    shown = [*visible, *system_shown]
    for secret, kind in sorted(protected_real.items()):
        if not any(_inside(secret, root) for root in shown) or any(_inside(secret, m) for m in masked):
            continue  # not visible anyway, or inside a directory already masked
        masked.append(secret)
        if kind == "dir":
            opts += ["--size", "4096", "--tmpfs", secret, "--remount-ro", secret]
        else:
            opts += ["--ro-bind", "/dev/null", secret]

    if not any(_inside(cwd, root) for root in (*visible, *SYSTEM_ROOTS)):
        opts += ["--dir", cwd]  # an empty directory, so that the start does not fail on chdir
    opts += ["--chdir", cwd, "--remount-ro", "/dev", "--remount-ro", "/"]

    extra = proxy_env() if profile.network == "allow" else ()
    names = tuple(sorted(name for name in env if name not in {n for n, _ in extra}))
    limits = profile.limits
    rlimits: dict[str, int] = {"CORE": 0}
    if limits.memory is not None:
        rlimits["DATA"] = limits.memory
    if limits.processes is not None:
        rlimits["NPROC"] = limits.processes + HELPER_TASKS
    if limits.cpu_s is not None:
        rlimits["CPU"] = limits.cpu_s
    if limits.file_size is not None:
        rlimits["FSIZE"] = limits.file_size
    config = {
        "rlimits": rlimits,
        "relay": {"port": RELAY_PORT, "socket": PROXY_SOCKET} if profile.network == "allow" else None,
    }
    supervisor = (helper.executable, "-I", "-S", INNER_PATH, json.dumps(config, separators=(",", ":"), sort_keys=True))
    server_cmd = ("--", resolution.executable, command, *args)

    # The fresh tmpfs mounts are empty: a host path under /tmp or the home is not visible there.
    not_visible = _not_visible(fs, env, args, cwd, [*visible, *SYSTEM_ROOTS, *system.etc])
    description: dict[str, Any] = {
        "v": 1,
        "mechanism": "bubblewrap",
        "bwrap_version": bwrap_version,
        "required": profile.required,
        "namespaces": sorted(namespaces),
        "network": profile.network,
        "allow_hosts": [str(rule) for rule in profile.allow_hosts],
        "limits": limits.as_json(),
        "tmpfs_bytes": tmp_bytes,
        "system": [*system.dirs, *system.etc],
        "binds": [{"path": b.path, "mode": b.mode, "why": b.why} for b in binds],
        "home": home if home in fresh else None,
        # The runtime directory's name changes every run: masked, never recorded.
        "masked": sorted(m for m in masked if not (runtime_dir and _inside(m, runtime_dir))),
        "cwd": cwd,
        "executable": resolution.executable,
        "env": list(names),
    }
    return SandboxPlan(
        options=tuple(opts),
        command=(*supervisor, *server_cmd),
        env_names=names,
        extra_env=extra,
        binds=tuple(binds),
        masked=tuple(sorted(masked)),
        not_visible=tuple(not_visible),
        description=description,
    )


def _sidecar_dirs(protected: Mapping[str, str], shown: Sequence[str], server: str) -> list[str]:
    """The directories of visible protected files, each to be hidden whole. Raises ``SandboxError``.

    A mask over the file alone leaves its directory as the bind shows it: SQLite makes
    ``LEDGER-journal``, ``-wal`` and ``-shm`` there after the plan (and deletes and remakes them,
    which drops a mask over one), and applies a hot journal or a WAL it finds at the next open.
    A server that may write that directory could rewrite the ledger without reading it; one
    that may read it reads the pages in the WAL. A tmpfs over the existing directory hides what
    appears there later and creates nothing on the host. Where the directory is itself a bind,
    a path the command needs or a system tree, hiding it would hide all of that: the start is
    refused instead.
    """
    folders: list[str] = []
    for secret, kind in sorted(protected.items()):
        folder = posixpath.dirname(secret)
        if kind == "dir" or any(_inside(folder, d) for d, k in protected.items() if k == "dir"):
            continue  # a directory is hidden whole; so is a file in one (the ledger in Truss's home)
        # A bind of a protected path itself is refused, or dropped, as such: it exposes nothing here.
        roots = [r for r in shown if _inside(secret, r) and not any(_inside(r, p) for p in protected)]
        if not roots or any(_inside(folder, f) for f in folders):
            continue
        exposing = next((root for root in roots if _inside(root, folder)), None)
        if exposing is not None:
            raise _exposes(server, exposing, f"binds {exposing}, the directory holding {secret}")
        folders.append(folder)
    return folders


def _exposes(server: str, path: str, what: str) -> SandboxError:
    return SandboxError(
        f"cannot confine MCP server {server!r}: the sandbox {what}; SQLite creates the ledger's -journal, "
        "-wal and -shm files there, and a server that could write or read them could rewrite or read the ledger",
        remedy="Keep the ledger (and the key) in a directory no sandbox binds, such as Truss's home, "
        "or bind a directory beside it instead",
        server=server,
        cause="exposes_ledger",
        path=path,
    )


def _hidden_by(path: str, roots: Sequence[str], folders: Sequence[str]) -> str | None:
    """The hidden directory ``path`` lies in, when that hides it: no bind inside the directory shows it."""
    for folder in folders:
        if _inside(path, folder) and not any(_inside(path, r) and _inside(r, folder) for r in roots):
            return folder
    return None


def _layered(
    chosen: Sequence[Bind], needed: Sequence[Bind], folders: Sequence[str], protected: Mapping[str, str]
) -> list[Bind]:
    """The profile's binds, then what the command needs that they do not show, fewest mounts first.

    A bind inside another shows nothing new, unless a hidden directory lies between the two.
    """

    def shows(outer: Bind, path: str) -> bool:
        return _inside(path, outer.path) and not any(
            _inside(path, f) and _inside(f, outer.path) and f != outer.path for f in folders
        )

    out = {b.path: b for b in chosen}
    profile = list(chosen)
    for bind in needed:
        if bind.path in out or any(shows(root, bind.path) for root in profile):
            continue  # the operator's own bind already shows it, with the operator's mode
        if any(_inside(bind.path, secret) for secret in protected) and any(
            _inside(bind.path, root.path) for root in profile
        ):
            continue  # hidden on purpose; the operator's bind shows the rest
        out[bind.path] = bind
    kept: list[Bind] = []
    for bind in sorted(out.values(), key=lambda b: b.path):
        # A read-only bind inside another read-only bind shows nothing new: one mount fewer.
        if bind.mode == "ro" and any(k.mode == "ro" and shows(k, bind.path) for k in kept):
            continue
        kept.append(bind)
    return kept


def _binds(
    profile: Profile, resolution: Resolution, helper: Resolution, fs: FsView, server: str
) -> tuple[list[Bind], list[Bind], list[tuple[str, str]]]:
    """The profile's binds, those the command needs, and the symlinks met on the way."""
    links: dict[str, str] = dict(resolution.symlinks)
    links.update(helper.symlinks)
    chosen: dict[str, Bind] = {}
    resolved: dict[str, list[tuple[str, str]]] = {"rw": [], "ro": []}  # (as written, real)
    for mode, paths in (("rw", profile.write), ("ro", profile.read)):
        for path in paths:
            try:
                real, met = walk(fs, path)
            except ValueError as exc:
                raise SandboxError(
                    f"cannot confine MCP server {server!r}: {exc}", server=server, cause="unresolvable", path=path
                ) from None
            if real == "/" or any(_inside(real, root) for root in NEVER_BIND):
                raise SandboxError(
                    f"cannot confine MCP server {server!r}: the sandbox {'write' if mode == 'rw' else 'read'} "
                    f"path {path} leads to {real}, which a sandbox never binds from the host",
                    remedy="Name the directory the server needs itself, not a symlink to / or into /proc, /sys, /dev",
                    server=server,
                    cause="unresolvable",
                    path=path,
                )
            if fs.kind(real) is None:
                raise SandboxError(
                    f"cannot confine MCP server {server!r}: the sandbox {'write' if mode == 'rw' else 'read'} "
                    f"path {path} does not exist",
                    remedy="Create it first, or remove it from the profile",
                    server=server,
                    cause="unresolvable",
                    path=path,
                )
            links.update(met)
            resolved[mode].append((path, real))
            chosen.setdefault(real, Bind(real, "rw" if mode == "rw" else "ro", "profile"))
    _check_aliases(resolved["rw"], resolved["ro"], server)
    return list(chosen.values()), [*resolution.binds, *helper.binds], sorted(links.items())


def _check_aliases(write: Sequence[tuple[str, str]], read: Sequence[tuple[str, str]], server: str) -> None:
    """Refuse a write path that reaches a read path, or inside one, only once symlinks are resolved.

    The layering (``merge_profiles``) compares paths as written, without the file system: a
    contract's ``write = ["/data/shared"]``, where ``/data`` links to ``/srv``, would otherwise
    make the operator's read-only ``/srv/shared`` writable. A write path inside a read path as
    written (both the contract's, or the operator's write under a contract's read) stays allowed.
    """
    for path, real in write:
        for read_path, read_real in read:
            if _inside(real, read_real) and not _inside(path, read_path):
                raise SandboxError(
                    f"cannot confine MCP server {server!r}: the sandbox write path {path} is {real}, "
                    f"{'the same as' if real == read_real else 'inside'} the read-only path {read_path}, "
                    "once symlinks are resolved",
                    remedy="Write the sandbox's read and write paths as their real paths, without symlinks",
                    server=server,
                    cause="aliased_bind",
                    path=path,
                )


def _links_to(fs: FsView, paths: Sequence[str]) -> list[tuple[str, str]]:
    """Each symlink met on the way to a protected path (missing ones included), with that path."""
    out: list[tuple[str, str]] = []
    for path in paths:
        if not path.startswith("/"):
            continue
        try:
            _, met = walk(fs, posixpath.normpath(path))
        except ValueError:
            continue
        out += [(link, path) for link, _ in met]
    return out


def _protected(fs: FsView, paths: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in paths:
        if not path.startswith("/"):
            continue
        try:
            real, _ = walk(fs, posixpath.normpath(path))
        except ValueError:
            continue
        kind = fs.kind(real)
        if kind is not None:
            out[real] = "dir" if kind == "dir" else "file"
    return out


def _not_visible(
    fs: FsView, env: Mapping[str, str], args: Sequence[str], cwd: str, roots: Sequence[str]
) -> list[tuple[str, str]]:
    """Host paths the server's environment or arguments name that the sandbox does not show."""
    out: list[tuple[str, str]] = []
    candidates = [(name, part) for name in _PATH_VARS for part in env.get(name, "").split(":")]
    candidates += [(f"argument {i + 1}", arg) for i, arg in enumerate(args)]
    candidates.append(("cwd", cwd))
    for where, path in candidates:
        if not path.startswith("/") or path == "/" or fs.kind(path) is None:
            continue
        try:
            real, _ = walk(fs, path)
        except ValueError:
            continue
        if not any(_inside(path, root) or _inside(real, root) for root in roots):
            out.append((where, path))
    return out
