"""An in-memory ``FsView``: a dictionary of paths, so resolution and planning run without a disk."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from truss.mcp.sandbox._resolve import Kind

ELF = b"\x7fELF\x02\x01\x01" + b"\0" * 57


@dataclass
class FakeFs:
    """Files (content, executable), directories and symlinks; parents need no entry of their own."""

    files: dict[str, tuple[bytes, bool]] = field(default_factory=dict[str, tuple[bytes, bool]])
    dirs: set[str] = field(default_factory=set[str])
    links: dict[str, str] = field(default_factory=dict[str, str])

    def file(self, path: str, content: bytes = ELF, *, executable: bool = True) -> FakeFs:
        self.files[path] = (content, executable)
        return self

    def dir(self, *paths: str) -> FakeFs:
        self.dirs.update(paths)
        return self

    def link(self, path: str, target: str) -> FakeFs:
        self.links[path] = target
        return self

    def _parents(self, path: str) -> str:
        """``path`` with every component but the last resolved through symlinks, as lstat sees it."""
        done = ""
        parts = [p for p in path.split("/") if p]
        for part in parts[:-1]:
            done = self._follow(f"{done}/{part}")
        return f"{done}/{parts[-1]}" if parts else "/"

    def kind(self, path: str) -> Kind | None:
        path = self._parents(path)
        if path in self.links:
            return "link"
        if path in self.files:
            return "file"
        if path in self.dirs or any(p.startswith(path.rstrip("/") + "/") for p in (*self.files, *self.dirs)):
            return "dir"
        return None

    def readlink(self, path: str) -> str:
        return self.links[self._parents(path)]

    def _follow(self, path: str) -> str:
        path = self._parents(path) if path.count("/") > 1 else path
        for _ in range(40):
            if path not in self.links:
                return path
            target = self.links[path]
            path = posixpath.normpath(target if target.startswith("/") else path.rsplit("/", 1)[0] + "/" + target)
        return path

    def head(self, path: str, size: int) -> bytes:
        entry = self.files.get(self._follow(path))
        return entry[0][:size] if entry else b""

    def executable(self, path: str) -> bool:
        entry = self.files.get(self._follow(path))
        return bool(entry and entry[1])


def debian() -> FakeFs:
    """A merged-/usr Debian-like system: /bin, /lib are symlinks into /usr; python3 and node in /usr."""
    fs = FakeFs()
    fs.link("/bin", "usr/bin").link("/sbin", "usr/sbin").link("/lib", "usr/lib").link("/lib64", "usr/lib64")
    fs.dir("/usr", "/etc/alternatives", "/etc/ssl/certs", "/etc/ld.so.conf.d")
    fs.file("/etc/ld.so.cache", b"", executable=False).file(
        "/etc/passwd", b"root:x:0:0::/root:/bin/sh\n", executable=False
    )
    fs.file("/etc/resolv.conf", b"nameserver 192.0.2.53\n", executable=False)
    fs.file("/usr/bin/env").file("/usr/bin/python3.11").link("/usr/bin/python3", "python3.11")
    fs.file("/usr/bin/node").file("/usr/bin/true")
    return fs
