"""``${params.X}``, ``${env.X}`` and ``${steps.N...}``: checked at load, substituted at run time.

References are allowed only in ``contract.intent``, step ``arguments`` and ``agent.final``; at
load (``check_templates``) every reference must be in such a place, well formed, name a declared
param or a valid variable name, and a step reference must point at an earlier step. Substitution
happens at run time (``render_intent``, ``render_arguments``): the effective contract keeps the
templates, so environment values are never hashed into it. ``${steps.N...}`` references are left
for the scripted provider. Pure: the environment is a mapping passed in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from truss._errors import InputError
from truss.contract.fields import ENV_NAME_RE
from truss.contract.layers import Layer, error_in, short
from truss.contract.locating import KeyPath, format_path
from truss.contract.models import Contract, ParamSpec
from truss.ledger.canonical import canonical

__all__ = ["check_templates", "env_refs", "render_arguments", "render_intent", "template_refs"]

_REF_RE = re.compile(r"\$\{([^{}]*)\}")
_STEP_REF_RE = re.compile(r"^steps\.(\d+)\.(result(/.*)?|is_error)\Z")


def _template_scope(path: KeyPath) -> frozenset[str] | None:
    """Which references a string at ``path`` may hold; None where no substitution is done."""
    if path == ("contract", "intent"):
        return frozenset({"params", "env"})
    if len(path) >= 4 and path[:2] == ("agent", "steps") and path[3] == "arguments":
        return frozenset({"params", "env", "steps"})
    if path == ("agent", "final"):  # the scripted provider's closing answer, written after every step
        return frozenset({"params", "env", "steps"})
    return None


def check_templates(layers: list[Layer], effective: dict[str, Any], params: Mapping[str, ParamSpec]) -> None:
    """Every ``${...}`` in the effective data is where substitution is done, well formed, and refers to something."""

    def walk(value: Any, path: KeyPath) -> None:
        if isinstance(value, dict):
            for key, item in cast(dict[str, Any], value).items():
                if "${" in key:
                    raise error_in(
                        layers,
                        effective,
                        (*path, key),
                        "a key may not hold a ${...} reference",
                        remedy="References are substituted only into values of contract.intent and step arguments",
                    )
                walk(item, (*path, key))
        elif isinstance(value, list):
            for i, item in enumerate(cast(list[Any], value)):
                walk(item, (*path, i))
        elif isinstance(value, str) and "$" in value:
            _check_string(value, path)

    def _check_string(text: str, path: KeyPath) -> None:
        if "${" not in text:
            return
        scope = _template_scope(path)
        if scope is None:
            raise error_in(
                layers,
                effective,
                path,
                "this value holds a ${...} reference, but substitution is not done here",
                remedy="${params.X} and ${env.X} work only in contract.intent and step arguments; commands, args, "
                "urls, env, headers, policy and checks are taken literally (use secret_env for secrets)",
            )
        if text.count("${") != len(_REF_RE.findall(text)):
            raise error_in(
                layers,
                effective,
                path,
                f"unterminated or nested ${{ in {short(text)}",
                remedy="Write references as ${params.NAME}, ${env.NAME} or ${steps.N.result}",
            )
        for match in _REF_RE.finditer(text):
            _check_ref(match.group(1), scope, path)

    def _check_ref(ref: str, scope: frozenset[str], path: KeyPath) -> None:
        head, _, rest = ref.partition(".")
        if head not in scope:
            allowed = ", ".join(f"${{{s}.…}}" for s in sorted(scope))
            raise error_in(
                layers,
                effective,
                path,
                f"${{{ref}}} is not a reference Truss knows here",
                remedy=f"Use {allowed}",
            )
        if head == "params":
            if rest not in params:
                declared = ", ".join(sorted(params)) or "none"
                raise error_in(
                    layers,
                    effective,
                    path,
                    f"${{{ref}}} refers to param {rest!r}, which [contract.params] does not declare",
                    remedy=f"Declare it under [contract.params] or fix the name (declared: {declared})",
                )
        elif head == "env":
            if not ENV_NAME_RE.match(rest):
                raise error_in(
                    layers,
                    effective,
                    path,
                    f"${{{ref}}}: {rest!r} is not an environment variable name",
                    remedy="Use letters, digits and '_', not starting with a digit",
                )
        else:
            found = _STEP_REF_RE.match(ref)
            steps: Any = effective.get("agent", {}).get("steps", [])
            planned = len(cast(list[Any], steps)) if isinstance(steps, list) else 0
            step = path[2] if path[:2] == ("agent", "steps") else planned
            if not found:
                raise error_in(
                    layers,
                    effective,
                    path,
                    f"${{{ref}}} is not a step reference",
                    remedy="Write ${steps.N.result}, ${steps.N.result/json/pointer} or ${steps.N.is_error}",
                )
            if isinstance(step, int) and int(found.group(1)) >= step:
                raise error_in(
                    layers,
                    effective,
                    path,
                    f"${{{ref}}} in {format_path(path[:3])} refers to a step that has not run by then",
                    remedy="A step may refer only to earlier steps (lower numbers, counting from 0)",
                )

    walk(effective, ())


def template_refs(text: str) -> list[str]:
    """The references (``params.x``, ``env.Y``, ``steps.0.result``) in a template string, in order."""
    return [m.group(1) for m in _REF_RE.finditer(text)]


def env_refs(contract: Contract) -> list[str]:
    """The environment variables the contract's templates use, each once, in order."""
    names: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in cast(dict[str, Any], value).values():
                walk(item)
        elif isinstance(value, list):
            for item in cast(list[Any], value):
                walk(item)
        elif isinstance(value, str):
            names.extend(r[4:] for r in template_refs(value) if r.startswith("env."))

    walk(contract.contract.intent)
    walk(contract.agent.final)
    for step in contract.agent.steps:
        walk(step.arguments)
    return list(dict.fromkeys(names))


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else canonical(value).decode()


