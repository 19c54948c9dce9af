"""The OpenAPI document and the app agree: every route is an operation and every operation a route,
and each operation documents exactly the statuses its handler and the app's hooks can answer.

Three sources are compared. EXPECTED is the table of statuses per operation, written from reading
the handlers, the hooks and the error handlers (docs/api.md says the same in prose). The statuses a
handler answers literally (`ApiError(404, ...)`, `_status(..., 201)`, `Response(status=204)`, in
its body or in the app functions and methods it calls) are found by reading its source: a new
literal status that is not documented fails here. And the rules every operation follows (401 unless
public, 431 everywhere, 400/408/413/422 with a JSON body, 422 with a query string).
tests/app/test_fuzz_api.py checks the other direction: what the running app answers is documented.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from quart import Quart

from app.api.schemas import MULTI_LINE_PATTERN, SINGLE_LINE_PATTERN
from app.factory import OPENAPI_PATH, PUBLIC_ENDPOINTS, create_app
from app.text import text_problem
from tests.app.conftest import make_settings

# Routes that are documentation, not API operations.
UNDOCUMENTED_ENDPOINTS = {"openapi", "swagger_ui"}
NOT_OPERATION_METHODS = {"HEAD", "OPTIONS"}
# The dashboard's HTML pages (/admin/ui, cookie sessions, HTML errors) are no API operations: hidden
# from the document, covered by tests/app/test_dashboard.py.
DASHBOARD_ENDPOINTS = "dashboard."

# Everything but /health needs a token (401); every operation reaches Redis or the database (503);
# the request-head limit applies to every route (431).
COMMON = {401, 431, 503}
JSON_BODY = {400, 408, 413, 422}

EXPECTED: dict[tuple[str, str], set[int]] = {
    ("GET", "/health"): {200, 431, 503},
    ("GET", "/jobs"): {200, 422} | COMMON,
    ("GET", "/jobs/{job_id}"): {200, 403, 404} | COMMON,
    ("POST", "/jobs/{job_id}/cancel"): {200, 403, 404} | COMMON,
    ("GET", "/jobs/{job_id}/result"): {200, 403, 404, 409, 410, 422} | COMMON,
    # Server-Sent Events; 204 for a finished job whose every event the client has seen; 422 a bad Last-Event-ID.
    ("GET", "/jobs/{job_id}/events"): {200, 204, 403, 404, 422} | COMMON,
    ("POST", "/calendars"): {201} | JSON_BODY | COMMON,
    ("GET", "/calendars"): {200} | COMMON,
    ("PATCH", "/calendars/{key}"): {200, 404} | JSON_BODY | COMMON,
    ("DELETE", "/calendars/{key}"): {204, 404} | COMMON,
    ("POST", "/calendars/{key}/events"): {201, 404} | JSON_BODY | COMMON,
    ("GET", "/calendars/{key}/events"): {200, 404, 422} | COMMON,
    ("PATCH", "/calendars/{key}/events/{uid}"): {200, 404} | JSON_BODY | COMMON,
    ("DELETE", "/calendars/{key}/events/{uid}"): {204, 404} | COMMON,
    ("POST", "/calendars/{key}/export"): {202, 404, 409, 422} | COMMON,
    # A raw or multipart body, read by the handler: no JSON, so no 400.
    ("POST", "/calendars/{key}/import"): {202, 404, 408, 409, 413, 415, 422} | COMMON,
    ("POST", "/calendars/external"): {201} | JSON_BODY | COMMON,
    ("GET", "/calendars/{key}/external"): {200, 404} | COMMON,
    ("PATCH", "/calendars/{key}/external"): {200, 404} | JSON_BODY | COMMON,
    ("POST", "/calendars/{key}/sync"): {202, 404, 409, 422} | COMMON,
    ("GET", "/admin/schedules"): {200, 403} | COMMON,
    ("PATCH", "/admin/schedules/{name}"): {200, 403, 404} | JSON_BODY | COMMON,
    ("GET", "/admin/events"): {200, 403, 422} | COMMON,
    ("GET", "/admin/workers"): {200, 403} | COMMON,
    ("GET", "/admin/runs"): {200, 403, 422} | COMMON,
    ("GET", "/admin/runs/{run_id}"): {200, 403, 404} | COMMON,
    ("POST", "/admin/runs/{run_id}/cancel"): {200, 403, 404, 409} | COMMON,
    ("GET", "/admin/guards"): {200, 403} | COMMON,
    ("POST", "/admin/guards/{name}/reset"): {200, 403, 404} | COMMON,
    ("POST", "/admin/sync/external"): {202, 403, 409, 422} | COMMON,
    # Its own bearer token (AGENT_METRICS_TOKEN); 404 while that is unset.
    ("GET", "/metrics"): {200, 404} | COMMON,
}

# A rule's converters written out, independently of quart-schema's own regex (which once read
# "<key>/events/<path:uid>" as one parameter).
_CONVERTER = re.compile(r"<(?:[a-z_]+(?:\([^)]*\))?:)?([a-z_]+)>")


@pytest.fixture
def app(sqlite_url: str, namespace: str) -> Quart:
    return create_app(make_settings(sqlite_url, namespace))


@pytest.fixture
async def document(app: Quart) -> dict[str, Any]:
    response = await app.test_client().get(OPENAPI_PATH)
    assert response.status_code == 200
    body: dict[str, Any] = await response.get_json()
    return body


def routes(app: Quart) -> Iterator[tuple[str, str, str, Callable[..., Any]]]:
    """(method, OpenAPI path, endpoint, view function) of every API route of the app."""
    for rule in app.url_map.iter_rules():
        if rule.endpoint in UNDOCUMENTED_ENDPOINTS or rule.endpoint == "static" or rule.websocket:
            continue
        if rule.endpoint.startswith(DASHBOARD_ENDPOINTS):
            continue
        path = _CONVERTER.sub(r"{\1}", rule.rule)
        for method in sorted(set(rule.methods or ()) - NOT_OPERATION_METHODS):
            yield method, path, rule.endpoint, app.view_functions[rule.endpoint]


def operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }


def documented(operation: dict[str, Any]) -> set[int]:
    return {int(status) for status in operation["responses"]}


# --- what a handler answers literally, read from its source --------------------------------------------


_STATUS_CALLS = {"ApiError": 0, "error_response": 0, "_status": 1}


def _status_literal(call: ast.Call, name: str) -> int | None:
    if name in _STATUS_CALLS:
        index = _STATUS_CALLS[name]
        if len(call.args) > index and isinstance(call.args[index], ast.Constant):
            value = call.args[index].value
            return value if isinstance(value, int) else None
    for keyword in call.keywords:
        if keyword.arg == "status" and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, int):
            return keyword.value.value
    return None


def _is_app_code(obj: Any) -> bool:
    return getattr(obj, "__module__", "").startswith("app.") and (inspect.isfunction(obj) or inspect.isclass(obj))


def _return_class(func: Any) -> type | None:
    try:
        hint = typing.get_type_hints(func).get("return")
    except Exception:
        return None
    return hint if inspect.isclass(hint) and _is_app_code(hint) else None


def literal_statuses(func: Callable[..., Any], owner: type | None = None, seen: set[Any] | None = None) -> set[int]:
    """The statuses written as literals in `func` and, recursively, in the app functions it calls by
    name (`owned_state(...)`), as a module attribute, on `self`, or on what an app function returns
    (`_module().rename(...)`: a method of the class its return annotation names)."""
    seen = set() if seen is None else seen
    func = inspect.unwrap(func)
    if func in seen or not isinstance(func, types.FunctionType):
        return set()
    seen.add(func)
    (definition,) = ast.parse(textwrap.dedent(inspect.getsource(func))).body
    assert isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef)
    namespace = {**func.__globals__, **_closure(func)}
    statuses: set[int] = set()
    # The body only: the decorators (document_response(..., 202)) are what is being checked.
    for node in (child for statement in definition.body for child in ast.walk(statement)):
        if not isinstance(node, ast.Call):
            continue
        callee, name = _resolve(node.func, namespace, owner)
        if name is not None and (status := _status_literal(node, name)) is not None:
            statuses.add(status)
        if callee is not None and _is_app_code(callee) and inspect.isfunction(callee):
            statuses |= literal_statuses(callee, _owner_of(callee, owner), seen)
    return statuses


def _closure(func: types.FunctionType) -> dict[str, Any]:
    names = func.__code__.co_freevars
    return {name: cell.cell_contents for name, cell in zip(names, func.__closure__ or (), strict=True)}


def _owner_of(func: Any, caller_owner: type | None) -> type | None:
    owner_name = func.__qualname__.rpartition(".")[0]
    module = inspect.getmodule(func)
    owner = getattr(module, owner_name, None) if owner_name else None
    return owner if inspect.isclass(owner) else caller_owner


def _resolve(node: ast.expr, namespace: dict[str, Any], owner: type | None) -> tuple[Any, str | None]:
    if isinstance(node, ast.Name):
        return namespace.get(node.id), node.id
    if isinstance(node, ast.Attribute):
        base: Any = None
        if isinstance(node.value, ast.Name):
            base = owner if node.value.id == "self" else namespace.get(node.value.id)
        elif isinstance(node.value, ast.Call):
            maker, _ = _resolve(node.value.func, namespace, owner)
            base = _return_class(maker) if maker is not None else None
        if base is not None and (inspect.ismodule(base) or inspect.isclass(base)):
            return getattr(base, node.attr, None), node.attr
        return None, node.attr
    return None, None


# --- the tests -------------------------------------------------------------------------------------------


def test_every_route_is_an_operation_and_every_operation_a_route(app: Quart, document: dict[str, Any]) -> None:
    served = {(method, path) for method, path, _, _ in routes(app)}
    assert served == set(operations(document)), "routes and documented operations differ"
    assert served == set(EXPECTED), "a route is missing from (or unknown to) this test's table"


def test_each_operation_documents_exactly_its_statuses(document: dict[str, Any]) -> None:
    wrong = {
        f"{method} {path}": {"documented": sorted(documented(operation)), "expected": sorted(EXPECTED[method, path])}
        for (method, path), operation in operations(document).items()
        if documented(operation) != EXPECTED[method, path]
    }
    assert wrong == {}


def test_every_status_a_handler_answers_is_documented(app: Quart, document: dict[str, Any]) -> None:
    ops = operations(document)
    undocumented = {}
    for method, path, _, view in routes(app):
        missing = literal_statuses(view) - documented(ops[method, path])
        if missing:
            undocumented[f"{method} {path}"] = sorted(missing)
    assert undocumented == {}


def test_the_source_scan_sees_through_helpers(app: Quart) -> None:
    """The scan follows owned_state, the calendar service's methods, read_upload and the admin checks."""
    views = {(method, path): view for method, path, _, view in routes(app)}
    assert literal_statuses(views["GET", "/jobs/{job_id}/result"]) >= {401, 403, 404, 409, 410}
    assert literal_statuses(views["PATCH", "/calendars/{key}/events/{uid}"]) >= {401, 404, 422}
    assert literal_statuses(views["POST", "/calendars/{key}/import"]) >= {202, 404, 415, 422}
    assert literal_statuses(views["PATCH", "/admin/schedules/{name}"]) >= {403, 404, 422}
    assert literal_statuses(views["DELETE", "/calendars/{key}"]) >= {204, 404}


