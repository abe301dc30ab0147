"""Tool calls through the official ``openai`` client, whole and streamed: ``tool_choice``
"required" and a named function constrain a random-weight model (opt-tiny with a byte-level
tokenizer) to calls of the declared tools; "auto" parses what the model writes (scripted here,
since random weights write no call); the tools reach the prompt through a Qwen-style chat
template; bad tools and tool choices are 400s in OpenAI's shape."""
from __future__ import annotations

import copy
import json

import openai
import pytest

from gateway import GatewayConfig, create_app
from gateway.server import ServerThread
from lenserve_contract.outputs import CompletionOutput, RequestOutput
from services.scheduler.async_engine import AsyncEngine
from services.scheduler.engine_core import EngineCore
from services.scheduler.wiring import EngineConfig, engine_parts
from tests.executor.sampling_models import json_executor

pytest.importorskip("xgrammar")

QWEN_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "Call within <tool_call></tool_call> tags.<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant"
    "{%- for c in m.tool_calls %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                   "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "additionalProperties": False,
                                       "required": ["zone"],
                                       "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


class Scripted:
    """The engine, except that a request arrives while ``script`` holds text gets that text
    (in the pieces given) as its answer; records every prompt."""

    def __init__(self, engine):
        self.engine, self.script, self.prompts = engine, None, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, *args, request_id=None, **kwargs):
        self.prompts.append(kwargs.get("prompt"))
        if self.script is None:
            async for out in self.engine.generate(*args, request_id=request_id, **kwargs):
                yield out
            return
        pieces = self.script
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            yield RequestOutput(request_id, kwargs.get("prompt"), [1, 2], [CompletionOutput(
                0, piece, [3], "stop" if last else None)], last)


@pytest.fixture(scope="module")
def served():
    executor = json_executor(num_gpu_blocks=512, block_size=16, max_model_len=1024)
    core = EngineCore(**engine_parts(EngineConfig(model="opt-tiny", max_model_len=1024),
                                     executor))
    engine = AsyncEngine(core)
    tokenizer = copy.deepcopy(executor.tokenizer)
    tokenizer.chat_template = QWEN_TEMPLATE
    backend = Scripted(engine)
    app = create_app(backend, GatewayConfig(served_model_name="tiny"), tokenizer=tokenizer)
    server = ServerThread(app).start()
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0), backend
    server.stop()
    engine.shutdown()


@pytest.fixture
def client(served):
    served[1].script = None
    return served[0]


def chat(client, stream=False, **kw):
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 60, "temperature": 0, **kw}
    return (list(client.chat.completions.create(stream=True, **kw)) if stream
            else client.chat.completions.create(**kw))


def streamed_calls(chunks) -> tuple[str, list[dict], str]:
    """Content, calls (assembled from the deltas as a client does) and the finish reason."""
    content, calls, reason = "", {}, None
    for c in chunks:
        delta = c.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or ():
            call = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
        reason = c.choices[0].finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def check_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert args["city"] in ("Paris", "Oslo") and 1 <= args["days"] <= 7


