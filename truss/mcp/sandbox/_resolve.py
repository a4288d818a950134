"""What a command needs to start inside the sandbox, found without running it.

``resolve_command`` follows the command the way ``execve`` and the interpreters will: the
executable on ``PATH``, every symlink on the way (each path component, not only the last), its
``#!`` interpreter (recursively, ``/usr/bin/env python3`` included, at most four levels as the
kernel allows), the interpreter's prefix (a venv's ``pyvenv.cfg`` and its ``home``, a
``sys.prefix``-style layout), script arguments (a Node package's ``node_modules`` tree), and the
caches of ``npx`` and ``uvx``. The result is a list of read-only binds, symlinks to recreate, and
caches to mount through a throwaway overlay.

``system_layout`` lists the host's shared system paths (``/usr``, ``/lib*``, the loader's files
in ``/etc``, and resolv and certificates when the network is not ``none``).

Every file-system read goes through ``FsView`` (``truss.mcp.sandbox._fs.OsFs`` on a real
machine; a dictionary in the tests), so this module does no I/O of its own.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from truss._errors import SandboxError
from truss._sandbox_profile import NEVER_BIND

__all__ = [
    "SYSTEM_ROOTS",
    "Bind",
    "FsView",
    "Resolution",
    "SystemLayout",
    "resolve_command",
    "system_layout",
    "walk",
]

Kind = Literal["file", "dir", "link", "other"]


class FsView(Protocol):
    """The few reads resolution needs, on paths of the host."""

    def kind(self, path: str) -> Kind | None:
        """What ``path`` is without following a final symlink (``lstat``); ``None`` when absent."""
        ...

    def readlink(self, path: str) -> str: ...

    def head(self, path: str, size: int) -> bytes:
        """Up to ``size`` first bytes of a regular file; ``b""`` when it cannot be read."""
        ...

    def executable(self, path: str) -> bool:
        """True when ``path`` (after symlinks) is a file this process may execute."""
        ...


@dataclass(frozen=True)
class Bind:
    """A host path made visible inside at the same path. ``why`` says which rule asked for it."""

    path: str
    mode: Literal["ro", "rw", "overlay"]
    why: str


@dataclass(frozen=True)
class Resolution:
    """What one command needs: binds, symlinks to recreate (link -> target text), the exec path."""

    executable: str
    chain: tuple[str, ...]
    binds: tuple[Bind, ...]
    symlinks: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class SystemLayout:
    """The host's system paths as they are: directories to bind, top-level symlinks, /etc files."""

    dirs: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]
    etc: tuple[str, ...]


# Shared, non-secret system trees: bound whole, read-only, in every sandbox.
SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_ALWAYS = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/mime.types",
)
# Certificates only: /etc/ssl/private and friends hold keys and are never bound.
_ETC_NETWORK = (
    "/etc/resolv.conf",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/pki/tls/certs",
    "/etc/pki/ca-trust",
)
_MAX_LINKS = 40  # the kernel's ELOOP bound
_MAX_INTERPRETERS = 4  # the kernel's binfmt_script recursion bound
_PYTHON_RE = re.compile(r"^python[0-9.]*\Z")


def walk(fs: FsView, path: str) -> tuple[str, list[tuple[str, str]]]:
    """``realpath(path)`` and every symlink met on the way, as (link path, target text) pairs.

    Raises ``ValueError`` on a loop or a link this process may not read (``/proc/1/root`` in a
    container). A missing component ends the walk at the path so far.
    """
    links: list[tuple[str, str]] = []
    pending = [p for p in path.split("/") if p]
    done = "/"
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = posixpath.dirname(done)
            continue
        candidate = posixpath.join(done, part)
        if fs.kind(candidate) == "link":
            hops += 1
            if hops > _MAX_LINKS:
                raise ValueError(f"too many levels of symbolic links at {candidate}")
            try:
                target = fs.readlink(candidate)
            except OSError as exc:
                raise ValueError(f"cannot read the symbolic link {candidate}: {exc.strerror or exc}") from None
            links.append((candidate, target))
            pending = [p for p in target.split("/") if p] + pending
            if target.startswith("/"):
                done = "/"
            continue
        done = candidate
    return done, links


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def is_system(path: str) -> bool:
    return any(_inside(path, root) for root in SYSTEM_ROOTS) or _inside(path, "/etc/alternatives")


def system_layout(fs: FsView, *, network: bool) -> SystemLayout:
    """The host's system trees: real directories are bound, top-level symlinks are recreated."""
    dirs: list[str] = []
    links: list[tuple[str, str]] = []
    for root in SYSTEM_ROOTS:
        kind = fs.kind(root)
        if kind == "dir":
            dirs.append(root)
        elif kind == "link":
            links.append((root, fs.readlink(root)))
    etc = [p for p in (*_ETC_ALWAYS, *(_ETC_NETWORK if network else ())) if fs.kind(p) is not None]
    return SystemLayout(tuple(dirs), tuple(links), tuple(etc))


