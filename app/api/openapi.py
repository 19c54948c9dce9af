"""The OpenAPI description: what each operation declares beyond quart-schema's JSON models, and the one
function that completes quart-schema's generated document with it.

quart-schema documents JSON request and response models. It cannot document a response without a
body (a 204) or one that is not JSON (a streamed file), and it knows nothing of the app's
`before_request` hooks (the token check, the request-head limit) or of which statuses the error
handlers produce. Handlers declare those with the decorators below (`document_errors`,
`document_plain_response`, `document_request_body`); `complete_openapi_document` renders them and
what the hooks add, so each handler and its description sit side by side.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from quart_schema.openapi import PATH_RE, OpenAPIProvider

from app.api.request import MAX_REQUEST_HEAD_BYTES
from app.api.schemas import ErrorOut

__all__ = [
    "ERROR_DESCRIPTIONS",
    "AppOpenAPIProvider",
    "complete_openapi_document",
    "document_errors",
    "document_plain_response",
    "document_request_body",
]

F = TypeVar("F", bound=Callable[..., Any])

_ERRORS_ATTRIBUTE = "_app_openapi_errors"
_PLAIN_ATTRIBUTE = "_app_openapi_plain_responses"
_BODY_ATTRIBUTE = "_app_openapi_request_body"

# The default description of each error status: the `error` codes it carries (docs/api.md, Errors).
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "`bad_request`: the JSON body cannot be read (malformed, empty, not UTF-8, nested too deeply, "
         "or declaring another charset while not plain ASCII).",
    401: "`missing_token`, `invalid_token` or `token_expired`: send a valid `Authorization: Bearer <token>`.",
    403: "`forbidden`.",
    404: "The path names nothing the caller may see.",
    408: "`request_timeout`: the body did not arrive in time.",
    409: "A conflict with the current state.",
    410: "Gone.",
    413: "`body_too_large`: the body is over `AGENT_MAX_BODY_BYTES`.",
    415: "`unsupported_media_type`.",
    422: "`invalid_body`: the body or the query string fails validation (the message names the field).",
    431: f"`request_header_fields_too_large`: the URL and headers together are over {MAX_REQUEST_HEAD_BYTES} bytes.",
    503: "`queue_unavailable` or `storage_unavailable`: Redis or the database cannot be reached; retry later.",
}

_ERROR_REF = {"$ref": "#/components/schemas/ErrorOut"}
# Every 401 names the scheme to authenticate with (app/errors.py).
_CHALLENGE = {
    "WWW-Authenticate": {
        "description": '`Bearer`, or `Bearer error="invalid_token"` when a token was sent (RFC 6750).',
        "required": True,
        "schema": {"type": "string", "pattern": "^Bearer"},
    },
}


def document_errors(*statuses: int, descriptions: Mapping[int, str] | None = None) -> Callable[[F], F]:
    """Declare error statuses the handler answers, each with an ErrorOut body.

    `descriptions` overrides ERROR_DESCRIPTIONS for this operation (say which codes it uses). 401 and
    431 are added to every operation by `complete_openapi_document`: they come from app-wide hooks.
    """
    declared = {status: (descriptions or {}).get(status, ERROR_DESCRIPTIONS[status]) for status in statuses}
    unknown = set(descriptions or {}) - set(statuses)
    if unknown:
        raise ValueError(f"descriptions for undeclared statuses {sorted(unknown)}")

    def decorator(func: F) -> F:
        # A new dict: functools.wraps shares __dict__ values between a wrapper and what it wraps.
        setattr(func, _ERRORS_ATTRIBUTE, {**getattr(func, _ERRORS_ATTRIBUTE, {}), **declared})
        return func

    return decorator


def document_plain_response(
    status: int,
    description: str,
    *,
    content: Mapping[str, Any] | None = None,
    headers: Mapping[str, Any] | None = None,
) -> Callable[[F], F]:
    """Declare a response quart-schema cannot describe: no body (a 204) or a body that is not JSON.

    `content` and `headers` are OpenAPI Media Type and Header objects, keyed by media type and name.
    """
    response: dict[str, Any] = {"description": description}
    if content is not None:
        response["content"] = dict(content)
    if headers is not None:
        response["headers"] = dict(headers)

    def decorator(func: F) -> F:
        setattr(func, _PLAIN_ATTRIBUTE, {**getattr(func, _PLAIN_ATTRIBUTE, {}), status: response})
        return func

    return decorator


def document_request_body(
    description: str, *, content: Mapping[str, Any], required: bool = True
) -> Callable[[F], F]:
    """Declare a request body the handler reads itself (quart-schema's `document_request` takes one
    model in one media type): `content` maps each accepted media type to an OpenAPI Media Type object."""
    body = {"description": description, "required": required, "content": dict(content)}

    def decorator(func: F) -> F:
        setattr(func, _BODY_ATTRIBUTE, body)
        return func

    return decorator


def complete_openapi_document(
    document: dict[str, Any],
    operations: Iterable[tuple[str, str, str, Callable[..., Any]]],
    *,
    public_endpoints: Collection[str],
) -> dict[str, Any]:
    """Complete the document quart-schema generated, in place, and return it.

    `operations` are (OpenAPI path, lower-case method, endpoint, view function) of every documented
    route. For each operation:

    - the error statuses declared with `document_errors`, as ErrorOut responses (one shared
      `#/components/schemas/ErrorOut`) described by the codes they carry;
    - 431 on every operation: the app's `limit_head` hook refuses an oversized head on any route;
    - 401 (with its `WWW-Authenticate` challenge) on every operation that needs a token, and
      `security: []` on the public ones (`public_endpoints`: the very set the app's `authenticate`
      hook skips);
    - the responses declared with `document_plain_response` (quart-schema documents JSON bodies only),
      and the request body declared with `document_request_body`;
    - `required: true` on every request body: no operation reading one accepts a request without
      it (quart-schema leaves `required` out, which means optional).

    Responses are ordered by status, so the document reads the same however it was assembled.
    """
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorOut"] = ErrorOut.model_json_schema()
    for path, method, endpoint, func in operations:
        operation = document["paths"][path][method]
        responses: dict[str, Any] = {str(status): body for status, body in operation.get("responses", {}).items()}
        errors: dict[int, str] = dict(getattr(func, _ERRORS_ATTRIBUTE, {}))
        errors[431] = ERROR_DESCRIPTIONS[431]
        if endpoint in public_endpoints:
            operation["security"] = []
        else:
            errors[401] = ERROR_DESCRIPTIONS[401]
        for status, description in errors.items():
            responses[str(status)] = {
                "description": description,
                "content": {"application/json": {"schema": dict(_ERROR_REF)}},
            }
            if status == 401:
                responses["401"]["headers"] = copy.deepcopy(_CHALLENGE)
        for status, response in getattr(func, _PLAIN_ATTRIBUTE, {}).items():
            responses[str(status)] = copy.deepcopy(response)
        operation["responses"] = dict(sorted(responses.items()))
        body = getattr(func, _BODY_ATTRIBUTE, None)
        if body is not None:
            operation["requestBody"] = copy.deepcopy(body)
        if "requestBody" in operation:
            operation["requestBody"]["required"] = True
    return document


class AppOpenAPIProvider(OpenAPIProvider):
    """quart-schema's provider, its document completed by `complete_openapi_document`."""

    def schema(self) -> dict[str, Any]:
        from app.factory import PUBLIC_ENDPOINTS  # the factory imports this module

        return complete_openapi_document(super().schema(), self._operations(), public_endpoints=PUBLIC_ENDPOINTS)

    def _operations(self) -> Iterator[tuple[str, str, str, Callable[..., Any]]]:
        app = self._app  # a weak proxy of the Quart app
        for rule in self.generate_rules():
            # The very path and methods quart-schema's build_paths documents the rule under.
            path = re.sub(PATH_RE, r"{\1}", rule.rule)
            for method in self.generate_methods(rule):
                yield path, method.lower(), rule.endpoint, app.view_functions[rule.endpoint]
