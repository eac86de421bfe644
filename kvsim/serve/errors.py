"""OpenAI-style error objects, shaped as vLLM's OpenAI server shapes them.

Every error a client sees is ``{"error": {"message", "type", "param", "code"}}`` with
``code`` equal to the HTTP status (vLLM ``entrypoints/serve/engine/protocol.py``
``ErrorResponse``); request validation errors read like vLLM's
(``exception_handling/handlers/validation.py``): ``"N validation error(s):"`` and one
line per pydantic error, ``param`` the dotted location of the first one.
"""
from __future__ import annotations

from http import HTTPStatus
from typing import Any

#: at most this many validation errors are listed (vLLM ``_MAX_REPORTED_ERRORS``)
MAX_REPORTED_ERRORS = 10
_MAX_INPUT_CHARS = 200
_MAX_ERROR_CHARS = 1000
_INTERNAL_LOC = {"function-wrap", "function-after", "function-before", "function-plain", "union",
                 "tagged-union", "nullable", "default", "chain", "lax-or-strict", "json-or-python",
                 "str", "int", "float", "bool", "list", "dict", "none"}


class ApiError(Exception):
    """An error answered to the client with ``status`` and an OpenAI error object."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST, err_type: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = int(status)
        self.err_type = err_type or _default_type(self.status)
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.err_type, self.param)


def _default_type(status: int) -> str:
    """vLLM's error types: BadRequestError, NotFoundError, ... else the HTTP phrase."""
    known = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
             501: "NotImplementedError", 503: "ServiceUnavailableError"}
    if status in known:
        return known[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def error_body(message: str, status: int, err_type: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error object for one error."""
    return {"error": {"message": message, "type": err_type or _default_type(status), "param": param,
                      "code": int(status)}}


def validation_error(errors: list[dict[str, Any]], loc_prefix: tuple = ("body",)) -> ApiError:
    """A 400 from pydantic errors, worded as vLLM's validation handler words it."""
    if not errors:
        return ApiError("Validation error", HTTPStatus.BAD_REQUEST, "Bad Request")
    param = _clean_loc(loc_prefix + tuple(errors[0].get("loc", ())))
    count = len(errors)
    label = "error" if count == 1 else "errors"
    lines = [f"{count} validation {label}:"]
    for err in errors[:MAX_REPORTED_ERRORS]:
        lines.append(f"  {_format_error(err, loc_prefix)}")
    if count > MAX_REPORTED_ERRORS:
        lines.append(f"  ...and {count - MAX_REPORTED_ERRORS} more {label}")
    return ApiError("\n".join(lines), HTTPStatus.BAD_REQUEST, "Bad Request", param)


def _format_error(err: dict[str, Any], loc_prefix: tuple) -> str:
    shown = {k: v for k, v in err.items() if k in ("type", "loc", "msg", "input")}
    shown["loc"] = _clean_loc(loc_prefix + tuple(err.get("loc", ())))
    if "input" in shown:
        shown["input"] = _summarize(shown["input"])
    text = str(shown)
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "...[truncated]"


def _summarize(value: Any) -> Any:
    """A size-bounded stand-in for the offending input (never the whole prompt)."""
    if isinstance(value, str):
        return value if len(value) <= _MAX_INPUT_CHARS else value[:_MAX_INPUT_CHARS] + "...[truncated]"
    if isinstance(value, (bytes, bytearray)):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, (list, tuple, set, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return value


def _clean_loc(loc: tuple) -> str:
    parts = [str(p) for p in loc if not (str(p).lower() in _INTERNAL_LOC or any(c in str(p) for c in "[]{}()"))]
    return ".".join(parts) if parts else ".".join(str(p) for p in loc)