def _which(fs: FsView, name: str, path_var: str | None, cwd: str) -> str | None:
    if "/" in name:
        full = name if name.startswith("/") else posixpath.normpath(posixpath.join(cwd, name))
        return full if fs.executable(full) else None
    for directory in (path_var if path_var is not None else "/usr/local/bin:/usr/bin:/bin").split(":"):
        if not directory.startswith("/"):
            continue  # a relative PATH entry means the cwd of the moment: never guessed
        candidate = posixpath.join(directory, name)
        if fs.kind(candidate) is not None and fs.executable(candidate):
            return candidate
    return None


def _shebang(fs: FsView, path: str) -> list[str] | None:
    head = fs.head(path, 256)
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    if not line:
        return None
    # Linux passes everything after the interpreter as one argument; `env -S` splits it again.
    interpreter, _, rest = line.partition(" ")
    return [interpreter, rest.strip()] if rest.strip() else [interpreter]


class _Collector:
    def __init__(self, fs: FsView, server: str) -> None:
        self.fs = fs
        self.server = server
        self.binds: dict[str, Bind] = {}
        self.links: dict[str, str] = {}

    def see(self, path: str, why: str, mode: Literal["ro", "overlay"] = "ro") -> str:
        """Record ``path``'s symlinks and bind its real target (unless a system tree holds it).

        The root and the kernel file systems are refused as the profile's own paths are: a
        ``pyvenv.cfg`` or a cache variable naming them (``home = /``, ``UV_CACHE_DIR=/proc/1/root``)
        would otherwise show the whole host.
        """
        try:
            real, links = walk(self.fs, path)
        except ValueError as exc:
            raise SandboxError(
                f"cannot confine MCP server {self.server!r}: {exc}", server=self.server, cause="unresolvable", path=path
            ) from None
        if real == "/" or any(_inside(real, root) for root in NEVER_BIND):
            raise SandboxError(
                f"cannot confine MCP server {self.server!r}: its {why} {path} is {real}, which a sandbox never "
                "binds from the host",
                remedy="Fix the path the command's files or environment name (pyvenv.cfg home, a cache variable)",
                server=self.server,
                cause="unresolvable",
                path=path,
            )
        for link, target in links:
            self.links.setdefault(link, target)
        if not is_system(real) and real not in self.binds:
            self.binds[real] = Bind(real, mode, why)
        return real


def resolve_command(
    fs: FsView, command: str, args: Sequence[str], env: Mapping[str, str], cwd: str, *, server: str = ""
) -> Resolution:
    """Everything ``command args`` needs to start, as read-only binds. Raises ``SandboxError``.

    ``env`` is the server's environment (its ``PATH``, ``HOME`` and cache variables are used);
    ``cwd`` its working directory.
    """
    found = _which(fs, command, env.get("PATH"), cwd)
    if found is None:
        raise SandboxError(
            f"cannot confine MCP server {server!r}: {command!r} is not an executable file"
            + ("" if "/" in command else " on the server's PATH"),
            remedy="Give the command's absolute path, or set PATH in the server's env",
            server=server,
            cause="unresolvable",
            path=command,
        )
    collect = _Collector(fs, server)
    chain: list[str] = []
    current = found
    current_args = list(args)
    for _ in range(_MAX_INTERPRETERS + 1):
        try:
            real = collect.see(current, "executable" if not chain else "interpreter")
        except ValueError as exc:
            raise SandboxError(
                f"cannot confine MCP server {server!r}: {exc}", server=server, cause="unresolvable", path=current
            ) from None
        chain.append(current)
        _prefixes(collect, current, real)
        _scripts(collect, current_args, cwd)
        _caches(collect, real, current_args, env)
        bang = _shebang(fs, real)
        if bang is None:
            break
        interpreter = bang[0]
        extra = bang[1:]
        if posixpath.basename(interpreter) == "env" and extra:
            words = extra[0].split()
            if words and words[0] == "-S":
                words = words[1:]
            words = [w for w in words if "=" not in w and not w.startswith("-")]
            if not words:
                break
            located = _which(fs, words[0], env.get("PATH"), cwd)
            if located is None:
                raise SandboxError(
                    f"cannot confine MCP server {server!r}: {real} runs {words[0]!r} through env, "
                    "which is not on the server's PATH",
                    remedy="Set PATH in the server's env so that it finds the interpreter",
                    server=server,
                    cause="unresolvable",
                    path=real,
                )
            collect.see(interpreter, "interpreter")
            interpreter = located
        if fs.kind(interpreter) is None:
            raise SandboxError(
                f"cannot confine MCP server {server!r}: {real} names the interpreter {interpreter}, "
                "which does not exist",
                server=server,
                cause="unresolvable",
                path=interpreter,
            )
        current_args = [real]
        current = interpreter
    else:
        raise SandboxError(
            f"cannot confine MCP server {server!r}: more than {_MAX_INTERPRETERS} levels of #! interpreters",
            server=server,
            cause="unresolvable",
            path=found,
        )
    return Resolution(
        executable=found,
        chain=tuple(chain),
        binds=tuple(sorted(collect.binds.values(), key=lambda b: b.path)),
        symlinks=tuple(sorted(collect.links.items())),
    )


