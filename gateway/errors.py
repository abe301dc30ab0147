"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``."""
from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from lenserve_contract.errors import InvalidRequestError

log = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error",
               429: "rate_limit_error", 503: "service_unavailable"}


class APIError(Exception):
    """An error the client gets back as is."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_bytes(status: int, message: str, param: str | None = None,
                code: str | None = None) -> bytes:
    return json.dumps(error_body(status, message, param, code)).encode()


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.status, err.message, err.param, err.code),
                        status_code=err.status, headers=err.headers)


def invalid(exc: InvalidRequestError) -> APIError:
    return APIError(400, str(exc), exc.field or None, exc.code)


def describe_validation(exc: RequestValidationError) -> APIError:
    """The first pydantic complaint as one line, naming the parameter it is about."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request body", code="invalid_value")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(400, malformed_json(first), code="invalid_json")
    if first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",):
        return APIError(400, "the request body is empty: send a JSON object",
                        code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    return APIError(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}", param,
                    "invalid_value")


def malformed_json(error: dict) -> str:
    """The parser's complaint and where: pydantic puts the character offset in ``loc``,
    which is no parameter of the API (a client saw ``"param": "62"``)."""
    reason = (error.get("ctx") or {}).get("error") or error.get("msg", "not JSON")
    offset = next((p for p in error.get("loc", ()) if isinstance(p, int)), None)
    where = f" at character {offset}" if offset is not None else ""
    return f"malformed JSON in request body: {reason}{where}"


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(_: Request, exc: InvalidRequestError):
        return error_response(invalid(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        return error_response(describe_validation(exc))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException):
        return error_response(APIError(exc.status_code, str(exc.detail), headers=exc.headers))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(APIError(500, "internal error", code="internal_error"))
