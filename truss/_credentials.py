"""Whether a URL or a command line carries a credential: Truss's one rule, in one place.

Every URL or command line an operator writes that Truss keeps somewhere a secret must never be
(the recorded and exported contract, a config file, shell history, an error message) is checked
here: a server's ``url`` and stdio ``args``, the telemetry endpoints, ``[harness] db``, a
``postgresql://`` ledger URL (``--db``, ``TRUSS_DB``), ``truss mcp import``; ``redact_url`` shows a
URL in a message by the same rule. The rule (docs/security.md, "Credentials in URLs and
arguments"):

1. **User info.** In an ``http://`` or ``https://`` URL any user info is a credential: RFC 9110
   (4.2.4) forbids generating it, so what is there is Basic authentication or a token written as
   a user name (``https://TOKEN@host``). In any other scheme the user name is a login name
   (``postgresql://app@host/db``, ``ssh://git@host/repo``) and only a password is a credential.
2. **Query and fragment parameters** with a non-empty value whose name, percent-decoded and
   case-insensitive, is a credential name: see ``CREDENTIAL_PARAM_RE`` (exactly ``key``,
   ``auth``, ``sig``, ``code``, ``pass`` or ``pwd``; or containing ``token``, ``secret``,
   ``password``/``passwd``, ``api-key``/``api_key``/``apikey``, ``access-key``, ``private-key``,
   ``subscription-key``, ``credential``, ``signature``, ``authorization`` or ``cookie``). The
   fragment counts because OAuth's implicit flow puts ``#access_token=`` there.
3. **A URL that cannot be parsed** is taken as holding a credential: what it holds is not known.
   So is one whose user info parsers would read differently (a ``?`` or ``#`` before the ``@``).
4. **In a command line**, besides every URL inside an argument: an option whose name ends in a
   credential word, with its value (``--api-key=V``, ``password=V``, ``--password V``; the words
   are ``password``, ``passwd``, ``pwd``, ``pass``, ``secret``, ``token``, ``api-key``,
   ``access-key`` and ``private-key``, with ``-`` or ``_``). ``--token-file PATH`` is no credential.

The findings name the part (``the query parameter 'token'``), never the value. What this module
does not do: decide what happens then (refuse, rewrite or redact is the caller's), or guess secrets
from a value's shape (``truss.mcp._claude_import`` does that for imported env values). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "CREDENTIAL_PARAM_RE",
    "UNPARSABLE_URL",
    "ArgCredential",
    "credentials_in_args",
    "display_url",
    "is_credential_param",
    "redact_url",
    "url_credentials",
    "url_password",
    "url_without_credentials",
]

CREDENTIAL_PARAM_RE = re.compile(
    r"(?i)^(?:key|auth|sig|code|pass|pwd)\Z"
    r"|token|secret|passw(?:or)?d|api[-_]?key|access[-_]?key|private[-_]?key|subscription[-_]?key"
    r"|credential|signature|authorization|cookie"
)
"""Query (and fragment) parameter names whose values are credentials (rule 2 of the module docstring)."""

_MASK = "***"
_HTTP = ("http", "https")
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")
_CREDENTIAL_WORD = r"(?:password|passwd|pwd|pass|secret|token|api[-_]?key|access[-_]?key|private[-_]?key)"
_CREDENTIAL_OPTION_RE = re.compile(rf"(?i)^(-{{0,2}}(?:[A-Za-z0-9]+[-_.])*{_CREDENTIAL_WORD})=(.+)\Z", re.DOTALL)
_CREDENTIAL_FLAG_RE = re.compile(rf"(?i)^--?(?:[A-Za-z0-9]+[-_.])*{_CREDENTIAL_WORD}\Z")
# The variable a URL's client library reads its password from, so that the password can leave the URL.
_PASSWORD_ENV = {"postgres": "PGPASSWORD", "postgresql": "PGPASSWORD", "mysql": "MYSQL_PWD", "mariadb": "MYSQL_PWD",
                 "redis": "REDISCLI_AUTH", "rediss": "REDISCLI_AUTH"}  # fmt: skip
UNPARSABLE_URL = "a URL that cannot be parsed (it may hide a credential)"


def is_credential_param(name: str) -> bool:
    """True when a query or fragment parameter called ``name`` carries a credential."""
    return CREDENTIAL_PARAM_RE.search(name) is not None


@dataclass(frozen=True)
class _Scan:
    parts: SplitResult
    user: str
    password: str | None  # the part after the first ":" of the user info; None without one
    userinfo_is_credential: bool
    query: list[tuple[str, str]]
    fragment: list[tuple[str, str]] | None  # None: the fragment is not parameters
    found: list[str]


def _params(text: str) -> list[tuple[str, str]]:
    return parse_qsl(text, keep_blank_values=True)


def _secret_names(params: list[tuple[str, str]]) -> list[str]:
    return list(dict.fromkeys(n for n, v in params if v and is_credential_param(n)))


def _scan(url: str) -> _Scan | None:
    """The credentials of ``url``; None when it cannot be parsed."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if "@" in url.partition("://")[2].partition("/")[0] and "@" not in parts.netloc:
        # libpq reads user info up to the first '/', urlsplit up to a '?' or '#' as well: a '?' in a
        # password would hide it from one of them. Unclear, so taken as a credential (rule 3).
        return None
    userinfo, at, _ = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    http = parts.scheme.lower() in _HTTP
    found: list[str] = []
    userinfo_is_credential = bool(at) and (http or bool(colon))
    if userinfo_is_credential:
        found.append("user info in an http(s) URL" if http else "a password in the user info")
    query = _params(parts.query)
    fragment = _params(parts.fragment) if "=" in parts.fragment else None
    found += [f"the query parameter {n!r}" for n in _secret_names(query)]
    found += [f"the fragment parameter {n!r}" for n in _secret_names(fragment or [])]
    return _Scan(parts, user, password if colon else None, userinfo_is_credential, query, fragment, found)


