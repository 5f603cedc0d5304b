"""User-facing config errors: one line naming the file, the key path and what is allowed; exit code 2."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError


class UserError(Exception):
    """A mistake in what the user wrote. The CLI prints `str(err)` as one line and exits 2."""


def first_error(err: ValidationError) -> dict:
    """The error to show: an unknown key first (a typo usually explains the "missing" errors too)."""
    errors = err.errors()
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])


def format_validation(source: str, err: ValidationError) -> str:
    first = first_error(err)
    path = ".".join(str(p) for p in first["loc"]) or "<root>"
    msg = first["msg"].replace("\n", " ").removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    extra = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{source}: {path}: {msg}{extra}"


def validate(model: type[BaseModel], data: dict, source: str) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise UserError(format_validation(source, err)) from None