def test_security_401_and_431(app: Quart, document: dict[str, Any]) -> None:
    """Protected operations inherit the bearer requirement and list 401; public ones declare none."""
    assert document["security"] == [{"bearer": []}]
    ops = operations(document)
    for method, path, endpoint, _ in routes(app):
        operation = ops[method, path]
        assert 431 in documented(operation), (method, path)
        if endpoint in PUBLIC_ENDPOINTS:
            assert operation.get("security") == [], (method, path)
            assert 401 not in documented(operation), (method, path)
        else:
            assert operation.get("security", document["security"]) == [{"bearer": []}], (method, path)
            assert 401 in documented(operation), (method, path)
    assert ops["GET", "/health"]["security"] == []


def test_bodies_and_query_strings_document_their_refusals(document: dict[str, Any]) -> None:
    for (method, path), operation in operations(document).items():
        statuses = documented(operation)
        content = operation.get("requestBody", {}).get("content", {})
        if "application/json" in content:
            assert statuses >= JSON_BODY, (method, path)
            assert operation["requestBody"]["required"] is True, (method, path)
        if content:
            assert statuses >= {408, 413, 422}, (method, path)
        if any(parameter["in"] == "query" for parameter in operation.get("parameters", [])):
            assert 422 in statuses, (method, path)
        if method in ("POST", "PATCH", "PUT") and not content:
            no_body = ("/export", "/cancel", "/sync", "/reset", "/sync/external")
            assert method == "POST" and path.endswith(no_body), f"{method} {path} declares no body"


