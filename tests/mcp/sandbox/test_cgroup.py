"""A sandbox's cgroups on a cgroup v2 mount that behaves as the kernel's does, without the kernel: a
limit that cannot be set leaves no cgroup listed that is gone and no cgroup behind.

``setup_cgroups`` reads this process's cgroups from the ``proc`` it is given, so a fake ``/proc``
points it at a directory of the test; ``FakeCgroup2`` makes that directory act as cgroupfs where a
plain file system differs: a new cgroup comes with its interface files, a write the kernel refuses
fails, and ``rmdir`` removes an empty cgroup with its interface files.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from truss.mcp.sandbox import Limits
from truss.mcp.sandbox._cgroup import setup_cgroups

MIB = 1024 * 1024


class FakeCgroup2:
    """A cgroup2 mount at ``root`` holding this process's cgroup ``sandboxes``, whose children may
    have the ``controllers`` given; the files named in ``refused`` cannot be written (EINVAL)."""

    def __init__(
        self, root: Path, monkeypatch: pytest.MonkeyPatch, *, controllers: set[str], refused: set[str]
    ) -> None:
        self.mount = root / "cgroup"
        self.base = self.mount / "sandboxes"
        self.controllers = controllers
        self.refused = refused
        self.proc = root / "proc"
        self.proc.mkdir()
        (self.proc / "cgroup").write_text("0::/sandboxes\n")
        (self.proc / "mountinfo").write_text(f"41 31 0:38 / {self.mount} rw,relatime - cgroup2 cgroup2 rw\n")
        self.base.mkdir(parents=True)
        for name in ("cgroup.procs", "cgroup.subtree_control"):
            (self.base / name).write_text("")
        mkdir, write_text, rmdir = Path.mkdir, Path.write_text, Path.rmdir

        def fake_mkdir(path: Path, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
            mkdir(path, mode, parents, exist_ok)
            if self._inside(path):
                self._populate(path)

        def fake_write_text(
            path: Path, data: str, encoding: str | None = None, errors: str | None = None, newline: str | None = None
        ) -> int:
            if not self._inside(path):
                return write_text(path, data, encoding, errors, newline)
            if path.name in self.refused:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))
            if path.name == "cgroup.subtree_control":
                wanted = data.strip().removeprefix("+")
                if wanted not in self.controllers:
                    raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
                enabled = set(path.read_text().split()) | {wanted}
                write_text(path, " ".join(sorted(enabled)))
                for child in path.parent.iterdir():
                    if child.is_dir():
                        self._populate(child)
                return len(data)
            return write_text(path, data)

        def fake_rmdir(path: Path) -> None:
            if not self._inside(path):
                return rmdir(path)
            if any(child.is_dir() for child in path.iterdir()):
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
            shutil.rmtree(path)  # an empty cgroup goes, and its interface files with it

        monkeypatch.setattr(Path, "mkdir", fake_mkdir)
        monkeypatch.setattr(Path, "write_text", fake_write_text)
        monkeypatch.setattr(Path, "rmdir", fake_rmdir)

    def _inside(self, path: Path) -> bool:
        return path.is_relative_to(self.base)

    def _populate(self, cgroup: Path) -> None:
        """The interface files of ``cgroup``: its own, and those of each controller its parent enables."""
        enabled = set((cgroup.parent / "cgroup.subtree_control").read_text().split())
        names = ["cgroup.procs", "cgroup.kill", "cgroup.subtree_control"]
        for controller in sorted(enabled):
            names += [f"{controller}.max", f"{controller}.events"]
        for name in names:
            if not (cgroup / name).exists():
                (cgroup / name).open("w").close()

    def cgroups_left(self) -> list[str]:
        return sorted(child.name for child in self.base.iterdir() if child.is_dir())


def test_a_memory_limit_refused_on_the_v2_cgroup_the_pids_limit_shares_keeps_that_cgroup_listed_and_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FakeCgroup2(tmp_path, monkeypatch, controllers={"pids", "memory"}, refused={"memory.max"})
    groups, reasons = setup_cgroups("truss-s1", Limits(processes=8, memory=256 * MIB), proc=fs.proc)
    assert groups.summary == {"pids": "v2"}
    assert len(reasons) == 1  # the memory limit, which could not be set
    assert all((d / "cgroup.procs").is_file() for _, d in groups.dirs.values())  # a sandbox can join it
    assert (fs.base / "truss-s1" / "pids.max").read_text() == "11"  # 8, and the 3 helper tasks
    groups.remove()
    assert fs.cgroups_left() == []


def test_a_memory_limit_refused_on_a_v2_cgroup_of_its_own_leaves_no_cgroup_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FakeCgroup2(tmp_path, monkeypatch, controllers={"memory"}, refused={"memory.max"})
    groups, reasons = setup_cgroups("truss-s1", Limits(processes=8, memory=256 * MIB), proc=fs.proc)
    assert groups.dirs == {} and len(reasons) == 2
    assert fs.cgroups_left() == []


def test_both_limits_set_on_one_v2_cgroup_list_it_for_both_controllers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FakeCgroup2(tmp_path, monkeypatch, controllers={"pids", "memory"}, refused=set())
    groups, reasons = setup_cgroups("truss-s1", Limits(processes=8, memory=256 * MIB), proc=fs.proc)
    assert (groups.summary, reasons) == ({"memory": "v2", "pids": "v2"}, [])
    assert groups.procs_files == [str(fs.base / "truss-s1" / "cgroup.procs")]
    groups.remove()
    assert fs.cgroups_left() == []