def test_a_named_function_is_called_whole_and_streamed(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = chat(client, tools=[WEATHER, TIME], tool_choice=choice)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and message.content is None
    (call,) = message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    check_weather(call.function.arguments)
    content, calls, reason = streamed_calls(chat(client, True, tools=[WEATHER, TIME],
                                                 tool_choice=choice))
    assert reason == "tool_calls" and content == "" and len(calls) == 1
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == json.loads(call.function.arguments)  # greedy


def test_required_calls_one_of_the_tools(client):
    whole = chat(client, tools=[WEATHER, TIME], tool_choice="required",
                 parallel_tool_calls=False, temperature=1.0, seed=3)
    (call,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls"
    assert call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_time":
        assert args == {"zone": args["zone"]} and args["zone"] in ("UTC", "CET")
    else:
        check_weather(call.function.arguments)


def test_each_of_n_choices_is_its_own_call_whole_and_streamed(client):
    kw = dict(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
              temperature=1.0, seed=5, n=3)
    whole = chat(client, **kw)
    assert sorted(c.index for c in whole.choices) == [0, 1, 2]
    for c in whole.choices:     # a parser per choice: each answer parsed on its own
        assert c.finish_reason == "tool_calls"
        (call,) = c.message.tool_calls
        check_weather(call.function.arguments)
    chunks = chat(client, True, **kw)
    for index in range(3):
        mine = [c for c in chunks if c.choices and c.choices[0].index == index]
        content, calls, reason = streamed_calls(mine)
        assert reason == "tool_calls" and content == "" and len(calls) == 1
        assert (json.loads(calls[0]["arguments"])
                == json.loads(whole.choices[index].message.tool_calls[0].function.arguments))


def test_auto_without_a_call_is_content(client):
    from tests.executor.sampling_models import byte_bpe_tokenizer
    word = byte_bpe_tokenizer().convert_tokens_to_ids("Hello")     # what greedy writes here
    whole = chat(client, tools=[WEATHER], max_tokens=3, logit_bias={str(word): 100},
                 extra_body={"ignore_eos": True})
    assert whole.choices[0].message.tool_calls is None
    assert whole.choices[0].finish_reason == "length"
    assert whole.choices[0].message.content == "HelloHelloHello"


@pytest.mark.parametrize("pieces", [
    ["Let me look. <tool", "_call>\n{\"name\": \"get_weather\", \"arguments\": ",
     "{\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>"],
    ["{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}"]])
def test_auto_parses_the_call_the_model_writes(served, pieces):
    client, backend = served
    backend.script = pieces
    lead = "Let me look. " if pieces[0].startswith("Let") else ""
    whole = chat(client, tools=[WEATHER])
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert (message.content or "") == lead.strip() or message.content == lead
    assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Oslo", "days": 2}
    content, calls, reason = streamed_calls(chat(client, True, tools=[WEATHER]))
    assert content == lead and reason == "tool_calls"
    assert [c["name"] for c in calls] == ["get_weather"]


def test_auto_keeps_text_that_only_looks_like_a_call(served):
    client, backend = served
    backend.script = ["<tool", "_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>"]
    whole = chat(client, tools=[WEATHER])
    assert whole.choices[0].finish_reason == "stop" and whole.choices[0].message.tool_calls is None
    assert whole.choices[0].message.content == "".join(backend.script)
    content, calls, _ = streamed_calls(chat(client, True, tools=[WEATHER]))
    assert content == "".join(backend.script) and calls == []


def test_tools_and_earlier_calls_reach_the_chat_template(served):
    client, backend = served
    backend.script = ["It is sunny."]
    history = [*MESSAGES,
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"}]
    whole = chat(client, messages=history, tools=[WEATHER])
    assert whole.choices[0].message.content == "It is sunny."
    prompt = backend.prompts[-1]
    assert '"name": "get_weather"' in prompt and "The weather in a city" in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nsunny, 21C" in prompt
    chat(client, tools=[WEATHER], tool_choice="none")
    assert "<tools>" not in backend.prompts[-1]       # "none": the tools are not shown


@pytest.mark.parametrize("kw, param, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among the tools"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools",
     "letters, digits"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools",
     "letters, digits"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "given twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "string"}}}]}, "tools", "schema of an object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "objec"}}}}}]}, "tools", "compiled"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type", "function"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", "tool_choice"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "get_weather", "arguments": "not json"}}]}]}, "messages",
     "JSON object"),
])
def test_bad_tools_are_400_naming_them(client, kw, param, words):
    body = {"tools": [WEATHER], **kw}
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, **body)
    error = err.value.body
    assert err.value.status_code == 400 and error["param"] == param, error
    assert words in error["message"] and error["type"] == "invalid_request_error"
