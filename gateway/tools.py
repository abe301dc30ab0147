"""Tool calls of the chat API: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

* ``tool_choice: "none"`` (the default without tools): plain chat, the tools are not shown.
* ``"auto"`` (the default with tools): the tools go into the prompt (``gateway.chat``), the
  model writes what it likes, and the answer is parsed. ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>`` blocks (the format of Qwen2.5/3's and Hermes' templates),
  or an answer that is as a whole one JSON call object (``{"name", "arguments"}``, or
  ``"parameters"`` as Llama 3.1 writes it) or a list of them (Mistral's, whose ``[TOOL_CALLS]``
  marker is a special token the detokenizer drops), naming functions of the request's tools,
  become ``tool_calls``; anything else is content.
* ``"required"`` or a named function: the grammar engine constrains the output to JSON calls,
  each ``{"name", "arguments"}`` with the arguments following the function's ``parameters``
  schema: a list of at least one call (one at most with ``parallel_tool_calls: false``), or
  the named function's single call.

The finish reason is ``"tool_calls"`` when the answer holds calls. Streamed, content streams as
usual, text that may begin a call is held back until that is known, and each call comes at
the end in one delta of OpenAI's shape (``index``, ``id``, ``function.name``, ``arguments``
whole).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from gateway.protocol import ChatCompletionRequest, NamedToolChoice
from gateway.sampling import bad
from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.sampling_params import StructuredOutput
from services.executor.structured import check_structured_output

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    functions: dict[str, dict]      # name -> {"name", "description", "parameters"}
    forced: str | None              # None: auto; "required"; or the named function
    parallel: bool = True

    def template_tools(self) -> list[dict]:
        """The tools as chat templates take them (OpenAI's ``tools`` entries)."""
        return [{"type": "function", "function": f} for f in self.functions.values()]

    def structured_output(self) -> StructuredOutput | None:
        if self.forced is None:
            return None
        if self.forced != "required":
            schema = _call_schema(self.functions[self.forced])
        else:
            calls = [_call_schema(f) for f in self.functions.values()]
            schema = {"type": "array", "minItems": 1,
                      "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
            if not self.parallel:
                schema["maxItems"] = 1
        return StructuredOutput("json_schema", json.dumps(schema))

    def parser(self) -> ToolCallParser:
        return ToolCallParser(self)


def _call_schema(function: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": function["name"]},
                           "arguments": function["parameters"]}}


def plan(req: ChatCompletionRequest) -> ToolPlan | None:
    """The request's tool plan (None: plain chat), or a 400 naming what is wrong."""
    choice = req.tool_choice or ("auto" if req.tools else "none")
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    if not req.tools:
        if choice in ("none", "auto"):
            return None
        raise bad("tool_choice", f"{named or choice!r} needs tools")
    functions = {}
    for i, tool in enumerate(req.tools):
        f, where = tool.function, f"tools[{i}].function"
        if not isinstance(f.name, str) or not NAME.match(f.name):
            raise bad("tools", f"{where}.name must be 1-64 letters, digits, '_' or '-', got "
                               f"{f.name!r}")
        if f.name in functions:
            raise bad("tools", f"{where}.name {f.name!r} is given twice")
        params = NO_PARAMETERS if f.parameters is None else f.parameters
        if params.get("type", "object") != "object":
            raise bad("tools", f"{where}.parameters must be a JSON schema of an object")
        _check_schema(params, f"{where}.parameters")
        functions[f.name] = {"name": f.name, "description": f.description or "",
                             "parameters": params}
    if choice == "none":
        return None
    if named is not None and named not in functions:
        raise bad("tool_choice", f"names the function {named!r}, which is not among the "
                                 f"tools ({', '.join(functions)})")
    forced = named or (choice if choice == "required" else None)
    fmt = req.response_format
    if forced and fmt is not None and fmt.type != "text":
        raise bad("response_format", f"cannot constrain the output together with tool_choice "
                                     f"{forced!r} (which constrains it to the tool calls)")
    return ToolPlan(functions, forced, req.parallel_tool_calls is not False)


def _check_schema(schema: dict, where: str) -> None:
    try:
        check_structured_output("json_schema", json.dumps(schema))
    except InvalidRequestError as exc:
        why = str(exc).removeprefix("response_format: the JSON schema ")
        raise bad("tools", f"{where}: the JSON schema {why}") from None


class ToolCallParser:
    """One answer's text in, content and calls out: ``feed`` returns the content that can be
    sent now, ``finish`` the rest of it and the calls (OpenAI's ``tool_calls`` entries)."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.held = ""
        self.calling = plan.forced is not None     # the text may be calls: keep it to the end
        self.started = False                       # content was sent: no whole-JSON answer

    def feed(self, text: str) -> str:
        self.held += text
        if self.calling:
            return ""
        at = self.held.find(OPEN)
        if at >= 0:
            out, self.held, self.calling = self.held[:at], self.held[at:], True
            return out
        first = self.held.lstrip()[:1]
        if not first or (not self.started and first in "{["):
            self.calling = bool(first)
            return ""
        keep = next((k for k in range(min(len(OPEN) - 1, len(self.held)), 0, -1)
                     if OPEN.startswith(self.held[-k:])), 0)
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        self.started = self.started or bool(out)
        return out

    def finish(self) -> tuple[str, list[dict]]:
        text, self.held = self.held, ""
        if not self.calling:
            return text, []
        calls = self._parse(text)
        if calls is None:
            return text, []
        rest = "" if OPEN not in text else _outside_tags(text)
        return rest, [self._entry(name, args) for name, args in calls]

    def _parse(self, text: str) -> list[tuple[str, str]] | None:
        if self.plan.forced is None and OPEN in text:
            bodies = [m.group(1) for m in re.finditer(
                re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", text, re.S)]
            values = [_json(b) for b in bodies]
        else:
            value = _json(text)
            values = value if isinstance(value, list) else [value]
        calls = [self._call(v) for v in values]
        return calls if calls and all(c is not None for c in calls) else None

    def _call(self, value) -> tuple[str, str] | None:
        if not isinstance(value, dict) or value.get("name") not in self.plan.functions:
            return None
        args = value.get("arguments", value.get("parameters", {}))
        if isinstance(args, str):
            args = _json(args)
        if not isinstance(args, dict):
            return None
        return value["name"], json.dumps(args, ensure_ascii=False)

    @staticmethod
    def _entry(name: str, arguments: str) -> dict:
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": name, "arguments": arguments}}


def _json(text: str):
    try:
        return json.loads(text, strict=False)     # a raw control character in a string

    except ValueError:
        return None


def _outside_tags(text: str) -> str:
    """The text of an answer around its ``<tool_call>`` blocks (the part after the first
    block was held back with them)."""
    tail = re.sub(re.escape(OPEN) + r".*?(?:" + re.escape(CLOSE) + r"|$)", "", text, flags=re.S)
    return tail.strip()
