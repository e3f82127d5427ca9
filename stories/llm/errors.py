"""Typed model failures. `.code` is stable (stored on jobs, sent in API errors); `.message`
is plain words a player can read. Messages are written here, never copied from a provider:
they must not carry the API key or any part of a provider's response body."""

from __future__ import annotations


class ModelError(Exception):
    code = "model_error"
    default_message = "The model could not answer."

    def __init__(self, message: str | None = None) -> None:
        self.message = message or self.default_message
        super().__init__(self.message)


class ModelTimeout(ModelError):
    code = "model_timeout"
    default_message = "The model took too long to answer."


class ModelRateLimited(ModelError):
    code = "model_rate_limited"
    default_message = "The model server is busy right now."

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        if message is None:
            message = self.default_message
            if retry_after is not None:
                message += f" Try again in {max(1, round(retry_after))} seconds."
            else:
                message += " Try again shortly."
        super().__init__(message)


class ModelUnavailable(ModelError):
    code = "model_unavailable"
    default_message = "The model server could not be reached."


class ModelMalformed(ModelError):
    """The reply arrived but cannot be used. `reason` names the fault precisely (field
    names and limits from our own schema; model-supplied names are shortened)."""

    code = "model_malformed"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"The model's reply could not be used: {reason}.")


class ModelCancelled(ModelError):
    code = "cancelled"
    default_message = "The request was cancelled."


def shorten(value: object, limit: int = 40) -> str:
    """A model-supplied name or value, made safe to quote in a message."""
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
