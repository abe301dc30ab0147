"""The OpenAPI schema says what the gateway answers, and schemathesis, generating requests
from it (valid and invalid), finds no 5xx and no answer the schema does not describe.

A bounded run for the suite; ``evaluation/gateway/fuzz.py`` runs the full one (> 1,000 cases)."""
from __future__ import annotations

import httpx
import pytest
from gateway_helpers import API_KEY
from hypothesis import HealthCheck, given, settings

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import CHECKS, load_all_checks  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

# schemathesis's own strategies draw from ``random`` (its concern, not the gateway's)
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module")
AUTH = {"Authorization": f"Bearer {API_KEY}"}
EXAMPLES = 15           # per operation and mode


def test_schema_documents_the_real_statuses(live):
    schema = httpx.get(live.url + "/openapi.json", headers=AUTH).json()
    completions = schema["paths"]["/v1/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "413", "429", "503"} <= set(completions)
    assert "422" not in completions          # a body that does not validate is a 400
    assert set(completions["200"]["content"]) == {"application/json", "text/event-stream"}
    assert set(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    props = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["max_tokens"]["maximum"] == live.config.max_tokens_limit
    assert (props["n"]["minimum"], props["n"]["maximum"]) == (1, live.config.max_n)
    # keys are configured: the schema says so, and /health alone is open
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert schema["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in schema["paths"]["/health"]["get"]


def test_schema_lists_the_sampling_parameters_and_their_limits(live):
    schemas = httpx.get(live.url + "/openapi.json", headers=AUTH).json()["components"]["schemas"]
    completion = schemas["CompletionRequest"]["properties"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    for name in ("presence_penalty", "frequency_penalty"):
        assert (completion[name]["minimum"], completion[name]["maximum"]) == (-2, 2)
    assert completion["repetition_penalty"]["exclusiveMinimum"] == 0
    assert (completion["min_p"]["minimum"], completion["min_p"]["maximum"]) == (0, 1)
    assert completion["logprobs"]["maximum"] == chat["top_logprobs"]["maximum"] == 20
    assert completion["logit_bias"]["additionalProperties"] == {"minimum": -100, "maximum": 100}
    for name in ("response_format", "seed", "truncate_prompt_tokens", "cap_max_tokens"):
        assert name in completion and name in chat, name
    assert set(schemas["ResponseFormat"]["properties"]["type"]["enum"]) == {
        "text", "json_object", "json_schema"}
    for name in ("tools", "tool_choice", "parallel_tool_calls"):
        assert name in chat and name not in completion, name
    assert chat["tools"]["maxItems"] == 128
    assert schemas["FunctionDef"]["properties"]["name"]["pattern"] == "^[A-Za-z0-9_-]{1,64}$"


@pytest.fixture(scope="module")
def api(live):
    return schemathesis.openapi.from_url(live.url + "/openapi.json", headers=AUTH)


def all_checks_but_acceptance():
    """Every check but positive_data_acceptance: the schema cannot state every limit (across
    fields, the model's vocabulary and context)."""
    load_all_checks()
    checks = CHECKS.get_all()
    assert len(checks) > 5
    return [c for c in checks if c.__name__ != "positive_data_acceptance"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_finds_no_5xx_nor_undocumented_answers(api, live, path, mode):
    operation = api[path]["POST"]
    statuses = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        response = case.call_and_validate(base_url=live.url, headers=AUTH,
                                          checks=all_checks_but_acceptance())
        statuses.append(response.status_code)

    run()
    assert statuses and max(statuses) < 500
    if mode is GenerationMode.POSITIVE:
        assert 200 in statuses                  # valid bodies do reach the engine
