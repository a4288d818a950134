"""Resolving what a command needs inside the sandbox, over an in-memory file system (no disk, no bwrap)."""

from __future__ import annotations

import pytest

from tests.mcp.sandbox._fakefs import FakeFs, debian
from truss._errors import SandboxError
from truss.mcp.sandbox import Bind, resolve_command, system_layout


def _unmerged() -> FakeFs:
    """A system without merged /usr: /lib and /bin are directories of their own."""
    fs = debian()
    for link in ("/bin", "/lib"):
        del fs.links[link]
    return fs.dir("/bin", "/lib/x86_64-linux-gnu")


def _venv_layout() -> FakeFs:
    fs = debian()
    # The checkout reaches the peers through a symlink in the middle of the path, as .peers does.
    fs.link("/home/dev/checkout/.peers", "/home/dev/shared/.peers")
    fs.file(
        "/home/dev/shared/.peers/py/bin/mcp-server-time", b"#!/home/dev/shared/.peers/py/bin/python3.11\nimport x\n"
    )
    fs.link("/home/dev/shared/.peers/py/bin/python3.11", "/opt/pyenv/versions/3.11.7/bin/python3.11")
    fs.file(
        "/home/dev/shared/.peers/py/pyvenv.cfg",
        b"home = /opt/pyenv/versions/3.11.7/bin\nversion = 3.11.7\n",
        executable=False,
    )
    fs.file("/opt/pyenv/versions/3.11.7/bin/python3.11").dir("/opt/pyenv/versions/3.11.7/lib/python3.11")
    return fs


def test_a_venv_console_script_binds_the_venv_and_its_base_prefix_and_recreates_each_symlink() -> None:
    fs = _venv_layout()
    env = {"PATH": "/home/dev/checkout/.peers/py/bin:/usr/bin"}
    found = resolve_command(fs, "mcp-server-time", ["--local-timezone", "UTC"], env, "/work")
    assert found.executable == "/home/dev/checkout/.peers/py/bin/mcp-server-time"
    assert found.chain == (found.executable, "/home/dev/shared/.peers/py/bin/python3.11")
    assert Bind("/home/dev/shared/.peers/py", "ro", "venv") in found.binds
    assert Bind("/opt/pyenv/versions/3.11.7", "ro", "prefix") in found.binds
    assert ("/home/dev/checkout/.peers", "/home/dev/shared/.peers") in found.symlinks
    assert ("/home/dev/shared/.peers/py/bin/python3.11", "/opt/pyenv/versions/3.11.7/bin/python3.11") in found.symlinks
    assert all(b.mode == "ro" for b in found.binds)


def test_an_env_shebang_finds_its_interpreter_on_the_servers_path() -> None:
    fs = debian().file("/srv/tool/run.py", b"#!/usr/bin/env python3\nprint()\n")
    found = resolve_command(fs, "/srv/tool/run.py", [], {"PATH": "/usr/bin"}, "/")
    assert found.chain == ("/srv/tool/run.py", "/usr/bin/python3")
    # The interpreter lives in /usr, which every sandbox binds: only the script is added.
    assert found.binds == (Bind("/srv/tool/run.py", "ro", "executable"),)


def test_env_dash_s_with_options_finds_the_program_after_them() -> None:
    fs = debian().file("/srv/app/cli", b"#!/usr/bin/env -S node --no-warnings\n")
    found = resolve_command(fs, "/srv/app/cli", [], {"PATH": "/usr/bin"}, "/")
    assert found.chain == ("/srv/app/cli", "/usr/bin/node")


def test_a_node_entry_point_binds_its_outermost_node_modules() -> None:
    fs = debian().file("/srv/app/node_modules/@scope/pkg/dist/index.js", b"import x from 'y'\n", executable=False)
    found = resolve_command(
        fs, "node", ["/srv/app/node_modules/@scope/pkg/dist/index.js", "stdio"], {"PATH": "/usr/bin"}, "/"
    )
    assert found.binds == (Bind("/srv/app/node_modules", "ro", "node_modules"),)


def test_directory_arguments_are_data_and_are_not_bound() -> None:
    fs = debian().dir("/srv/repo/.git").file("/srv/bin/server", b"\x7fELF")
    found = resolve_command(fs, "/srv/bin/server", ["--repository", "/srv/repo"], {}, "/")
    assert [b.path for b in found.binds] == ["/srv/bin/server"]


def test_npx_gets_its_cache_through_a_throwaway_overlay() -> None:
    fs = debian().file("/usr/share/nodejs/npm/bin/npx-cli.js", b"#!/usr/bin/env node\n")
    fs.link("/usr/bin/npx", "../share/nodejs/npm/bin/npx-cli.js").dir("/home/u/.npm/_npx")
    found = resolve_command(
        fs, "npx", ["-y", "@modelcontextprotocol/server-everything"], {"PATH": "/usr/bin", "HOME": "/home/u"}, "/"
    )
    assert Bind("/home/u/.npm", "overlay", "cache") in found.binds


def test_uvx_gets_its_cache_overlaid_and_its_pythons_read_only() -> None:
    fs = debian().file("/home/u/.local/bin/uvx").dir("/home/u/.cache/uv/archive-v0", "/home/u/.local/share/uv/python")
    found = resolve_command(
        fs, "uvx", ["mcp-server-time"], {"PATH": "/home/u/.local/bin:/usr/bin", "HOME": "/home/u"}, "/"
    )
    assert set(found.binds) == {
        Bind("/home/u/.local/bin/uvx", "ro", "executable"),
        Bind("/home/u/.cache/uv", "overlay", "cache"),
        Bind("/home/u/.local/share/uv", "ro", "cache"),
    }