def test_error_responses_are_error_objects(document: dict[str, Any]) -> None:
    error_schema = document["components"]["schemas"]["ErrorOut"]
    assert error_schema["required"] == ["error", "message"]
    for (method, path), operation in operations(document).items():
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                assert response["content"] == {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}
                }, (method, path, status)
                assert response["description"], (method, path, status)


def test_deletes_answer_204_without_content(document: dict[str, Any]) -> None:
    ops = operations(document)
    for path in ("/calendars/{key}", "/calendars/{key}/events/{uid}"):
        assert "content" not in ops["DELETE", path]["responses"]["204"]


def test_the_result_is_a_file_whose_type_varies(document: dict[str, Any]) -> None:
    ok = operations(document)["GET", "/jobs/{job_id}/result"]["responses"]["200"]
    assert {"text/calendar", "*/*"} <= set(ok["content"])
    assert "application/json" not in ok["content"]
    assert {"Content-Length", "Content-Disposition"} <= set(ok["headers"])


def test_the_import_declares_its_raw_and_multipart_bodies(document: dict[str, Any]) -> None:
    body = operations(document)["POST", "/calendars/{key}/import"]["requestBody"]
    assert body["required"] is True
    assert {"text/calendar", "text/plain", "application/octet-stream", "multipart/form-data"} == set(body["content"])
    multipart = body["content"]["multipart/form-data"]["schema"]
    assert multipart["required"] == ["file"] and multipart["properties"]["file"]["format"] == "binary"