def _render(text: str, params: Mapping[str, Any], environ: Mapping[str, str], *, where: str) -> Any:
    def lookup(ref: str) -> Any:
        head, _, name = ref.partition(".")
        if head == "params":
            if name not in params:
                raise InputError(
                    f"{where}: ${{{ref}}} has no value",
                    remedy=f"Pass --param {name}=VALUE or give the param a default",
                    param=name,
                )
            return params[name]
        if head == "env":
            if name not in environ:
                raise InputError(
                    f"{where}: environment variable {name} is not set",
                    remedy=f"Set {name} in the environment that runs Truss",
                    env=name,
                )
            return environ[name]
        return None  # steps: left for the scripted provider

    whole = _REF_RE.fullmatch(text)
    if whole is not None:
        value = lookup(whole.group(1))
        return text if value is None else value

    def replace(match: re.Match[str]) -> str:
        value = lookup(match.group(1))
        return match.group(0) if value is None else _text_of(value)

    return _REF_RE.sub(replace, text)


def render_intent(contract: Contract, environ: Mapping[str, str]) -> str:
    """``contract.intent`` with ``${params.X}`` and ``${env.X}`` filled in (an unset variable is an error)."""
    rendered = _render(contract.contract.intent, contract.param_values, environ, where="contract.intent")
    return rendered if isinstance(rendered, str) else _text_of(rendered)


def render_arguments(
    arguments: Mapping[str, Any], *, params: Mapping[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    """Step arguments with ``${params.X}``/``${env.X}`` filled in; ``${steps...}`` are left as they are.

    A string that is exactly one reference takes the referenced value with its JSON type; a
    reference inside longer text is written as text. Pure: nothing is read but the arguments.
    """

    def walk(value: Any, where: str) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, f"{where}.{k}") for k, v in cast(dict[str, Any], value).items()}
        if isinstance(value, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(cast(list[Any], value))]
        if isinstance(value, str) and "${" in value:
            return _render(value, params, environ, where=where)
        return value

    return {k: walk(v, f"arguments.{k}") for k, v in arguments.items()}
