"""The bwrap plan for one server: namespaces, mount order, Truss's protected paths, env, description. Pure."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.sandbox._fakefs import FakeFs, debian
from truss._errors import SandboxError
from truss.mcp.sandbox import (
    PROXY_SOCKET,
    Bwrap,
    Limits,
    Profile,
    SandboxPlan,
    parse_host_rule,
    plan_for,
    plan_sandbox,
    resolve_command,
    system_layout,
)
from truss.mcp.sandbox._confine import _helper_python  # pyright: ignore[reportPrivateUsage]

HOME = "/srv/shared/truss-home"


def _fs() -> FakeFs:
    fs = debian().file("/opt/srv/bin/server", b"#!/usr/bin/python3\n")
    fs.dir(HOME, "/srv/shared/data", "/srv/work", "/home/u")
    fs.file(f"{HOME}/identity.key", b"key", executable=False).file(f"{HOME}/ledger.db", b"db", executable=False)
    fs.file("/var/lib/ledger.db", b"db", executable=False).file("/var/lib/ledger.db-wal", b"wal", executable=False)
    fs.link("/data", "/srv")
    return fs


def _plan(
    profile: Profile,
    *,
    fs: FakeFs | None = None,
    env: dict[str, str] | None = None,
    protected: Sequence[str] = (HOME, f"{HOME}/identity.key", f"{HOME}/ledger.db"),
    cwd: str = "/srv/work",
    command: str = "/opt/srv/bin/server",
    userns: bool = True,
) -> SandboxPlan:
    fs = fs or _fs()
    env = env if env is not None else {"PATH": "/usr/bin", "HOME": "/home/u"}
    resolution = resolve_command(fs, command, ["--flag"], env, cwd)
    helper = resolve_command(fs, "/usr/bin/python3.11", [], {}, "/")
    return plan_sandbox(
        profile,
        resolution,
        helper,
        system_layout(fs, network=profile.network != "none"),
        fs,
        command=command,
        args=["--flag"],
        env=env,
        cwd=cwd,
        protected=protected,
        inner_script="/usr/lib/truss/_inner.py",
        proxy_socket="/tmp/truss-sbx-x/proxy.sock" if profile.network == "allow" else None,
        bwrap_version="0.11.0",
        userns=userns,
        server="s",
    )


def _pairs(options: Sequence[str], flag: str) -> list[str]:
    return [options[i + 1] for i, o in enumerate(options) if o == flag]


@pytest.mark.parametrize(
    ("network", "unshared"), [("none", True), ("allow", True), ("host", False)], ids=["none", "allow", "host"]
)
def test_every_namespace_is_new_and_the_network_one_unless_host(network: str, unshared: bool) -> None:
    hosts = (parse_host_rule("api.github.com:443"),) if network == "allow" else ()
    plan = _plan(Profile(network=network, allow_hosts=hosts))  # pyright: ignore[reportArgumentType]
    for flag in ("--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc", "--unshare-uts"):
        assert flag in plan.options
    assert ("--unshare-net" in plan.options) is unshared
    assert "--die-with-parent" in plan.options and "--new-session" in plan.options
    assert plan.options[plan.options.index("--cap-drop") + 1] == "ALL"


def test_without_user_namespaces_the_plan_asks_for_none() -> None:
    plan = _plan(Profile(), userns=False)
    assert "--unshare-user" not in plan.options and "--disable-userns" not in plan.options
    assert "user" not in plan.description["namespaces"]


def test_fresh_tmp_proc_dev_and_home_come_before_the_binds_and_the_root_is_read_only_last() -> None:
    plan = _plan(Profile(write=("/srv/work",)))
    opts = list(plan.options)
    first_bind = opts.index("--ro-bind")
    assert opts.index("/tmp") < first_bind and opts.index("/proc") < first_bind and opts.index("/dev") < first_bind
    assert _pairs(opts, "--tmpfs")[:3] == ["/dev/shm", "/tmp", "/home/u"]
    assert opts[-4:] == ["--remount-ro", "/dev", "--remount-ro", "/"]
    assert opts[opts.index("--bind") + 1] == "/srv/work"


def test_a_bind_that_contains_truss_home_masks_it_whatever_the_binds_say() -> None:
    plan = _plan(Profile(read=("/srv/shared",)))
    opts = list(plan.options)
    assert plan.masked == (HOME,)
    at = opts.index(HOME, opts.index("/srv/shared") + 2)
    assert opts[at - 1] == "--tmpfs" and opts[at + 1 : at + 3] == ["--remount-ro", HOME]
    assert at > max(i for i, o in enumerate(opts) if o in ("--ro-bind", "--bind") and opts[i + 1] != "/dev/null")
    assert plan.description["masked"] == [HOME]


def test_a_bind_that_reaches_truss_home_through_a_symlink_masks_its_real_path() -> None:
    plan = _plan(Profile(read=("/data",)))
    assert plan.masked == (HOME,)
    # The bind is made at the real path, and the symlink the operator wrote is recreated beside it.
    assert "/srv" in _pairs(plan.options, "--ro-bind")
    opts = list(plan.options)
    assert any(opts[i : i + 3] == ["--symlink", "/srv", "/data"] for i in range(len(opts)))


LEDGER = ("/var/lib/ledger.db", "/var/lib/ledger.db-wal", "/var/lib/ledger.db-shm", "/var/lib/ledger.db-journal")


@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_bind_above_a_ledger_outside_the_home_hides_the_ledgers_directory_whole(mode: str) -> None:
    # A mask over ledger.db alone left /var/lib writable: a server could plant ledger.db-journal
    # there after the plan, which SQLite applies as a rollback at the next open.
    profile = Profile(read=("/var",)) if mode == "read" else Profile(write=("/var",))
    plan = _plan(profile, protected=(HOME, *LEDGER))
    assert plan.masked == ("/var/lib",)
    opts = list(plan.options)
    at = opts.index("/var/lib")
    assert opts[at - 1] == "--tmpfs" and opts[at + 1 : at + 3] == ["--remount-ro", "/var/lib"]
    assert at > opts.index("/var")
    assert "/dev/null" not in _pairs(opts, "--ro-bind")
    assert plan.description["masked"] == ["/var/lib"]


@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_bind_of_the_directory_holding_a_ledger_outside_the_home_is_refused(mode: str) -> None:
    # Hiding /var/lib whole would hide the whole bind; showing it shows the sidecars made later.
    profile = Profile(read=("/var/lib",)) if mode == "read" else Profile(write=("/var/lib",))
    with pytest.raises(SandboxError) as caught:
        _plan(profile, protected=(HOME, *LEDGER))
    assert caught.value.cause == "exposes_ledger"
    assert caught.value.fields["path"] == "/var/lib"


def test_a_bind_of_the_ledgers_directory_by_a_symlink_is_refused_at_its_real_path() -> None:
    fs = _fs().link("/srv/ledgers", "/var/lib")
    with pytest.raises(SandboxError) as caught:
        _plan(Profile(write=("/srv/ledgers",)), fs=fs, protected=(HOME, *LEDGER))
    assert caught.value.cause == "exposes_ledger"
    assert caught.value.fields["path"] == "/var/lib"


def _ledger_behind_a_link() -> tuple[FakeFs, tuple[str, ...]]:
    # --db /srv/work/ledgers/ledger.db, where /srv/work/ledgers -> /var/lib.
    fs = _fs().link("/srv/work/ledgers", "/var/lib")
    return fs, (HOME, *(p.replace("/var/lib", "/srv/work/ledgers") for p in LEDGER))


def test_a_write_bind_holding_a_symlink_on_the_way_to_the_ledger_is_refused() -> None:
    # A server that may write /srv/work could point the link at a ledger (and a journal) of its
    # own, which Truss opens by that name at the next run.
    fs, protected = _ledger_behind_a_link()
    with pytest.raises(SandboxError) as caught:
        _plan(Profile(write=("/srv/work",)), fs=fs, protected=protected)
    assert caught.value.cause == "exposes_ledger"
    assert caught.value.fields["path"] == "/srv/work/ledgers"


def test_a_read_bind_holding_a_symlink_on_the_way_to_the_ledger_stays_allowed() -> None:
    fs, protected = _ledger_behind_a_link()
    plan = _plan(Profile(read=("/srv/work",)), fs=fs, protected=protected)
    assert ("/srv/work", "ro") in [(b.path, b.mode) for b in plan.binds]


def test_a_write_bind_of_a_directory_beside_a_ledger_outside_the_home_stays_allowed() -> None:
    fs = _fs().dir("/var/lib/work")
    plan = _plan(Profile(write=("/var/lib/work",)), fs=fs, protected=(HOME, *LEDGER))
    assert ("/var/lib/work", "rw") in [(b.path, b.mode) for b in plan.binds]
    assert plan.masked == ()


@pytest.mark.parametrize(
    "profile",
    [
        pytest.param(Profile(read=("/var",), write=("/var/lib/work",)), id="a_write_bind"),
        pytest.param(Profile(read=("/var", "/var/lib/work")), id="a_read_bind_inside_a_read_bind"),
    ],
)
def test_a_bind_inside_the_ledgers_hidden_directory_is_mounted_on_top_of_the_mask(profile: Profile) -> None:
    fs = _fs().dir("/var/lib/work")
    plan = _plan(profile, fs=fs, protected=(HOME, *LEDGER))
    assert plan.masked == ("/var/lib",)
    opts = list(plan.options)
    tmpfs, inner = opts.index("/var/lib"), opts.index("/var/lib/work")
    assert opts[tmpfs - 1] == "--tmpfs" and opts.index("/var") < tmpfs < inner
    assert opts[inner - 1] in ("--bind", "--ro-bind") and opts[inner + 1] == "/var/lib/work"
    assert opts.index("--remount-ro") > inner + 1 and opts[opts.index("--remount-ro") + 1] == "/var/lib"


def test_a_path_the_command_needs_inside_the_ledgers_hidden_directory_is_bound_on_top_of_the_mask() -> None:
    fs = _fs().file("/var/lib/tool/bin/server")
    plan = _plan(Profile(read=("/var",)), fs=fs, command="/var/lib/tool/bin/server", protected=(HOME, *LEDGER))
    assert ("/var/lib/tool/bin/server", "ro") in [(b.path, b.mode) for b in plan.binds]
    opts = list(plan.options)
    assert opts.index("/var/lib") < opts.index("/var/lib/tool/bin/server")


def test_a_working_directory_inside_the_ledgers_hidden_directory_is_refused() -> None:
    fs = _fs().dir("/var/lib/work")
    with pytest.raises(SandboxError) as caught:
        _plan(Profile(write=("/var",)), fs=fs, cwd="/var/lib/work", protected=(HOME, *LEDGER))
    assert caught.value.cause == "exposes_ledger"
    assert caught.value.fields["path"] == "/var/lib/work"


def test_truss_home_and_a_key_inside_a_system_tree_are_masked_although_no_bind_names_them() -> None:
    # A system-wide install (TRUSS_HOME=/usr/local/var/truss, the key under /usr/local/etc):
    # /usr is bound whole, read-only, in every sandbox.
    home, key = "/usr/local/var/truss", "/usr/local/etc/truss/identity.key"
    fs = _fs().file(f"{home}/ledger.db", b"db", executable=False).file(key, b"key", executable=False)
    plan = _plan(Profile(), fs=fs, protected=(home, key, f"{home}/ledger.db"))
    # The key's directory is hidden whole, as a ledger's is: nothing written beside it later shows.
    key_dir = "/usr/local/etc/truss"
    assert plan.masked == (key_dir, home)
    opts = list(plan.options)
    for hidden in (home, key_dir):
        at = opts.index(hidden, opts.index("/usr") + 2)
        assert opts[at - 1] == "--tmpfs" and opts[at + 1 : at + 3] == ["--remount-ro", hidden]
    assert key not in opts
    assert plan.description["masked"] == [key_dir, home]


def test_a_relative_truss_home_is_masked_as_surely_as_an_absolute_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TRUSS_HOME=.truss (or protected=[".truss"]) means the directory below Truss's working directory.
    work = os.path.realpath(tmp_path)
    fs = debian().file(_helper_python()).file(f"{work}/.truss/identity.key", b"key", executable=False)
    fs.file(f"{work}/server")
    monkeypatch.chdir(work)
    monkeypatch.setenv("TRUSS_HOME", ".truss")
    bwrap = Bwrap(path="/usr/bin/bwrap", version="0.11.0", source="PATH")
    for protected in ([], [".truss"]):
        plan = plan_for(
            Profile(read=(work,)), f"{work}/server", [], {"PATH": "/usr/bin"}, work, server="s", bwrap=bwrap,
            protected=protected, fs=fs,
        )  # fmt: skip
        assert plan.masked == (f"{work}/.truss",)


@pytest.mark.parametrize(
    "profile",
    [
        pytest.param(Profile(read=(HOME,)), id="read_the_home"),
        pytest.param(Profile(write=(f"{HOME}/../truss-home",)), id="write_into_the_home"),
        pytest.param(Profile(read=(f"{HOME}/identity.key",)), id="read_the_key"),
        pytest.param(Profile(read=("/data/shared/truss-home",)), id="the_home_through_a_symlink"),
    ],
)
def test_a_bind_inside_truss_home_is_refused(profile: Profile) -> None:
    with pytest.raises(SandboxError) as caught:
        _plan(profile)
    assert caught.value.cause == "protected_path"


@pytest.mark.parametrize(
    "profile",
    [
        # /data is a symlink to /srv: the layering compares the paths as written, the plan binds real paths.
        pytest.param(Profile(read=("/srv/shared",), write=("/data/shared",)), id="the_read_path_again_by_a_symlink"),
        pytest.param(Profile(read=("/srv/shared",), write=("/data/shared/data",)), id="inside_it_by_a_symlink"),
    ],
)
def test_a_write_path_that_reaches_a_read_only_path_through_a_symlink_is_refused(profile: Profile) -> None:
    # Else a contract's write = ["/data/shared"] made the operator's read-only /srv/shared writable.
    with pytest.raises(SandboxError) as caught:
        _plan(profile)
    assert caught.value.cause == "aliased_bind"
    assert caught.value.fields["path"] == profile.write[0]


@pytest.mark.parametrize(
    ("link", "target"),
    [
        pytest.param("/srv/everything", "/", id="a_symlink_to_the_root"),
        pytest.param("/srv/host-root", "/proc/1/root", id="a_symlink_to_proc_1_root"),
        pytest.param("/srv/disk", "/dev/sda", id="a_symlink_to_a_device"),
    ],
)
@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_profile_path_that_is_a_symlink_to_the_root_or_a_kernel_file_system_is_refused(
    link: str, target: str, mode: str
) -> None:
    # The profile refuses /, /proc, /sys and /dev as written; a symlink to them must not get past.
    fs = _fs().link(link, target).link("/proc/1/root", "/").file("/dev/sda", b"", executable=False)
    profile = Profile(read=(link,)) if mode == "read" else Profile(write=(link,))
    with pytest.raises(SandboxError) as caught:
        _plan(profile, fs=fs)
    assert caught.value.cause == "unresolvable"
    assert caught.value.fields["path"] == link


class _GuardedProc(FakeFs):
    """/proc/1/root as an unprivileged process in a container meets it: a link it may not read."""

    def readlink(self, path: str) -> str:
        if path.startswith("/proc/1/"):
            raise PermissionError(13, "Permission denied", path)
        return super().readlink(path)


def test_a_symlink_the_planner_may_not_read_is_a_sandbox_error_not_a_traceback() -> None:
    fs = _GuardedProc(files=dict(_fs().files), dirs=set(_fs().dirs), links=dict(_fs().links))
    fs.link("/srv/host-root", "/proc/1/root").link("/proc/1/root", "/")
    with pytest.raises(SandboxError) as caught:
        _plan(Profile(read=("/srv/host-root",)), fs=fs)
    assert caught.value.cause == "unresolvable"
    # A protected path behind such a link does not stop the plan either.
    plan = _plan(Profile(read=("/srv",)), fs=fs, protected=(HOME, "/srv/host-root/key"))
    assert plan.masked == (HOME,)


def test_a_write_path_inside_a_read_path_as_written_stays_writable_on_top_of_it() -> None:
    plan = _plan(Profile(read=("/data",), write=("/data/work",)))
    assert [(b.path, b.mode) for b in plan.binds if b.why == "profile"] == [("/srv", "ro"), ("/srv/work", "rw")]


def test_a_server_whose_executable_lives_in_truss_home_is_refused() -> None:
    fs = _fs().file(f"{HOME}/bin/server")
    with pytest.raises(SandboxError) as caught:
        _plan(Profile(), fs=fs, command=f"{HOME}/bin/server")
    assert caught.value.cause == "protected_path"


def test_a_profile_path_that_does_not_exist_is_refused_before_the_start() -> None:
    with pytest.raises(SandboxError) as caught:
        _plan(Profile(read=("/srv/nothing",)))
    assert caught.value.cause == "unresolvable"


def test_environment_values_never_appear_in_the_options_or_the_command() -> None:
    env = {"PATH": "/usr/bin", "HOME": "/home/u", "GITHUB_TOKEN": "ghp_secretvalue123"}
    plan = _plan(Profile(), env=env)
    words = " ".join((*plan.options, *plan.command))
    assert "ghp_secretvalue123" not in words
    assert plan.env_names == ("GITHUB_TOKEN", "HOME", "PATH")
    assert "ghp_secretvalue123" not in json.dumps(plan.description)


def test_network_allow_binds_the_proxy_socket_and_points_the_proxy_variables_at_the_relay() -> None:
    plan = _plan(Profile(network="allow", allow_hosts=(parse_host_rule("api.github.com:443"),)))
    opts = list(plan.options)
    assert opts[opts.index(PROXY_SOCKET) - 2 : opts.index(PROXY_SOCKET)] == ["--ro-bind", "/tmp/truss-sbx-x/proxy.sock"]
    assert dict(plan.extra_env)["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    config: dict[str, Any] = json.loads(plan.command[4])
    assert config["relay"] == {"port": 3128, "socket": PROXY_SOCKET}
    assert "/etc/resolv.conf" in _pairs(opts, "--ro-bind-try")


def test_network_none_has_no_proxy_socket_no_relay_and_no_resolv() -> None:
    plan = _plan(Profile())
    assert PROXY_SOCKET not in plan.options and plan.extra_env == ()
    assert json.loads(plan.command[4])["relay"] is None
    assert "/etc/resolv.conf" not in plan.options


def test_limits_become_rlimits_for_the_server_with_room_for_trusss_helpers() -> None:
    plan = _plan(Profile(limits=Limits(memory=1 << 29, processes=64, cpu_s=120, file_size=1 << 20)))
    config = json.loads(plan.command[4])
    assert config["rlimits"] == {"CORE": 0, "DATA": 1 << 29, "NPROC": 66, "CPU": 120, "FSIZE": 1 << 20}
    assert _pairs(plan.options, "--size")[:2] == [str(1 << 29)] * 2


def test_the_supervisor_execs_the_resolved_executable_with_the_command_as_argv0() -> None:
    plan = _plan(Profile())
    assert plan.command[:4] == ("/usr/bin/python3.11", "-I", "-S", "/run/truss/inner.py")
    assert plan.command[5:] == ("--", "/opt/srv/bin/server", "/opt/srv/bin/server", "--flag")


def test_a_cwd_outside_every_bind_is_created_empty_and_reported_as_not_visible() -> None:
    plan = _plan(Profile(), cwd="/srv/work", env={"PATH": "/usr/bin", "PYTHONPATH": "/srv/shared/data"})
    assert _pairs(plan.options, "--dir") == ["/srv/work"]
    assert ("cwd", "/srv/work") in plan.not_visible
    assert ("PYTHONPATH", "/srv/shared/data") in plan.not_visible


def test_the_description_is_json_with_the_bwrap_version_binds_and_limits() -> None:
    plan = _plan(Profile(read=("/srv/shared",), limits=Limits(processes=8)))
    description = json.loads(json.dumps(plan.description, sort_keys=True))
    assert description["bwrap_version"] == "0.11.0"
    assert description["network"] == "none"
    assert {"path": "/srv/shared", "mode": "ro", "why": "profile"} in description["binds"]
    assert {"path": "/opt/srv/bin/server", "mode": "ro", "why": "executable"} in description["binds"]
    assert description["limits"]["processes"] == 8
    assert description["env"] == ["HOME", "PATH"]


def test_a_symlink_in_the_fresh_home_is_recreated_there() -> None:
    fs = _fs().link("/home/u/.local/bin/tool", "/opt/tool/bin/tool").file("/opt/tool/bin/tool")
    plan = _plan(Profile(), fs=fs, command="/home/u/.local/bin/tool")
    opts = list(plan.options)
    assert any(
        opts[i : i + 3] == ["--symlink", "/opt/tool/bin/tool", "/home/u/.local/bin/tool"] for i in range(len(opts))
    )
    assert opts.index("/home/u") < opts.index("/home/u/.local/bin/tool")
