"""The client under test in the MCP conformance suite's client mode: Truss, driven through its CLI only.

    conformance client --command "python conformance/client.py" --scenario tools_call
    python conformance/run.py --mode client --requirements 2026-07-28      # what CI runs

The suite starts a mock server for a scenario and runs this with the server's URL as the last
argument, the scenario's name in ``MCP_CONFORMANCE_SCENARIO``, its context (JSON) in
``MCP_CONFORMANCE_CONTEXT`` and the protocol revision it runs at in
``MCP_CONFORMANCE_PROTOCOL_VERSION``. For each scenario it knows (``HANDLERS``, a table from
scenario name to handler) it writes a contract for the scenario and runs ``truss run``, or runs
``truss mcp probe`` where the scenario only checks what a client sends while it connects and lists
tools. Afterwards it reads what Truss recorded (``truss ledger show``) and checks the parts the
suite cannot see: that Truss spoke the scenario's protocol era, that elicitations were answered by
the contract's policy and recorded, that tools with invalid ``x-mcp-header`` annotations were
refused. Nothing here speaks MCP itself and nothing imports Truss: what passes is Truss.

Exit codes: Truss's own (0: the run passed, 1 its verdict failed, 4 it could not run ...), 2 for
an unknown scenario or unusable environment (it fails loudly: a scenario without a handler is never
silently passed), 4 also when a Truss command did not finish within two minutes, 5 when Truss ran
but did something the scenario forbids or did not record what it should have.

Environment, besides the suite's: ``TRUSS_HOME``, the Truss home to run in (``truss init`` is run
on it; default: a temporary home, removed afterwards); ``TRUSS_CONFORMANCE_LOCK``, a file this
holds an exclusive lock on while Truss runs. The suite starts every scenario's client at once;
``conformance/run.py`` sets the lock so that Truss runs one scenario at a time, which keeps timing
checks (the SSE retry delay is measured to within 200 ms) from measuring the machine's load. The
``auth/*`` scenarios time nothing: they run beside the timed ones, four at a time (``LOCK.auth0``
to ``LOCK.auth3``), sharing the home, which is how concurrent logins in one home are exercised.

The ``auth/*`` scenarios: the contract's server gets an ``[mcp.servers.oauth]`` table. For the
authorization code grant the handler runs ``truss mcp login`` once, with ``BROWSER`` set to this
script's ``--browse`` mode (a person who approves: it opens the authorization URL and follows the
redirects to Truss's loopback listener), then ``truss run`` unattended. A run that stops for a
scope step-up (exit 5, "log in again") is followed by one more login, which asks for the union of
the scopes, and one more run. The client credentials scenarios need no login at all.

Adding a scenario: write a handler taking a ``Scenario`` and returning an exit code, and add it to
``HANDLERS`` under the scenario's name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

UNKNOWN = 2
HUNG = 4
MISBEHAVED = 5
SERVER = "conformance"
HANDSHAKE_ERA = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
_TRUSS_TIMEOUT_S = 120


@dataclass(frozen=True)
class Scenario:
    """One scenario as the suite gave it, and where Truss runs for it."""

    name: str
    url: str
    context: dict[str, Any]
    protocol: str
    home: Path
    work: Path

    def truss(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``truss --home HOME --json ARGS`` and echo what it printed (the suite keeps both streams)."""
        command = [sys.executable, "-m", "truss", "--home", str(self.home), "--json", *args]
        environ = {**os.environ, **(env or {})}
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_TRUSS_TIMEOUT_S, check=False, env=environ
        )
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        return done

    def write(self, contract: dict[str, Any]) -> Path:
        path = self.work / "contract.toml"
        path.write_text(tomli_w.dumps(contract), encoding="utf-8")
        return path

    def run(self, contract: dict[str, Any], env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
        """``truss run`` the contract; its exit code and the session's entries (empty when none was recorded)."""
        path = self.write(contract)
        done = self.truss("run", str(path), env=env)
        try:
            session = json.loads(done.stdout)["session"]
        except (ValueError, KeyError, TypeError):
            return done.returncode, []
        shown = subprocess.run(
            [sys.executable, "-m", "truss", "--home", str(self.home), "--json", "ledger", "show", str(session)],
            capture_output=True, text=True, timeout=_TRUSS_TIMEOUT_S, check=False,
        )  # fmt: skip
        entries: list[dict[str, Any]] = json.loads(shown.stdout)["entries"] if shown.returncode == 0 else []
        return done.returncode, entries


def fail(code: int, message: str) -> int:
    sys.stderr.write(f"conformance/client.py: {message}\n")
    return code


# -- contracts ----------------------------------------------------------------------------------


def contract_for(
    scenario: Scenario,
    steps: list[tuple[str, dict[str, Any]]],
    checks: list[dict[str, Any]],
    *,
    allow: list[str] | None = None,
    elicitation: dict[str, Any] | None = None,
    oauth: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A contract calling ``steps`` (tool, arguments) on the scenario's server, judged by ``checks``."""
    for _, arguments in steps:
        for value in arguments.values():
            if isinstance(value, str) and "${" in value:
                raise SystemExit(fail(UNKNOWN, f"an argument holds '${{', which a contract substitutes: {value!r}"))
    server: dict[str, Any] = {
        "name": SERVER,
        "transport": "http",
        "url": scenario.url,
        "allow_tools": allow or sorted({tool for tool, _ in steps}),
        "connect_timeout": "60s",
    }
    if elicitation is not None:
        server["elicitation"] = elicitation
    if oauth is not None:
        server["oauth"] = oauth
    name = "conformance-" + scenario.name.replace("/", "-").replace("_", "-")
    return {
        "contract": {"name": name, "intent": f"The MCP conformance scenario {scenario.name}."},
        "agent": {
            "provider": "scripted",
            "steps": [{"tool": f"mcp:{SERVER}:{tool}", "arguments": arguments} for tool, arguments in steps],
        },
        "budget": {"deadline": "2m", "call_timeout": "30s"},
        "mcp": {"servers": [server]},
        "done": {"checks": checks},
    }


def succeeded(tool: str) -> dict[str, Any]:
    return {"kind": "tool_succeeded", "tool": f"mcp:{SERVER}:{tool}"}


def result_matches(tool: str, regex: str) -> dict[str, Any]:
    return {"kind": "result_matches", "tool": f"mcp:{SERVER}:{tool}", "pointer": "", "regex": regex}


# -- what Truss recorded ------------------------------------------------------------------------


def of_kind(entries: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["entry"]["body"] for e in entries if e["kind"] == kind]


def check_era(scenario: Scenario, negotiated: str | None) -> int:
    """0 when Truss spoke the scenario's protocol era (the 2025 handshake, or 2026-07-28 stateless)."""
    wanted_modern = scenario.protocol not in HANDSHAKE_ERA
    if negotiated is None or (negotiated not in HANDSHAKE_ERA) != wanted_modern:
        return fail(MISBEHAVED, f"the scenario runs at {scenario.protocol}, but Truss negotiated {negotiated}")
    return 0


def recorded_era(scenario: Scenario, entries: list[dict[str, Any]]) -> int:
    started = of_kind(entries, "session_started")
    if not started:
        return fail(MISBEHAVED, "Truss recorded no session")
    return check_era(scenario, started[0].get("servers", {}).get(SERVER, {}).get("protocol_version"))


def recorded_elicitations(entries: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
    calls = [b for b in of_kind(entries, "mcp_tool_call") if b.get("tool") == f"mcp:{SERVER}:{tool}"]
    return [e for b in calls for e in b.get("elicitations", [])]


def finish(scenario: Scenario, code: int, entries: list[dict[str, Any]], *checks: Callable[[], int]) -> int:
    """Truss's exit code, unless the era or one of ``checks`` (each 0 or an exit code) says otherwise."""
    if code != 0:
        return code
    for check in (lambda: recorded_era(scenario, entries), *checks):
        problem = check()
        if problem:
            return problem
    return 0


# -- handlers -------------------------------------------------------------------------------------


def connect_only(scenario: Scenario) -> int:
    """``truss mcp probe``: connect, list every tool, one round trip. For scenarios about connecting."""
    done = scenario.truss("mcp", "probe", "--url", scenario.url)
    if done.returncode != 0:
        return done.returncode
    try:
        negotiated = json.loads(done.stdout).get("protocol_version")
    except ValueError:
        return fail(MISBEHAVED, "truss mcp probe --json printed no JSON")
    return check_era(scenario, negotiated)


def tools_call(scenario: Scenario) -> int:
    contract = contract_for(scenario, [("add_numbers", {"a": 2, "b": 3})], [result_matches("add_numbers", r"\b5$")])
    return finish(scenario, *scenario.run(contract))


def sse_retry(scenario: Scenario) -> int:
    """The server closes the call's SSE stream after a priming event; the answer comes on the resumed stream."""
    tool = "test_reconnection"
    contract = contract_for(scenario, [(tool, {})], [result_matches(tool, "completed successfully")])
    return finish(scenario, *scenario.run(contract))


def standard_headers(scenario: Scenario) -> int:
    """Both advertised tools are called, so Mcp-Method and Mcp-Name are seen on tools/call too."""
    tools = ["test_headers", "my-hyphenated-tool"]
    contract = contract_for(scenario, [(t, {}) for t in tools], [succeeded(t) for t in tools])
    return finish(scenario, *scenario.run(contract))


def custom_headers(scenario: Scenario) -> int:
    """The calls the scenario's context asks for, whose x-mcp-header arguments Truss mirrors into headers.

    TOML has no null: an argument the context gives as null is left out, which the scenario's check
    ("omit the header when the value is null or not provided") covers the same way.
    """
    calls: list[tuple[str, dict[str, Any]]] = []
    for call in scenario.context.get("toolCalls", []):
        arguments = {k: v for k, v in call.get("arguments", {}).items() if v is not None}
        calls.append((call["name"], arguments))
    if not calls:
        return fail(UNKNOWN, "the scenario's context names no tool calls")
    contract = contract_for(scenario, calls, [succeeded(name) for name, _ in calls])
    return finish(scenario, *scenario.run(contract))


def invalid_tool_headers(scenario: Scenario) -> int:
    """Every tool the server advertises is allowlisted and the plan calls each. The scenario's only valid
    tool is ``valid_tool``; Truss must mount it alone and refuse the others at the gate
    (``not_mounted``: it dropped them for their invalid ``x-mcp-header``), so none reaches the server."""
    probe = scenario.truss("mcp", "probe", "--url", scenario.url)
    try:
        advertised = [str(t["name"]) for t in json.loads(probe.stdout)["tools"]]
    except (ValueError, KeyError, TypeError):
        return fail(MISBEHAVED, "truss mcp probe --json did not list the server's tools")
    invalid = [name for name in advertised if name != "valid_tool"]
    steps: list[tuple[str, dict[str, Any]]] = [("valid_tool", {"region": "us-west1"})]
    steps += [(name, {}) for name in invalid]
    contract = contract_for(scenario, steps, [succeeded("valid_tool")], allow=["*"])
    code, entries = scenario.run(contract)

    def refused_each() -> int:
        denied = {b.get("tool") for b in of_kind(entries, "mcp_tool_denied") if b.get("code") == "not_mounted"}
        missing = [t for t in invalid if f"mcp:{SERVER}:{t}" not in denied]
        if not invalid or missing:
            return fail(MISBEHAVED, f"Truss did not refuse {', '.join(missing) or 'the invalid tools'} as not mounted")
        return 0

    return finish(scenario, code, entries, refused_each)


def elicitation_defaults(scenario: Scenario) -> int:
    """The server elicits a form whose fields all have defaults; the contract accepts, so Truss answers
    with the schema's defaults (SEP-1034) and records the request and the content."""
    tool = "test_client_elicitation_defaults"
    contract = contract_for(scenario, [(tool, {})], [result_matches(tool, "^Elicitation completed")],
                            elicitation={"action": "accept"})  # fmt: skip
    code, entries = scenario.run(contract)

    def accepted_and_recorded() -> int:
        answers = recorded_elicitations(entries, tool)
        if not answers or any(a.get("action") != "accept" or not a.get("content") for a in answers):
            return fail(MISBEHAVED, f"the elicitation was not recorded as accepted with content: {answers}")
        return 0

    return finish(scenario, code, entries, accepted_and_recorded)


def request_state(scenario: Scenario) -> int:
    """SEP-2322: tools that answer ``input_required`` (with and without requestState), one that does not,
    and one whose result has no resultType. The contract accepts the confirmation the server asks for."""
    tools = ["test_mrtr_echo_state", "test_mrtr_unrelated", "test_mrtr_no_state", "test_mrtr_no_result_type"]
    contract = contract_for(scenario, [(t, {}) for t in tools], [succeeded(t) for t in tools],
                            elicitation={"action": "accept", "content": {"confirmed": True}})  # fmt: skip
    code, entries = scenario.run(contract)

    def answered_both() -> int:
        for tool in ("test_mrtr_echo_state", "test_mrtr_no_state"):
            answers = recorded_elicitations(entries, tool)
            if [a.get("action") for a in answers] != ["accept"]:
                return fail(MISBEHAVED, f"{tool}: expected one accepted elicitation on record, found {answers}")
        return 0

    return finish(scenario, code, entries, answered_both)


# -- auth/* -------------------------------------------------------------------------------------

LOGIN_REQUIRED = 5  # Truss's exit code when an OAuth server needs `truss mcp login` first
CIMD_URL = "https://conformance-test.local/client-metadata.json"  # the suite's client metadata document
SECRET_ENV = "CONFORMANCE_CLIENT_SECRET"  # noqa: S105 - the variable's name


def browse(url: str) -> int:
    """``--browse URL`` (BROWSER for ``truss mcp login``): approve, and follow redirects to the loopback."""
    import urllib.error
    import urllib.request
    from urllib.parse import urljoin

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    for _ in range(10):
        try:
            with opener.open(url, timeout=30) as response:
                response.read()
                return 0
        except urllib.error.HTTPError as exc:
            if exc.code not in (301, 302, 303, 307, 308) or not exc.headers.get("Location"):
                return fail(MISBEHAVED, f"the authorization URL answered {exc.code}")
            url = urljoin(url, exc.headers["Location"])
        except OSError as exc:  # the redirect may name a host the suite never serves: the login reports it
            return fail(MISBEHAVED, f"could not open {url}: {exc}")
    return fail(MISBEHAVED, "too many redirects")


def _browser_env() -> dict[str, str]:
    return {"BROWSER": f"{sys.executable} {Path(__file__).resolve()} --browse %s"}


def auth_code(scenario: Scenario) -> int:
    """``truss mcp login`` once (a person approving in a browser), then an unattended ``truss run``."""
    oauth: dict[str, Any] = {"grant": "authorization_code"}
    env = _browser_env()
    if "client_id" in scenario.context:  # pre-registration: the suite's client and secret
        oauth["client_id"] = str(scenario.context["client_id"])
        if scenario.context.get("client_secret"):
            oauth["client_secret_env"] = SECRET_ENV
            env[SECRET_ENV] = str(scenario.context["client_secret"])
    else:
        oauth["client_metadata_url"] = CIMD_URL  # used only where the server offers CIMD; else DCR
    contract = contract_for(scenario, [("test-tool", {})], [succeeded("test-tool")], oauth=oauth)
    path = scenario.write(contract)
    code, entries = 0, []
    for _ in range(3):  # a login, and one more for each step-up the run stops at (bounded)
        login = scenario.truss("mcp", "login", SERVER, "--contract", str(path), "--timeout", "60s", env=env)
        if login.returncode != 0:
            return login.returncode
        code, entries = scenario.run(contract, env=env)
        if code != LOGIN_REQUIRED:
            break
    return finish(scenario, code, entries)


def client_credentials(scenario: Scenario) -> int:
    """A headless grant: ``truss run`` alone, no login."""
    context = scenario.context
    oauth: dict[str, Any] = {"client_id": str(context.get("client_id", ""))}
    env: dict[str, str] = {}
    if "private_key_pem" in context:
        key = scenario.work / "client.key"
        key.write_text(str(context["private_key_pem"]), encoding="utf-8")
        key.chmod(0o600)
        oauth.update(grant="private_key_jwt", private_key_file=str(key),
                     key_algorithm=str(context.get("signing_algorithm") or "RS256"))  # fmt: skip
    else:
        oauth.update(grant="client_credentials", client_secret_env=SECRET_ENV)
        env[SECRET_ENV] = str(context.get("client_secret", ""))
    if context.get("issuer"):
        oauth["issuer"] = str(context["issuer"])
    contract = contract_for(scenario, [("test-tool", {})], [succeeded("test-tool")], oauth=oauth)
    return finish(scenario, *scenario.run(contract, env=env))


_AUTH_CODE_SCENARIOS = (
    "metadata-default", "metadata-var1", "metadata-var2", "metadata-var3", "basic-cimd",
    "scope-from-www-authenticate", "scope-from-scopes-supported", "scope-omitted-when-undefined",
    "scope-step-up", "scope-retry-limit", "token-endpoint-auth-basic", "token-endpoint-auth-post",
    "token-endpoint-auth-none", "pre-registration", "2025-03-26-oauth-metadata-backcompat",
    "2025-03-26-oauth-endpoint-fallback", "resource-mismatch", "offline-access-scope",
    "offline-access-not-supported", "authorization-server-migration", "iss-supported", "iss-not-advertised",
    "iss-supported-missing", "iss-wrong-issuer", "iss-unexpected", "iss-normalized", "metadata-issuer-mismatch",
)  # fmt: skip


HANDLERS: dict[str, Callable[[Scenario], int]] = {
    # 2025-11-25
    "initialize": connect_only,
    "tools_call": tools_call,
    "elicitation-sep1034-client-defaults": elicitation_defaults,
    "sse-retry": sse_retry,
    # 2026-07-28
    "request-metadata": connect_only,
    "sep-2322-client-request-state": request_state,
    "http-standard-headers": standard_headers,
    "http-custom-headers": custom_headers,
    "http-invalid-tool-headers": invalid_tool_headers,
    "json-schema-ref-no-deref": connect_only,
    # OAuth (both eras)
    **{f"auth/{name}": auth_code for name in _AUTH_CODE_SCENARIOS},
    "auth/client-credentials-basic": client_credentials,
    "auth/client-credentials-jwt": client_credentials,
}


# -- main ---------------------------------------------------------------------------------------


AUTH_SLOTS = 4


@contextlib.contextmanager
def _auth_slot(lock: str, name: str) -> Iterator[None]:
    """Hold one of AUTH_SLOTS locks: the first free one, else wait for the one ``name`` hashes to."""
    handles = [open(f"{lock}.auth{i}", "a") for i in range(AUTH_SLOTS)]  # noqa: SIM115 - closed below
    try:
        held = None
        for handle in handles:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            held = handle
            break
        if held is None:
            held = handles[zlib.crc32(name.encode()) % AUTH_SLOTS]
            fcntl.flock(held, fcntl.LOCK_EX)
        yield
    finally:
        for handle in handles:
            handle.close()  # closing releases the lock held on it


@contextlib.contextmanager
def one_at_a_time(name: str) -> Iterator[None]:
    lock = os.environ.get("TRUSS_CONFORMANCE_LOCK")
    if not lock:
        yield
        return
    if name.startswith("auth/"):
        # The auth scenarios time nothing, and each runs Truss three or four times: they run beside
        # the timed ones, so those queued on the lock are not held up past the suite's client
        # timeout, but at most AUTH_SLOTS at once (thirty logins starting together on a loaded
        # two-core machine ran past Truss's own command timeout).
        with _auth_slot(lock, name):
            yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--browse":
        return browse(argv[2])
    name = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    if len(argv) < 2 or not name:
        return fail(UNKNOWN, "usage: MCP_CONFORMANCE_SCENARIO=NAME client.py [ARG...] URL (the suite sets both)")
    handler = HANDLERS.get(name)
    if handler is None:
        return fail(UNKNOWN, f"unknown scenario {name!r}: no handler; known: {', '.join(sorted(HANDLERS))}")
    try:
        context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    except ValueError:
        return fail(UNKNOWN, "MCP_CONFORMANCE_CONTEXT is not JSON")
    protocol = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION") or "2025-11-25"
    work = Path(tempfile.mkdtemp(prefix="truss-conformance-client-"))
    given = os.environ.get("TRUSS_HOME")
    home = Path(given) if given else work / "home"
    try:
        scenario = Scenario(name, argv[-1], context if isinstance(context, dict) else {}, protocol, home, work)
        with one_at_a_time(name):
            init = scenario.truss("init")
            if init.returncode != 0:
                return fail(UNKNOWN, f"truss init failed in {home}")
            return handler(scenario)
    except subprocess.TimeoutExpired as exc:
        return fail(HUNG, f"truss did not finish within {exc.timeout:.0f} s: {' '.join(map(str, exc.cmd[3:]))}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
