"""Agent-shaped conversations for prompt-cache tests and benchmarks.

A coding agent sends a long system prompt (instructions, tool schemas) and the whole history
every turn, adding a little at the end; between turns a client may send a short side request
(a title for the conversation).  These builders make such prompts deterministically, with
no model needed: the system text is numbered rules, so two conversations differ from their
first line on and one conversation's turns share everything before the newest message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ollamatrio.types import Message

_VERBS = ("check", "read", "keep", "name", "test", "write", "log", "close", "open", "sort")
_THINGS = ("the inputs", "each file", "the tests", "every error", "the docs", "the paths",
           "the results", "the imports", "the branches", "the options")  # fmt: skip


def system_prompt(name: str, lines: int = 108) -> str:
    """About 23 tokens a line (SmolLM2's tokenizer): 108 lines are ~2,500 tokens."""
    rules = [
        f"Rule {i} for {name}: always {_VERBS[i % 10]} {_THINGS[(i * 7) % 10]} "
        f"before step {i + 1}, and say so."
        for i in range(lines)
    ]
    return f"You are the {name} assistant.\n" + "\n".join(rules)


@dataclass
class Conversation:
    """One conversation: its system prompt and the turns so far."""

    name: str
    lines: int = 108
    messages: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages = [Message(role="system", content=system_prompt(self.name, self.lines))]

    def ask(self, turn: int) -> list[Message]:
        """The messages of the next request: the history plus a new user question."""
        self.messages.append(
            Message(role="user", content=f"Question {turn} for {self.name}: what is rule {turn}?")
        )
        return list(self.messages)

    def answered(self, text: str) -> None:
        self.messages.append(Message(role="assistant", content=text))


def title_request(conversation: Conversation) -> list[Message]:
    """A short side request about a conversation, as agent CLIs send between turns."""
    first = next((m.content for m in conversation.messages if m.role == "user"), "")
    return [
        Message(role="system", content="Write a title of at most five words."),
        Message(role="user", content=first),
    ]