def url_credentials(url: str) -> list[str]:
    """What in ``url`` is a credential (``"a password in the user info"``, ``"the query parameter 'token'"``),
    never the value; empty when it holds none."""
    scan = _scan(url)
    return [UNPARSABLE_URL] if scan is None else scan.found


def url_password(url: str) -> str | None:
    """The password in ``url``'s user info, or None. For comparing two credentials in memory only
    (``truss mcp import`` refuses to fold two different ones into one variable): never shown."""
    scan = _scan(url)
    return None if scan is None else scan.password


def _rebuild(scan: _Scan, userinfo: str | None, query: list[tuple[str, str]], fragment: str) -> str:
    host = scan.parts.netloc.rpartition("@")[2]
    netloc = host if userinfo is None else f"{userinfo}@{host}"
    return urlunsplit(scan.parts._replace(netloc=netloc, query=urlencode(query, safe="*"), fragment=fragment))


def url_without_credentials(url: str) -> str | None:
    """``url`` with every credential taken out (an http(s) URL's user info, a password, credential
    parameters); ``url`` itself when it holds none; None when it cannot be parsed."""
    scan = _scan(url)
    if scan is None:
        return None
    if not scan.found:
        return url
    userinfo = scan.parts.netloc.rpartition("@")[0] if "@" in scan.parts.netloc else None
    if scan.userinfo_is_credential:
        # An http(s) URL loses all its user info; any other keeps its login name.
        userinfo = None if scan.parts.scheme.lower() in _HTTP or not scan.user else scan.user
    query = [(n, v) for n, v in scan.query if not (v and is_credential_param(n))]
    fragment = scan.parts.fragment
    if scan.fragment is not None:
        fragment = urlencode([(n, v) for n, v in scan.fragment if not (v and is_credential_param(n))])
    return _rebuild(scan, userinfo, query, fragment)


