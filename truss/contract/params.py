"""What callers fill in: param values (typed from ``--param k=v`` or given by serve-mcp) and narrowed budgets.

``parse_param_args`` types command-line values by each param's declared type; ``param_values``
checks every value against its spec and fills in defaults (the loader records the result as
``param_values``); ``narrow_budget`` lowers ``[budget]`` limits for a serve-mcp caller, who may
never raise one. Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from truss._clock import parse_duration_ms
from truss._errors import InputError, UsageError
from truss.contract.layers import Layer
from truss.contract.models import Budget, Contract, ParamSpec
from truss.ledger.canonical import number_problem

__all__ = ["ParamValue", "narrow_budget", "param_values", "parse_param_args"]

ParamValue = str | int | float | bool


def parse_param_args(args: Sequence[str], specs: Mapping[str, ParamSpec]) -> dict[str, ParamValue]:
    """``["k=v", ...]`` from the command line -> typed values by each param's declared type.

    Unknown names, a missing ``=``, a name given twice and text that is not of the declared type
    are ``UsageError``; range, length, regex and ``in`` checks happen when the contract loads.
    """
    out: dict[str, ParamValue] = {}
    for arg in args:
        name, sep, text = arg.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--param {arg!r} is not NAME=VALUE", remedy="Write --param name=value")
        spec = specs.get(name)
        if spec is None:
            declared = ", ".join(sorted(specs)) or "none"
            raise UsageError(
                f"--param {name}: the contract declares no such param",
                remedy=f"Use one of the declared params ({declared})",
                param=name,
            )
        if name in out:
            raise UsageError(f"--param {name} is given twice", remedy="Give each param once", param=name)
        out[name] = _coerce(name, text, spec)
    return out


def _coerce(name: str, text: str, spec: ParamSpec) -> ParamValue:
    if spec.type == "string":
        return text
    if spec.type == "boolean":
        lowered = text.strip().lower()
        if lowered in ("true", "yes", "1", "on"):
            return True
        if lowered in ("false", "no", "0", "off"):
            return False
        raise UsageError(f"--param {name}={text!r}: expected true or false", remedy="Write true or false", param=name)
    try:
        if spec.type == "integer":
            if not re.fullmatch(r"[+-]?\d{1,16}", text.strip()):
                raise ValueError(text)
            return int(text)  # range checks, 2**53 included, happen in ParamSpec.problem_with
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(text)
        return int(number) if number.is_integer() and re.fullmatch(r"[+-]?\d+", text.strip()) else number
    except ValueError:
        raise UsageError(
            f"--param {name}={text!r}: expected {'an integer' if spec.type == 'integer' else 'a number'}",
            remedy="Write a plain decimal number",
            param=name,
        ) from None


def param_values(
    contract: Contract, layer: Layer, given: Mapping[str, Any], *, require: bool = True
) -> dict[str, ParamValue]:
    """The typed values of every declared param: ``given`` checked against its spec, defaults for the rest.

    ``require=False`` (commands that only connect servers, which no param reaches) leaves a
    required param without a value out instead of refusing it."""
    specs = contract.contract.params
    out: dict[str, ParamValue] = {}
    for name, value in given.items():
        spec = specs.get(name)
        if spec is None:
            declared = ", ".join(sorted(specs)) or "none"
            raise layer.error(
                f"the caller passed param {name!r}, which the contract does not declare",
                ("contract", "params"),
                remedy=f"Pass only declared params ({declared})",
                param=name,
            )
        problem = spec.problem_with(value)
        if problem:
            raise layer.error(
                f"param {name!r}: {problem}", ("contract", "params", name), remedy="Pass a value that fits", param=name
            )
        out[name] = cast(ParamValue, value)
    for name, spec in specs.items():
        if name not in out:
            if spec.default is None:
                if not require:
                    continue
                raise layer.error(
                    f"param {name!r} is required and was not given",
                    ("contract", "params", name),
                    remedy=f"Pass --param {name}=VALUE (or give it a default)",
                    param=name,
                )
            out[name] = spec.default
    return dict(sorted(out.items()))


def narrow_budget(contract: Contract, overrides: Mapping[str, Any]) -> Contract:
    """The contract with some ``[budget]`` limits lowered (serve-mcp callers may only narrow).

    Every key must be a limit of ``[budget]`` and its value may only be at or below the
    contract's; raising a limit, an unknown key or a bad value is an ``InputError``.
    """
    current = contract.budget
    narrowable = {"max_tool_calls", "max_model_turns", "max_tokens", "deadline", "call_timeout", "max_result_bytes"}
    update: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in narrowable:
            raise InputError(
                f"budget key {key!r} cannot be set by a caller",
                remedy=f"Use only {', '.join(sorted(narrowable))}",
                key=key,
            )
        before: Any = getattr(current, key)
        if key in ("deadline", "call_timeout"):
            if not isinstance(value, str):
                raise InputError(f"budget {key} must be a duration string such as '30s'", key=key)
            try:
                lower = parse_duration_ms(value) <= parse_duration_ms(before)
            except ValueError as exc:
                raise InputError(f"budget {key}: {exc}", key=key) from None
        else:
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "max_tool_calls" else 1):
                raise InputError(f"budget {key} must be a positive whole number", key=key)
            if (problem := number_problem(value)) is not None:  # the narrowed contract is recorded
                raise InputError(f"budget {key}: {problem}", key=key)
            lower = before is None or value <= before
        if not lower:
            raise InputError(
                f"budget {key} may only be lowered: the contract allows {before}, the caller asked for {value}",
                remedy="Ask for a limit at or below the contract's",
                key=key,
                limit=before,
                requested=value,
            )
        update[key] = value
    budget = Budget.model_validate({**current.model_dump(by_alias=True), **update})
    return contract.model_copy(update={"budget": budget})
