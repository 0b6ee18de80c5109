"""The one error type of bad input: it names the field, the value and what is allowed."""

from __future__ import annotations


class ScenarioError(ValueError):
    """Bad scenario input: one message naming the field, the value and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class FieldRuleError(ValueError):
    """A cross-field rule broken by one key; carries the key so the message can name it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
