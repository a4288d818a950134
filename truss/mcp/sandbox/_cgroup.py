"""Control groups for a sandbox, where this process may create them: limits, hit counters, kill-all.

Tried per controller (``pids``, ``memory``): cgroup v2 first (a child of this process's own
cgroup, with the controller enabled for its children), then the v1 hierarchy of that controller.
Neither is writable for most unprivileged users outside a delegated systemd scope; then only the
rlimits apply (docs/sandbox.md says what that loses). The launcher joins the cgroups before it
execs bwrap, so every process of the sandbox is inside from its first instruction.

The counters the kernel keeps (``pids.events``, ``memory.events``, ``memory.oom_control``)
are how a limit hit is recognised afterwards. Kernel interface files only; no policy here.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from truss._sandbox_profile import Limits

__all__ = ["HELPER_MEMORY_BYTES", "HELPER_TASKS_CGROUP", "Cgroups", "LimitHit", "setup_cgroups"]

# The outer bwrap, bwrap's init and the supervisor live in the cgroup with the server.
HELPER_TASKS_CGROUP = 3
HELPER_MEMORY_BYTES = 64 * 1024 * 1024
_PROC_SELF = Path("/proc/self")
_COUNTER_LIMIT = 4096  # the counter files are a few lines


@dataclass(frozen=True)
class LimitHit:
    """A limit the kernel enforced: ``limit`` is ``processes``, ``memory``, ``cpu`` or ``file_size``."""

    limit: str
    evidence: str

    def as_json(self) -> dict[str, str]:
        return {"limit": self.limit, "evidence": self.evidence}


@dataclass
class Cgroups:
    """The cgroup directories made for one sandbox (one per controller; v1 and v2 may mix)."""

    dirs: dict[str, tuple[str, Path]] = field(
        default_factory=dict[str, tuple[str, Path]]
    )  # controller -> (version, dir)
    # The counter files, opened once and re-read with pread: a call's limit check reads them after
    # every call, and an open, read and close through pathlib cost ~13 us each against ~1 us.
    _counters: dict[tuple[str, str], int] = field(default_factory=dict[tuple[str, str], int], repr=False, compare=False)
    # Each counter file's last bytes and their ``key value`` fields: the usual answer after a call
    # is the same bytes as after the last one, which then need no parsing.
    _parsed: dict[tuple[str, str], tuple[bytes, dict[str, int]]] = field(
        default_factory=dict[tuple[str, str], tuple[bytes, dict[str, int]]], repr=False, compare=False
    )

    @property
    def summary(self) -> dict[str, str]:
        return {controller: version for controller, (version, _) in sorted(self.dirs.items())}

    @property
    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for _, d in self.dirs.values()})

    def hits(self) -> list[LimitHit]:
        # Asked after every call (in Truss's process, between the answer and the model): each
        # counter file is read once, with one pread on a descriptor kept open, and parsed only
        # when its bytes differ from the last read's.
        found: list[LimitHit] = []
        if "pids" in self.dirs:
            count = self._fields("pids", "pids.events").get("max", 0)
            if count:
                found.append(LimitHit("processes", f"pids.events max {count}"))
        if "memory" in self.dirs:
            if self.dirs["memory"][0] == "v2":
                events = self._fields("memory", "memory.events")
                count = events.get("oom_kill", 0) or events.get("oom", 0)
                if count:
                    found.append(LimitHit("memory", f"memory.events oom_kill {count}"))
            else:
                count = self._fields("memory", "memory.oom_control").get("oom_kill", 0)
                fails = self._fields("memory", "memory.failcnt").get("", 0)  # a bare number: key ""
                if count or fails:
                    found.append(LimitHit("memory", f"memory.oom_control oom_kill {count}, memory.failcnt {fails}"))
        return found

    def _fields(self, controller: str, name: str) -> dict[str, int]:
        """The ``key value`` lines of a counter file (a bare number under the key ""), read once;
        parsed again only when its bytes changed. Callers must not change the answer."""
        key = (controller, name)
        raw = self._read(controller, name)
        last = self._parsed.get(key)
        if last is not None and last[0] == raw:
            return last[1]
        fields: dict[str, int] = {}
        for line in raw.decode("ascii", "replace").splitlines():
            head, _, value = line.partition(" ")
            if value:
                fields[head] = _int(value)
            else:
                fields[""] = _int(head)
        self._parsed[key] = (raw, fields)
        return fields

    def _read(self, controller: str, name: str) -> bytes:
        """The bytes of a kernel counter file (b'' when it cannot be read), its descriptor kept open."""
        key = (controller, name)
        try:
            fd = self._counters.get(key)
            if fd is None:
                path = self.dirs[controller][1] / name
                fd = self._counters[key] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(fd, _COUNTER_LIMIT, 0)
        except OSError:
            return b""

    def close(self) -> None:
        """Close the counter files (``hits`` reopens them if it is asked again)."""
        for fd in self._counters.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._counters.clear()

    def members(self) -> list[int]:
        pids: set[int] = set()
        for _, d in self.dirs.values():
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(line) for line in (d / "cgroup.procs").read_text().split())
        return sorted(pids)

    async def kill_all(self, within_s: float = 5.0) -> bool:
        """SIGKILL every process left in the cgroups, until none is; True when they emptied."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(within_s):
            for version, d in self.dirs.values():
                if version == "v2" and (d / "cgroup.kill").exists():
                    with contextlib.suppress(OSError):
                        (d / "cgroup.kill").write_text("1")
            # Nothing signals that a cgroup emptied (v1 has no events file for it): poll, bounded.
            while members := self.members():
                for pid in members:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                await anyio.sleep(0.01)
            return True
        return False

    def remove(self) -> None:
        self.close()
        for _, d in self.dirs.values():
            with contextlib.suppress(OSError):
                d.rmdir()


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        return 0