def _prefixes(collect: _Collector, invoked: str, real: str) -> None:
    """A Python interpreter's venv (``pyvenv.cfg`` beside or above its bin) and its base prefix."""
    fs = collect.fs
    if not _PYTHON_RE.match(posixpath.basename(real)) and not _PYTHON_RE.match(posixpath.basename(invoked)):
        return
    bin_dir = posixpath.dirname(invoked)
    for cfg in (posixpath.join(bin_dir, "pyvenv.cfg"), posixpath.join(posixpath.dirname(bin_dir), "pyvenv.cfg")):
        if fs.kind(cfg) != "file":
            continue
        collect.see(posixpath.dirname(cfg), "venv")
        home = _cfg_value(fs.head(cfg, 65536), "home")
        if home and home.startswith("/"):
            # Resolved first: a venv made by /bin/python3 on a merged-/usr system says home = /bin,
            # whose prefix is /usr (where /bin leads), not the root.
            try:
                home, _ = walk(fs, home)
            except ValueError:
                break  # a symlink loop: no prefix to bind (the interpreter will say what it misses)
            base = posixpath.dirname(home) if posixpath.basename(home.rstrip("/")) == "bin" else home
            # Only a Python prefix (its standard library under lib/): a pyvenv.cfg that a server
            # could rewrite in its own venv must not name any other directory into its next sandbox.
            if any(fs.kind(posixpath.join(base, lib)) == "dir" for lib in ("lib", "Lib")):
                collect.see(base, "prefix")
        break
    real_bin = posixpath.dirname(real)
    if posixpath.basename(real_bin) == "bin":
        prefix = posixpath.dirname(real_bin)
        if fs.kind(posixpath.join(prefix, "lib")) is not None and prefix not in ("/", "/usr", "/usr/local"):
            collect.see(prefix, "prefix")


def _cfg_value(text: bytes, key: str) -> str | None:
    for line in text.decode("utf-8", "replace").splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip().lower() == key:
            return value.strip()
    return None


def _scripts(collect: _Collector, args: Iterable[str], cwd: str) -> None:
    """Arguments naming existing files (a script, a Node entry point): bound, with their package."""
    fs = collect.fs
    for arg in args:
        if arg.startswith("-") or "/" not in arg:
            continue
        path = arg if arg.startswith("/") else posixpath.normpath(posixpath.join(cwd, arg))
        try:
            real, _ = walk(fs, path)
        except ValueError:
            continue
        if fs.kind(real) != "file":
            continue  # directories are data: the profile's read/write decides those
        modules = _outer_node_modules(path) or _outer_node_modules(real)
        if modules is not None:
            collect.see(modules, "node_modules")
            if not _inside(real, modules):
                collect.see(path, "script")
        else:
            collect.see(path, "script")


def _outer_node_modules(path: str) -> str | None:
    marker = "/node_modules/"
    at = path.find(marker)
    return path[: at + len(marker) - 1] if at >= 0 else None


def _caches(collect: _Collector, real: str, args: Sequence[str], env: Mapping[str, str]) -> None:
    """npx and uvx install into a cache at run time: overlay it so writes never reach the host's."""
    fs = collect.fs
    name = posixpath.basename(real)
    scripts = [posixpath.basename(a) for a in args[:1]]
    home = env.get("HOME", "")
    candidates: list[tuple[str, Literal["ro", "overlay"]]] = []
    if name in ("npx", "npm") or any(s in ("npx-cli.js", "npm-cli.js") for s in scripts):
        cache = env.get("NPM_CONFIG_CACHE") or env.get("npm_config_cache") or (home and f"{home}/.npm")
        if cache:
            candidates.append((cache, "overlay"))
    if name in ("uvx", "uv"):
        cache = env.get("UV_CACHE_DIR") or (
            f"{env['XDG_CACHE_HOME']}/uv" if env.get("XDG_CACHE_HOME") else home and f"{home}/.cache/uv"
        )
        data = env.get("XDG_DATA_HOME") or (home and f"{home}/.local/share")
        if cache:
            candidates.append((cache, "overlay"))
        if data:
            candidates.append((f"{data}/uv", "ro"))
    for path, mode in candidates:
        if path.startswith("/") and fs.kind(path) is not None:
            collect.see(path, "cache", mode)