def test_a_relative_path_entry_is_never_searched() -> None:
    fs = debian().file("/srv/checkout/server")
    with pytest.raises(SandboxError) as caught:
        resolve_command(fs, "server", [], {"PATH": ".:/usr/bin"}, "/srv/checkout")
    assert caught.value.cause == "unresolvable"


@pytest.mark.parametrize(
    ("fs", "command", "path_var"),
    [
        pytest.param(debian(), "no-such-server", "/usr/bin", id="not_on_path"),
        pytest.param(debian().file("/srv/s", b"#!/opt/gone/python\n"), "/srv/s", "/usr/bin", id="missing_interpreter"),
        pytest.param(
            debian().file("/srv/s", b"#!/usr/bin/env nothere\n"), "/srv/s", "/usr/bin", id="env_program_not_on_path"
        ),
        pytest.param(debian().file("/srv/s", b"x", executable=False), "/srv/s", "/usr/bin", id="not_executable"),
        pytest.param(
            debian().link("/srv/a", "/srv/b").link("/srv/b", "/srv/a").file("/srv/a/s"),
            "/srv/a/s",
            "",
            id="symlink_loop",
        ),
    ],
)
def test_a_command_that_cannot_be_resolved_is_refused_before_anything_starts(
    fs: FakeFs, command: str, path_var: str
) -> None:
    with pytest.raises(SandboxError) as caught:
        resolve_command(fs, command, [], {"PATH": path_var}, "/", server="s")
    assert caught.value.cause == "unresolvable"
    assert caught.value.server == "s"


def test_interpreters_nest_at_most_four_deep() -> None:
    fs = debian()
    for i in range(6):
        fs.file(f"/srv/s{i}", f"#!/srv/s{i + 1}\n".encode())
    with pytest.raises(SandboxError):
        resolve_command(fs, "/srv/s0", [], {}, "/")


def test_the_system_layout_recreates_merged_usr_links_and_adds_resolv_and_certificates_only_with_network() -> None:
    fs = debian()
    offline = system_layout(fs, network=False)
    online = system_layout(fs, network=True)
    assert ("/bin", "usr/bin") in offline.symlinks and "/usr" in offline.dirs
    assert "/etc/resolv.conf" not in offline.etc and "/etc/ssl/certs" not in offline.etc
    assert {"/etc/resolv.conf", "/etc/ssl/certs"} <= set(online.etc)
    assert "/etc/ld.so.cache" in offline.etc and "/etc/passwd" in offline.etc
    assert not any(p.startswith("/etc/ssl/private") for p in online.etc)


def test_a_venv_made_with_bin_python3_on_merged_usr_binds_its_real_base_not_the_root() -> None:
    # python3 -m venv run as /bin/python3 writes home = /bin; /bin links to usr/bin, whose prefix is /usr.
    fs = debian().link("/srv/venv/bin/python3", "/usr/bin/python3.11")
    fs.file("/srv/venv/pyvenv.cfg", b"home = /bin\nversion = 3.11.2\n", executable=False)
    found = resolve_command(fs, "/srv/venv/bin/python3", ["-m", "server"], {}, "/")
    assert "/" not in [b.path for b in found.binds]
    assert [b.path for b in found.binds] == ["/srv/venv"]


@pytest.mark.parametrize(
    ("fs", "command", "env"),
    [
        # A confined server that can write its own venv rewrites pyvenv.cfg for its next start
        # (on a system without merged /usr, /lib is a directory: the root looks like a prefix).
        pytest.param(
            _unmerged().file("/srv/venv/bin/python3").file("/srv/venv/pyvenv.cfg", b"home = /\n", executable=False),
            "/srv/venv/bin/python3",
            {},
            id="pyvenv_home_at_the_root",
        ),
        pytest.param(
            debian()
            .file("/srv/venv/bin/python3")
            .file("/srv/venv/pyvenv.cfg", b"home = /proc/1/root/bin\n")
            .dir("/proc/1/root/lib"),
            "/srv/venv/bin/python3",
            {},
            id="pyvenv_home_in_host_proc",
        ),
        pytest.param(
            debian().file("/usr/bin/npx"),
            "npx",
            {"PATH": "/usr/bin", "NPM_CONFIG_CACHE": "/"},
            id="npm_cache_at_the_root",
        ),
        pytest.param(
            debian().file("/usr/bin/uvx").dir("/proc/self"),
            "uvx",
            {"PATH": "/usr/bin", "UV_CACHE_DIR": "/proc/self"},
            id="uv_cache_in_host_proc",
        ),
    ],
)
def test_a_resolved_path_that_would_bind_the_root_or_a_kernel_file_system_is_refused(
    fs: FakeFs, command: str, env: dict[str, str]
) -> None:
    # The profile's read/write refuse /, /proc, /sys and /dev; what the command needs may not bind them either.
    with pytest.raises(SandboxError) as caught:
        resolve_command(fs, command, ["x"], env, "/", server="s")
    assert caught.value.cause == "unresolvable"
    assert caught.value.server == "s"


def test_a_pyvenv_home_that_is_no_python_prefix_binds_nothing_of_it() -> None:
    # A confined server that can write its own venv names ~/.ssh/bin as home for its next start.
    fs = debian().file("/srv/venv/bin/python3").dir("/home/u/.ssh")
    fs.file("/home/u/.ssh/id_ed25519", b"key", executable=False)
    fs.file("/srv/venv/pyvenv.cfg", b"home = /home/u/.ssh/bin\n", executable=False)
    found = resolve_command(fs, "/srv/venv/bin/python3", ["-m", "server"], {}, "/")
    assert not [b.path for b in found.binds if b.path.startswith("/home")]
