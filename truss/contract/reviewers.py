"""``[[done.checks.reviewers]]``: one reviewer of a ``panel`` check, a provider and model as in ``[agent]``.

A reviewer names a provider kind (looked up in the same registry as ``agent.provider``, so an
unknown name is refused at load), a model when the kind needs one, and optionally ``base_url``,
``api_key_env`` (a *name*; the key is read from the environment when the run starts and is never
recorded), its output limit, temperature, request timeout and attempts, with ``[agent]``'s
meanings and defaults (docs/providers.md).

``provider = "scripted"`` is the offline reviewer (tests, examples, demos): it asks no model and
answers from the contract with exactly one of ``answer`` (the JSON it submits as its form; a
string is sent as plain text instead of a submission, which is how a malformed answer is
written), ``judge`` (every claim judged so, relying on the calls the claim cites) or
``stall = true`` (it never answers: the panel's deadline decides). Those keys are refused on
every other provider. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from truss.contract.fields import BaseUrl, Duration, EnvName, KeyValueError, Model, PositiveInt
from truss.contract.providers import provider_kinds_in

__all__ = ["REVIEWER_NAME_RE", "SCRIPTED_REVIEWER", "Reviewer"]

REVIEWER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}\Z")
SCRIPTED_REVIEWER = "scripted"


class Reviewer(Model):
    """One reviewer of a panel (see the module docstring)."""

    name: str | None = None
    provider: str
    model: str | None = None
    base_url: BaseUrl | None = None
    api_key_env: EnvName | None = None
    max_output_tokens: PositiveInt = 4096
    temperature: float | None = None
    request_timeout: Duration = "120s"
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 4
    answer: Any = None
    judge: Literal["supported", "unsupported", "contradicted"] | None = None
    stall: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not REVIEWER_NAME_RE.match(value):
            raise ValueError(f"reviewer name {value!r} must be 1-32 of [a-z0-9_-], starting with a letter or digit")
        return value

    @field_validator("provider")
    @classmethod
    def _registered(cls, value: str, info: ValidationInfo) -> str:
        kinds = provider_kinds_in(info.context)
        if value not in kinds:
            raise KeyValueError(
                kinds.unknown(value),
                remedy="Use a provider docs/providers.md lists, or register yours in truss.providers.PROVIDERS",
            )
        return value

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Reviewer:
        # Keys by value, not by presence: the recorded effective contract writes ``stall = false`` out.
        given = [
            k
            for k, v in (("answer", self.answer), ("judge", self.judge), ("stall", self.stall or None))
            if v is not None
        ]
        if self.provider == SCRIPTED_REVIEWER:
            if len(given) != 1:
                raise ValueError("a scripted reviewer needs exactly one of answer, judge or stall = true")
            return self
        if given:
            raise ValueError(f"{given[0]} is for scripted reviewers only, not provider {self.provider!r}")
        kind = provider_kinds_in(info.context).get(self.provider)  # None only if _registered refused it
        if kind is not None and kind.capabilities.needs_model and not self.model:
            raise ValueError(f"a reviewer with provider {self.provider!r} needs a model")
        return self
