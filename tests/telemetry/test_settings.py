"""Where spans go: the operator's [telemetry] over the standard OTEL_* variables, and bad settings refused.

Bad config files and bad environments are data files in ``bad/`` named after what they try; each
config file says on its first line the key path its error must name. No error may repeat a value
from the environment (a header or an endpoint may hold a credential).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.telemetry.conftest import tools_contract, truss
from truss._errors import ContractError, UsageError
from truss.contract import Telemetry, load_contract_text, telemetry_from_text
from truss.telemetry import ENV_NAMES, EXTRA, resolve_settings

BAD = Path(__file__).resolve().parent / "bad"
CONFIGS = sorted(p for p in BAD.glob("*.toml") if p.name != "contract_holds_telemetry.toml")
ENVIRONMENTS: dict[str, Any] = json.loads((BAD / "environments.json").read_text(encoding="utf-8"))
BASE = "http://127.0.0.1:4318"


def resolve(config: Telemetry | None, env: dict[str, str]) -> Any:
    return resolve_settings(config, env, check_extra=False)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_a_bad_telemetry_table_is_a_located_error_naming_its_key(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    expected = text.splitlines()[0].removeprefix("# path: ").strip()
    with pytest.raises(ContractError) as refused:
        telemetry_from_text(text, file=str(path))
    assert refused.value.fields["path"] == expected
    assert refused.value.fields["file"] == str(path) and refused.value.fields["line"]
    assert (
        "hunter2" not in refused.value.diagnostics() and "collector-token-in-a-file" not in refused.value.diagnostics()
    )


def test_a_contract_that_holds_telemetry_is_refused_whatever_it_says() -> None:
    path = BAD / "contract_holds_telemetry.toml"
    with pytest.raises(ContractError) as refused:
        load_contract_text(path.read_text(encoding="utf-8"), source=str(path))
    assert refused.value.fields["path"] == "telemetry"


def test_telemetry_in_the_operator_config_is_not_part_of_the_effective_contract_or_its_hash(tmp_path: Path) -> None:
    text = '[contract]\nname = "plain"\nintent = "x"\n'
    alone = load_contract_text(text, source="c.toml")
    config = ("config.toml", f'[telemetry]\notlp_endpoint = "{BASE}"\nrecord_results = true\n')
    with_config = load_contract_text(text, source="c.toml", config=config)
    assert with_config.hash == alone.hash and "telemetry" not in with_config.to_json()


@pytest.mark.parametrize("case", sorted(ENVIRONMENTS), ids=sorted(ENVIRONMENTS))
def test_a_bad_otel_variable_is_an_error_that_names_the_variable_and_never_its_value(case: str) -> None:
    given = ENVIRONMENTS[case]
    with pytest.raises(UsageError) as refused:
        resolve(None, given["env"])
    assert refused.value.fields["env"] == given["names"]
    if "secret" in given:
        assert given["secret"] not in refused.value.diagnostics()
        assert given["secret"] not in json.dumps(refused.value.to_json())


def test_nothing_configured_means_telemetry_is_off() -> None:
    assert resolve(None, {}) is None
    assert resolve(Telemetry(), {"OTEL_SERVICE_NAME": "x"}) is None


def test_the_base_endpoint_gets_the_traces_path_and_the_traces_endpoint_is_used_as_it_is() -> None:
    assert resolve(Telemetry(otlp_endpoint=BASE + "/"), {}).traces_url == BASE + "/v1/traces"
    assert resolve(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE}).traces_url == BASE + "/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/custom"}
    assert resolve(None, env).traces_url == "http://127.0.0.1:9/custom"
    assert resolve(Telemetry(traces_endpoint="http://127.0.0.1:7/t"), env).traces_url == "http://127.0.0.1:7/t"


def test_a_key_set_in_the_config_wins_over_its_variable_and_an_unset_key_falls_back_to_it() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_SERVICE_NAME": "from-env",
        "OTEL_EXPORTER_OTLP_HEADERS": "X-Tenant=env,x-only-env=1",
        "OTEL_RESOURCE_ATTRIBUTES": "team=env,region=eu",
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
    }
    config = Telemetry(
        otlp_endpoint=BASE, service_name="from-config", headers={"x-tenant": "config"}, resource={"team": "config"}
    )
    settings = resolve(config, env)
    assert settings.traces_url == BASE + "/v1/traces" and settings.source == "config"
    assert (settings.protocol, settings.timeout_s, settings.max_queue_spans) == ("http/json", 2.5, 100)
    assert settings.resource["service.name"] == "from-config"
    assert (settings.resource["team"], settings.resource["region"]) == ("config", "eu")
    assert {k.lower(): v for k, v in settings.headers.items()} == {"x-tenant": "config", "x-only-env": "1"}


def test_telemetry_is_off_when_the_operator_or_the_standard_switch_says_so() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE}
    assert resolve(Telemetry(enabled=False), env) is None
    assert resolve(Telemetry(otlp_endpoint=BASE), {"OTEL_SDK_DISABLED": "true"}) is None
    assert resolve(Telemetry(otlp_endpoint=BASE), {"OTEL_TRACES_EXPORTER": "none"}) is None
    assert resolve(None, {**env, "OTEL_TRACES_EXPORTER": "otlp"}) is not None


def test_content_is_exported_only_when_the_operator_config_asks_for_it() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
    assert not resolve(None, env).content.wanted
    asked = resolve(Telemetry(record_arguments=True), env).content
    assert (asked.arguments, asked.results) == (True, False)


def test_a_secret_header_comes_from_the_environment_and_is_never_shown() -> None:
    config = telemetry_from_text(
        f'[telemetry]\notlp_endpoint = "{BASE}"\n'
        'headers = { authorization = { secret_env = "COLLECTOR_TOKEN", format = "Bearer {}" } }\n',
        file="config.toml",
    )
    settings = resolve(config, {"COLLECTOR_TOKEN": "tok-3f9a1c"})
    assert settings.headers == {"authorization": "Bearer tok-3f9a1c"}
    assert "tok-3f9a1c" not in repr(settings) and "tok-3f9a1c" not in settings.describe()
    assert "Bearer tok-3f9a1c" in settings.secret_values
    with pytest.raises(ContractError) as missing:
        resolve(config, {})
    assert missing.value.fields["env"] == "COLLECTOR_TOKEN"


def test_docs_telemetry_lists_every_variable_truss_reads() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "telemetry.md").read_text(encoding="utf-8")
    missing = [name for name in ENV_NAMES if f"`{name}`" not in text]
    assert not missing, f"docs/telemetry.md does not list {missing}"
    assert EXTRA in text


def test_a_bad_telemetry_setting_stops_truss_run_before_anything_is_recorded(tmp_path: Path, home: Path) -> None:
    (home / "config.toml").write_text((BAD / "literal_authorization_header.toml").read_text(), encoding="utf-8")
    done = truss(home, "--json", "run", str(tools_contract(tmp_path, "")))
    assert done.returncode == 2
    assert json.loads(done.stdout)["path"] == "telemetry.headers"
    assert not (home / "ledger.db").exists() or truss(home, "sessions").stdout.strip() == "no sessions"


def test_docs_contracts_md_documents_every_telemetry_key() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "contracts.md").read_text(encoding="utf-8")
    assert "## `[telemetry]`" in text
    missing = [key for key in Telemetry.model_fields if f"`{key}`" not in text]
    assert not missing, f"docs/contracts.md does not document [telemetry] {missing}"
