"""The elicitation policy (``truss.elicitation.answer``): what Truss answers a server that asks for input.

The schemas are the ones real servers send: the conformance suite's SEP-1034 defaults form and
server-everything's form of every field kind. Bad requests are data, not text: each case names the
attack or mistake it stands for.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from truss.contract import Elicitation
from truss.elicitation import CallElicitations, Elicited, answer, declined, request_document, url_sha256

# The conformance suite's elicitation-sep1034-client-defaults form: every field optional, each with a default.
SEP1034: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "default": True},
    },
    "required": [],
}

FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "check": {"type": "boolean"},
        "integer": {"type": "integer", "minimum": 1, "maximum": 100, "default": 42},
        "hero": {"type": "string", "oneOf": [{"const": "hero-1"}, {"const": "hero-2"}], "default": "hero-1"},
        "fish": {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {"anyOf": [{"const": "fish-1"}, {"const": "fish-2"}]},
            "default": ["fish-1"],
        },
    },
    "required": ["name"],
}

ACCEPT = Elicitation(action="accept")


def _ask(policy: Elicitation, schema: Any, mode: str = "form") -> Any:
    return answer(policy, mode=mode, message="Please fill in", requested_schema=schema)


def test_accept_answers_a_form_whose_fields_all_have_defaults_with_those_defaults() -> None:
    got = _ask(ACCEPT, SEP1034)
    assert (got.action, got.reason) == ("accept", "accepted")
    assert got.content == {"name": "John Doe", "age": 30, "score": 95.5, "status": "active", "verified": True}


def test_contract_values_come_before_defaults_and_fill_required_fields() -> None:
    policy = Elicitation(action="accept", content={"name": "Ada", "integer": 7, "unasked": "x"})
    got = _ask(policy, FORM)
    assert got.action == "accept"
    assert got.content == {"name": "Ada", "integer": 7, "hero": "hero-1", "fish": ["fish-1"]}


def test_a_required_field_without_default_or_contract_value_is_declined() -> None:
    got = _ask(ACCEPT, FORM)
    assert (got.action, got.reason, got.content) == ("decline", "missing_required", None)


@pytest.mark.parametrize(
    ("case", "content"),
    [
        ("string_too_long", {"name": "x" * 41}),
        ("integer_above_maximum", {"name": "Ada", "integer": 101}),
        ("integer_given_as_float_fraction", {"name": "Ada", "integer": 1.5}),
        ("enum_value_not_offered", {"name": "Ada", "hero": "hero-9"}),
        ("multi_select_with_a_value_not_offered", {"name": "Ada", "fish": ["fish-1", "shark"]}),
        ("multi_select_with_too_many_items", {"name": "Ada", "fish": ["fish-1", "fish-2", "fish-1"]}),
        ("boolean_given_as_string", {"name": "Ada", "check": "yes"}),
    ],
)
def test_content_that_does_not_fit_the_schema_is_never_sent(case: str, content: dict[str, Any]) -> None:
    got = _ask(Elicitation(action="accept", content=content), FORM)
    assert (got.action, got.reason, got.content) == ("decline", "invalid_value", None), case


@pytest.mark.parametrize(
    ("case", "schema"),
    [
        ("schema_not_an_object", ["name"]),
        ("schema_type_not_object", {"type": "string"}),
        ("nested_object_property", {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}),
        ("property_without_type", {"type": "object", "properties": {"a": {"default": 1}}}),
        ("required_names_a_missing_property", {"type": "object", "properties": {}, "required": ["ghost"]}),
        ("thousand_properties", {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}),
    ],
)
def test_a_schema_outside_the_specifications_flat_primitives_is_declined(case: str, schema: Any) -> None:
    got = _ask(ACCEPT, schema)
    assert (got.action, got.reason) == ("decline", "unsupported_schema"), case


def test_a_server_default_that_breaks_its_own_schema_is_declined_not_echoed() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5, "default": 500}}}
    assert _ask(ACCEPT, schema).reason == "invalid_value"


def test_a_request_with_no_canonical_form_is_declined_as_unrecordable() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "default": 2**60}}}
    got = _ask(ACCEPT, schema)
    assert (got.action, got.reason) == ("decline", "unrecordable")


def test_url_mode_is_declined_whatever_the_policy() -> None:
    got = _ask(ACCEPT, None, mode="url")
    assert (got.action, got.reason) == ("decline", "url_mode")


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_decline_and_cancel_are_answered_as_configured(action: str) -> None:
    got = _ask(Elicitation.model_validate({"action": action}), SEP1034)
    assert (got.action, got.reason, got.content) == (action, "policy", None)


def test_the_default_policy_declines() -> None:
    assert _ask(Elicitation(), SEP1034).action == "decline"


def test_a_url_mode_request_is_recorded_by_the_hash_of_its_url_never_the_url() -> None:
    url = "https://example.test/consent?one_time=abc123"
    record = Elicited("url", "Open this", None, url_sha256(url), declined("url_mode", "never"))
    document = request_document(record)
    assert url not in str(document) and document["url"].startswith("sha256:")


def test_one_call_records_at_most_the_bound_and_counts_the_rest() -> None:
    collected = CallElicitations()
    record = Elicited("form", "m", SEP1034, None, _ask(ACCEPT, SEP1034))
    for _ in range(40):
        collected.add(record)
    assert (len(collected.records), collected.unrecorded) == (32, 8)


_string: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {"type": st.just("string")}, optional={"default": st.text(max_size=5)}
)
_integer: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {"type": st.just("integer")}, optional={"default": st.integers(-5, 5), "maximum": st.integers(-5, 5)}
)
_boolean: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {"type": st.just("boolean")}, optional={"default": st.booleans()}
)
_enum: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {"type": st.just("string"), "enum": st.lists(st.sampled_from("abc"), min_size=1, unique=True)},
    optional={"default": st.sampled_from("abcd")},
)
_primitive = st.one_of(_string, _integer, _boolean, _enum)
_names = st.sampled_from(["a", "b", "c", "d"])


@given(
    properties=st.dictionaries(_names, _primitive, max_size=4),
    required=st.lists(_names, unique=True, max_size=2),
    content=st.dictionaries(_names, st.one_of(st.text(max_size=3), st.integers(-9, 9), st.booleans()), max_size=4),
)
def test_an_accepted_answer_only_ever_holds_asked_for_fitting_values_and_every_required_one(
    properties: dict[str, dict[str, Any]], required: list[str], content: dict[str, Any]
) -> None:
    schema = {"type": "object", "properties": properties, "required": required}
    got = _ask(Elicitation(action="accept", content=content), schema)
    if got.action != "accept":
        assert got.content is None
        return
    assert got.content is not None
    assert set(got.content) <= set(properties)
    assert set(required) <= set(got.content)
    for name, value in got.content.items():
        spec = properties[name]
        assert value == content.get(name, spec.get("default"))
        if spec["type"] == "integer":
            assert isinstance(value, int) and not isinstance(value, bool)
            assert value <= spec.get("maximum", value)
        if "enum" in spec:
            assert value in spec["enum"]