def _own_cgroups(proc: Path) -> dict[str, str]:
    """Hierarchy id or controller -> this process's cgroup path (``"0"`` is the v2 one)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in (proc / "cgroup").read_text().splitlines():
            hid, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if hid == "0" and not controllers:
                out["0"] = path
            for name in controllers.split(","):
                if name:
                    out[name] = path
    return out


def _mounts(proc: Path) -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) of each cgroup mount."""
    found: list[tuple[str, str, str, set[str]]] = []
    with contextlib.suppress(OSError):
        for line in (proc / "mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
                continue
            found.append((tail[0], fields[3], fields[4], set(tail[2].split(","))))
    return found


def _under(mount_point: str, root: str, path: str) -> Path | None:
    if root != "/" and not (path == root or path.startswith(root + "/")):
        return None
    rel = path[len(root) :] if root != "/" else path
    return Path(mount_point + rel)


def setup_cgroups(name: str, limits: Limits, *, proc: Path = _PROC_SELF) -> tuple[Cgroups, list[str]]:
    """Create ``name`` under this process's cgroups and set the limits; also the reasons it could not."""
    own = _own_cgroups(proc)
    mounts = _mounts(proc)
    groups = Cgroups()
    reasons: list[str] = []
    v2_base = None
    for fstype, root, point, _ in mounts:
        if fstype == "cgroup2" and "0" in own:
            v2_base = _under(point, root, own["0"])
            break
    for controller in ("pids", "memory"):
        made = _try_v2(v2_base, name, controller) if v2_base is not None else None
        version = "v2"
        if made is None:
            version = "v1"
            for fstype, root, point, options in mounts:
                if fstype == "cgroup" and controller in options and controller in own:
                    base = _under(point, root, own[controller])
                    made = _try_dir(base / name) if base is not None else None
                    break
        if made is None:
            reasons.append(f"no writable {controller} cgroup")
            continue
        try:
            _apply(controller, version, made, limits)
        except OSError as exc:
            # On v2 both controllers are one directory: while a controller set up before uses it, it
            # stays (an empty cgroup's rmdir succeeds, and would take the listed one with it).
            if all(d != made for _, d in groups.dirs.values()):
                with contextlib.suppress(OSError):
                    made.rmdir()
            reasons.append(f"cannot set the {controller} cgroup's limit: {exc.strerror}")
            continue
        groups.dirs[controller] = (version, made)
    return groups, reasons


def _try_dir(path: Path) -> Path | None:
    try:
        path.mkdir()
    except FileExistsError:
        pass
    except OSError:
        return None
    if not os.access(path / "cgroup.procs", os.W_OK):
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


def _try_v2(base: Path, name: str, controller: str) -> Path | None:
    control = f"{controller}.max"
    child = _try_dir(base / name)
    if child is None:
        return None
    if not (child / control).exists():
        with contextlib.suppress(OSError):
            (base / "cgroup.subtree_control").write_text(f"+{controller}")
    if (child / control).exists():
        return child
    # Leave the directory for the other controller; remove it if neither uses it.
    with contextlib.suppress(OSError):
        if not any((child / f"{c}.max").exists() for c in ("pids", "memory")):
            child.rmdir()
    return None


def _apply(controller: str, version: str, d: Path, limits: Limits) -> None:
    if controller == "pids" and limits.processes is not None:
        (d / "pids.max").write_text(str(limits.processes + HELPER_TASKS_CGROUP))
    if controller == "memory" and limits.memory is not None:
        value = str(limits.memory + HELPER_MEMORY_BYTES)
        if version == "v2":
            (d / "memory.max").write_text(value)
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
        else:
            (d / "memory.limit_in_bytes").write_text(value)
            if (d / "memory.memsw.limit_in_bytes").exists():
                with contextlib.suppress(OSError):
                    (d / "memory.memsw.limit_in_bytes").write_text(value)
