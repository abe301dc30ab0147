"""Chat messages -> one prompt.

A tokenizer with a chat template renders it (``apply_chat_template`` with the generation
prompt). Without one (lenserve's presets use a WordPiece tokenizer with no template, and the
fake model bytes) the documented fallback is plain text, one message per line, then the cue
for the assistant's turn::

    system: You are terse.
    user: Hi!
    assistant:
"""
from __future__ import annotations

from gateway.config import GatewayConfig
from gateway.errors import APIError
from gateway.protocol import ChatMessage
from gateway.sampling import Prompt, bad, check_text


def plain_prompt(messages: list[dict]) -> str:
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


class ChatFormatter:
    def __init__(self, tokenizer=None):
        template = getattr(tokenizer, "chat_template", None)
        self.tokenizer = tokenizer if template else None

    @property
    def uses_template(self) -> bool:
        return self.tokenizer is not None

    def render(self, messages: list[ChatMessage], config: GatewayConfig) -> Prompt:
        plain = [{"role": m.role, "content": m.text()} for m in messages]
        for m in plain:
            check_text("messages", m["content"])
        size = sum(len(m["content"]) for m in plain)
        if size > config.max_prompt_len:
            raise bad("messages", f"are longer than {config.max_prompt_len} characters")
        if self.tokenizer is None:
            return Prompt(text=plain_prompt(plain))
        return Prompt(text=self._apply_template(plain))

    def _apply_template(self, messages: list[dict]) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - a template refusing the roles is the client's
            raise APIError(400, f"messages: the chat template refused them: {exc}",
                           "messages", "invalid_value") from None
