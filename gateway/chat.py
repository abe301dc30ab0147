"""Chat messages -> one prompt.

A tokenizer with a chat template renders it (``apply_chat_template`` with the generation
prompt). Without one (lenserve's presets use a WordPiece tokenizer with no template, and the
fake model bytes) the documented fallback is plain text, one message per line, then the cue
for the assistant's turn::

    system: You are terse.
    user: Hi!
    assistant:

Tools (``gateway.tools``) go to a template that takes a ``tools`` argument (Qwen2.5/3,
Mistral and Llama 3.1 templates do) as that argument; otherwise, and in the plain fallback,
into a system message that lists them and asks for ``<tool_call>`` blocks. An earlier
assistant turn's ``tool_calls`` reach the template with their arguments as objects (as
Hugging Face templates expect them), a tool turn with its ``tool_call_id``.
"""
from __future__ import annotations

import json

from gateway.config import GatewayConfig
from gateway.errors import APIError
from gateway.protocol import ChatMessage
from gateway.sampling import Prompt, bad, check_text

TOOLS_SYSTEM = ("You may call these functions. To call one, answer with "
                "<tool_call>{\"name\": <function name>, \"arguments\": <arguments as a JSON "
                "object>}</tool_call>.\n<tools>\n%s\n</tools>")


def plain_prompt(messages: list[dict]) -> str:
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def tools_system_text(tools: list[dict]) -> str:
    return TOOLS_SYSTEM % "\n".join(json.dumps(t["function"]) for t in tools)


class ChatFormatter:
    def __init__(self, tokenizer=None):
        template = getattr(tokenizer, "chat_template", None)
        self.tokenizer = tokenizer if template else None
        self.template_takes_tools = isinstance(template, str) and "tools" in template

    @property
    def uses_template(self) -> bool:
        return self.tokenizer is not None

    def render(self, messages: list[ChatMessage], config: GatewayConfig,
               tools: list[dict] | None = None) -> Prompt:
        plain = [_message(i, m, templated=self.tokenizer is not None)
                 for i, m in enumerate(messages)]
        for m in plain:
            check_text("messages", m["content"])
        size = sum(len(m["content"]) for m in plain)
        if size > config.max_prompt_len:
            raise bad("messages", f"are longer than {config.max_prompt_len} characters")
        if tools and not (self.tokenizer is not None and self.template_takes_tools):
            plain = _with_tools_system(plain, tools)
            tools = None
        if self.tokenizer is None:
            return Prompt(text=plain_prompt(plain))
        return Prompt(text=self._apply_template(plain, tools))

    def _apply_template(self, messages: list[dict], tools: list[dict] | None) -> str:
        extra = {"tools": tools} if tools else {}
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True, **extra)
        except Exception as exc:  # noqa: BLE001 - a template refusing the roles is the client's
            raise APIError(400, f"messages: the chat template refused them: {exc}",
                           "messages", "invalid_value") from None


def _message(index: int, m: ChatMessage, templated: bool) -> dict:
    out = {"role": m.role, "content": m.text()}
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if not m.tool_calls:
        return out
    calls = []
    for j, call in enumerate(m.tool_calls):
        try:
            args = json.loads(call.function.arguments)
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise bad("messages", f"messages[{index}].tool_calls[{j}].function.arguments must "
                                  "be a JSON object, as text")
        calls.append({"id": call.id, "type": "function",
                      "function": {"name": call.function.name, "arguments": args}})
    if templated:
        out["tool_calls"] = calls
    else:       # the plain fallback writes the calls as the model was asked to
        out["content"] += "".join(f"<tool_call>{json.dumps(c['function'])}</tool_call>"
                                  for c in calls)
    return out


def _with_tools_system(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The tools listed in the first system message (added when there is none)."""
    text = tools_system_text(tools)
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{text}")
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