def test_both_schedule_endpoints_answer_the_same_view(document: dict[str, Any]) -> None:
    ops = operations(document)
    schemas = document["components"]["schemas"]
    listed = ops["GET", "/admin/schedules"]["responses"]["200"]["content"]["application/json"]["schema"]
    patched = ops["PATCH", "/admin/schedules/{name}"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert listed["properties"]["schedules"]["items"] == {"$ref": "#/components/schemas/ScheduleView"}
    view = schemas["ScheduleView"]
    assert {key: patched[key] for key in ("properties", "required")} == {
        key: view[key] for key in ("properties", "required")
    }
    assert "recent_skips" in view["required"]


def _nullable(schema: dict[str, Any]) -> bool:
    return {"type": "null"} in schema.get("anyOf", []) or schema.get("type") == "null"


def test_nullable_only_where_null_is_answered_or_accepted(document: dict[str, Any]) -> None:
    """Null where a handler answers null (or a body may send it), nowhere else."""
    schemas = document["components"]["schemas"]
    ops = operations(document)

    def body(method: str, path: str) -> dict[str, Any]:
        schema: dict[str, Any] = ops[method, path]["requestBody"]["content"]["application/json"]["schema"]
        return schema

    nullable = {
        "EventOut": {"description"},
        "JobPublic": {"payload", "result", "error", "progress"},
        "ProgressOut": {"message"},
        "WorkerOut": set(),
        "ScheduleView": {"override", "effective_cron", "disabled_reason", "last_run", "next_run"},
        "ScheduleOverrideOut": {"cron"},
        "ScheduleRunOut": set(),
        "ScheduleSkipOut": set(),
        "CalendarOut": set(),
        "ErrorOut": set(),
        "JobListItem": set(),
    }
    for name, fields in nullable.items():
        found = {field for field, schema in schemas[name]["properties"].items() if _nullable(schema)}
        assert found == fields, name
    requests = {
        ("PATCH", "/calendars/{key}/events/{uid}"): {"description"},  # null clears it
        ("POST", "/calendars/{key}/events"): {"description"},
        ("PATCH", "/admin/schedules/{name}"): {"cron"},  # null restores the declared cron
        ("POST", "/calendars"): set(),
        ("PATCH", "/calendars/{key}"): set(),
    }
    for (method, path), fields in requests.items():
        found = {field for field, schema in body(method, path)["properties"].items() if _nullable(schema)}
        assert found == fields, (method, path)


@pytest.mark.parametrize("multiline", [False, True], ids=["one-line", "multi-line"])
def test_the_documented_text_patterns_are_the_text_rules(document: dict[str, Any], multiline: bool) -> None:
    """The `pattern` the document gives names, summaries and descriptions accepts exactly what
    app/text.py accepts (lone surrogates aside: no portable pattern can name them)."""
    pattern = MULTI_LINE_PATTERN if multiline else SINGLE_LINE_PATTERN
    regex = re.compile(pattern)
    for code in (*range(0x3000), 0xFEFF, 0xFFFD, 0x1F600):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        assert (regex.fullmatch(char) is not None) == (text_problem(char, multiline=multiline) is None), hex(code)
    body = operations(document)["POST", "/calendars/{key}/events"]["requestBody"]["content"]["application/json"]
    properties = body["schema"]["properties"]
    assert properties["summary"]["pattern"] == SINGLE_LINE_PATTERN
    assert properties["description"]["anyOf"][0]["pattern"] == MULTI_LINE_PATTERN
