"""Chat prompts: the tokenizer's template when it has one, the plain fallback otherwise."""
from __future__ import annotations

import pytest
from gateway.chat import ChatFormatter
from gateway.config import GatewayConfig
from gateway.errors import APIError
from gateway.protocol import ChatMessage

CONFIG = GatewayConfig(served_model_name="m", max_prompt_len=50)


class TemplateTokenizer:
    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        if any(m["role"] == "tool" for m in messages):
            raise ValueError("no tool role")
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def msgs(*pairs):
    return [ChatMessage(role=r, content=c) for r, c in pairs]


def test_template_is_used_when_the_tokenizer_has_one():
    prompt = ChatFormatter(TemplateTokenizer()).render(msgs(("user", "hi")), CONFIG)
    assert prompt.text == "<user>hi<assistant>"


def test_plain_fallback_without_a_template():
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    prompt = ChatFormatter(object()).render(msgs(("system", "s"), ("user", content)), CONFIG)
    assert prompt.text == "system: s\nuser: ab\nassistant:"


def test_template_refusal_and_size_limit_are_400():
    with pytest.raises(APIError) as refused:
        ChatFormatter(TemplateTokenizer()).render(msgs(("tool", "x")), CONFIG)
    assert refused.value.status == 400
    with pytest.raises(APIError) as too_long:
        ChatFormatter(None).render(msgs(("user", "x" * 51)), CONFIG)
    assert too_long.value.param == "messages"
