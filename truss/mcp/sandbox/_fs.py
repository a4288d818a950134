"""The real file system behind ``FsView``: the few ``lstat``/``readlink``/read calls resolution makes."""

from __future__ import annotations

import os
import stat

from truss.mcp.sandbox._resolve import Kind

__all__ = ["OsFs"]


class OsFs:
    """``FsView`` over this machine's file system (reads only)."""

    def kind(self, path: str) -> Kind | None:
        try:
            mode = os.lstat(path).st_mode
        except (OSError, ValueError):
            return None
        if stat.S_ISLNK(mode):
            return "link"
        if stat.S_ISDIR(mode):
            return "dir"
        if stat.S_ISREG(mode):
            return "file"
        return "other"

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def head(self, path: str, size: int) -> bytes:
        try:
            with open(path, "rb") as handle:
                return handle.read(size)
        except (OSError, ValueError):
            return b""

    def executable(self, path: str) -> bool:
        try:
            return stat.S_ISREG(os.stat(path).st_mode) and os.access(path, os.X_OK)
        except (OSError, ValueError):
            return False