def redact_url(url: str) -> str:
    """``url`` as a message may show it: each credential (rule 1 and 2) replaced by ``***``; a
    ``scheme://`` text that cannot be parsed is shown as ``scheme://***``; a path is left alone."""
    match = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", url)
    if match is None:
        return url
    scan = _scan(url)
    if scan is None:
        return match.group(0) + _MASK
    if not scan.found:
        return url
    userinfo = scan.parts.netloc.rpartition("@")[0] if "@" in scan.parts.netloc else None
    if scan.userinfo_is_credential:
        userinfo = _MASK if scan.parts.scheme.lower() in _HTTP or not scan.user else f"{scan.user}:{_MASK}"

    def masked(params: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(n, _MASK if v and is_credential_param(n) else v) for n, v in params]

    fragment = scan.parts.fragment
    if scan.fragment is not None:
        fragment = urlencode(masked(scan.fragment), safe="*")
    return _rebuild(scan, userinfo, masked(scan.query), fragment)


def display_url(url: str) -> str:
    """``url`` as an error message shows it (an MCP server's, an OAuth challenge's, a model
    provider's): user info masked by ``redact_url``, the query and fragment left out whole (a
    token may sit in a parameter whose name no rule knows, and an error needs only where the
    request went), anything unprintable as ``?`` (the URL may come from a server's header)."""
    shown = redact_url(url)
    scheme, sep, rest = shown.partition("://")
    if sep:  # after the masking neither ``?`` nor ``#`` is left in user info, host or path
        shown = scheme + sep + re.split(r"[?#]", rest, maxsplit=1)[0]
    return "".join(c if c.isprintable() else "?" for c in shown)


@dataclass(frozen=True)
class ArgCredential:
    """A credential written in a command line: which arg, what it is (never the value), the arg as
    it could be written without it (None: drop it), and a variable its client reads it from."""

    index: int
    what: str
    without: str | None
    env: str | None = None
    password: str | None = field(default=None, repr=False, compare=False)  # in memory only, see url_password


def credentials_in_args(args: list[str]) -> list[ArgCredential]:
    """Credentials in a command line (rules 1-4 of the module docstring), one finding per arg
    (with ``without`` free of every credential in it) or per credential flag's value."""
    found: list[ArgCredential] = []
    skip_next = False
    for index, arg in enumerate(args):
        if skip_next:
            skip_next = False
            continue
        problem = _credential_in_arg(index, arg)
        if problem is not None:
            found.append(problem)
        elif _CREDENTIAL_FLAG_RE.match(arg) and index + 1 < len(args) and not args[index + 1].startswith("-"):
            found.append(ArgCredential(index + 1, f"the value of {arg}", None))
            skip_next = True
    return found


def _credential_in_arg(index: int, arg: str) -> ArgCredential | None:
    """The first credential in ``arg``, with ``without`` free of every one of them: the rewrite is
    shown in the error and written by ``mcp import``, so it may not keep a second credential. A
    variable (``env``) is named only when a URL's password is the arg's one credential: with a
    second one beside it, moving the password alone would silently lose the other."""
    problems: list[str] = []
    password: str | None = None
    env: str | None = None
    rest = arg
    for match in list(_URL_RE.finditer(arg)):
        url = match.group(0)
        found = url_credentials(url)
        if not found:
            continue
        if not problems:
            password = url_password(url)
            env = _PASSWORD_ENV.get(url.partition(":")[0].lower()) if password else None
        problems += found
        clean = url_without_credentials(url)
        rest = rest.replace(url, clean) if clean is not None else ""
    kept: list[str] = []
    for token in rest.split(" "):
        option = _CREDENTIAL_OPTION_RE.match(token)
        if option is None:
            kept.append(token)
        else:
            problems.append(f"the value of {option.group(1)}")
    if not problems:
        return None
    without = " ".join(kept).strip() or None
    alone = problems == ["a password in the user info"] and without is not None
    return ArgCredential(index, "; ".join(problems), without, env if alone else None, password)
