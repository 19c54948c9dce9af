"""API errors: one exception carrying status, code and message, and the handlers that render JSON."""

from __future__ import annotations

import logging
from typing import Any

from quart import Quart, Response, jsonify
from quart_schema import RequestSchemaValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from werkzeug.exceptions import HTTPException

from agent_async import (
    ERROR_JOB_CONCURRENT_LIMIT,
    ERROR_JOB_PAYLOAD_INVALID,
    ERROR_JOB_UNKNOWN,
    QueueUnavailableError,
    RequestCode,
    RequestException,
    StorageUnavailableError,
)

__all__ = ["ApiError", "error_response", "register_error_handlers"]

logger = logging.getLogger(__name__)

_REQUEST_STATUS = {
    ERROR_JOB_CONCURRENT_LIMIT: 409,
    ERROR_JOB_PAYLOAD_INVALID: 422,
    ERROR_JOB_UNKNOWN: 400,
    RequestCode.IDEMPOTENCY_KEY_INVALID: 422,
    RequestCode.IDEMPOTENCY_KEY_REUSED: 422,
}
_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "body_too_large",
    415: "unsupported_media_type",
    431: "request_header_fields_too_large",
}


class ApiError(Exception):
    """An error the API answers on purpose: `{"error": code, "message": message}` with `status`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_response(status: int, code: str, message: str) -> Response:
    response = jsonify({"error": code, "message": message})
    response.status_code = status
    return response


def _validation_message(error: RequestSchemaValidationError) -> str:
    cause: Any = error.validation_error
    errors = getattr(cause, "errors", None)
    if callable(errors):
        parts = []
        for item in errors(include_url=False, include_context=False, include_input=False):
            where = ".".join(str(p) for p in item.get("loc", ())) or "body"
            parts.append(f"{where}: {item.get('msg', 'invalid')}")
        if parts:
            return "; ".join(parts)
    if isinstance(cause, TypeError | ValueError) and str(cause):
        return str(cause)
    return "the request body does not match the expected schema (a JSON object is required)"


def register_error_handlers(app: Quart) -> None:
    """Every error leaves as JSON; nothing the client sends can produce a 500 with internals."""

    @app.errorhandler(ApiError)
    async def api_error(error: ApiError) -> Response:
        response = error_response(error.status, error.code, error.message)
        if error.status == 401:
            # RFC 9110 11.6.1: a 401 names the scheme to authenticate with; RFC 6750 3.1 the error.
            challenge = "Bearer" if error.code == "missing_token" else 'Bearer error="invalid_token"'
            response.headers["WWW-Authenticate"] = challenge
        return response

    @app.errorhandler(RequestSchemaValidationError)
    async def schema_error(error: RequestSchemaValidationError) -> Response:
        return error_response(422, "invalid_body", _validation_message(error))

    @app.errorhandler(RequestException)
    async def request_refused(error: RequestException) -> Response:
        return error_response(_REQUEST_STATUS.get(error.code, 400), error.code, error.message)

    @app.errorhandler(QueueUnavailableError)
    @app.errorhandler(RedisConnectionError)
    @app.errorhandler(RedisTimeoutError)
    async def queue_down(error: Exception) -> Response:
        logger.warning("Redis unavailable: %s", error)
        return error_response(503, "queue_unavailable", "the job queue is unavailable; retry later")

    @app.errorhandler(StorageUnavailableError)
    async def storage_down(error: StorageUnavailableError) -> Response:
        logger.warning("storage unavailable: %s", error)
        return error_response(503, "storage_unavailable", "the database is unavailable; retry later")

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        if status == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH")
            response = error_response(413, code, f"the request body is larger than {limit} bytes")
        else:
            response = error_response(status, code, error.description or error.name)
        # The exception's own headers, which the HTTP status may require: a 405's Allow (RFC 9110
        # 15.5.6) lists the methods the URL supports. Its Content-Type is for the HTML body it did not get.
        for name, value in error.get_headers():
            if name.lower() != "content-type":
                response.headers[name] = value
        return response

    @app.errorhandler(Exception)
    async def unexpected(error: Exception) -> Response:
        logger.exception("unhandled error: %s", type(error).__name__)
        return error_response(500, "internal_error", "an unexpected error occurred")
