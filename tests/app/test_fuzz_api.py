"""Property-based fuzzing of the API against its own OpenAPI document (schemathesis).

Every operation in /openapi.json gets generated requests, valid and invalid (schemathesis's positive
and negative generation, in its coverage and fuzzing phases), sent to the app in-process over ASGI,
on real Redis and SQLite. Whatever the input, no response is a 5xx and every response conforms to
the document: a documented status, content type, body schema and headers, and a 405 with `Allow`
for a method the path does not declare. Once with tokens (the user's, an admin's, a stranger's),
path ids drawn from real resources as well as generated, so that handlers get past their 404s; once
without a token: every protected operation answers a conforming 401.

Deterministic and bounded: derandomized Hypothesis, a fixed schemathesis seed, AGENT_FUZZ_EXAMPLES
(25) examples per operation in the fuzzing phase. A failure is a bug to fix in app/ (or in the
document), with this test as its regression test; never to suppress here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from quart import Quart
from redis.asyncio import Redis
from schemathesis.checks import not_a_server_error
from schemathesis.core import NotSet
from schemathesis.python import asgi as schemathesis_asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from agent_async import JobStatus
from app.auth import TokenSigner
from app.factory import OPENAPI_PATH, create_app
from app.module.admin.requests import JobRequestCleanupLargeStore
from app.runtime import EXTENSION_KEY
from tests.app.conftest import SECRET, Api, ics_with_events, make_settings
from tests.app.test_export_import import add_event, new_calendar, start_import
from tests.conftest import REDIS_URL

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    # A 405 for a method the path does not declare, with the Allow header RFC 9110 requires.
    unsupported_method,
]
EXAMPLES = int(os.environ.get("AGENT_FUZZ_EXAMPLES", "25"))
SEED = 20240601
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
EVENT = {"summary": "Stand-up", "start": "2030-05-01T09:00:00Z", "end": "2030-05-01T09:15:00Z"}

# The import endpoint's raw ICS body: a generated string, sent as schemathesis sends text/plain.
schemathesis.serializer.alias("text/calendar", "text/plain")


def bearer(uid: str, *, admin: bool = False) -> str:
    return f"Bearer {TokenSigner(SECRET, max_age_s=3600).issue(uid, admin=admin)}"


@dataclass
class World:
    """What exists before fuzzing: the user's calendar and event, jobs of every kind, another user's
    calendar; and, once the fuzzed app is up, fresh calendars and events for the deletes to consume."""

    user: str
    key: str
    uid: str
    other_key: str
    jobs: dict[str, str]  # what GET /jobs/<id>/result meets -> the job's id
    app: Quart | None = None

    @property
    def tokens(self) -> list[str]:
        return [bearer(self.user), bearer("root", admin=True), bearer(f"stranger-{self.user}")]

    def fresh_event(self) -> dict[str, str]:
        """A new calendar of the user's with one event, created through the fuzzed app itself."""
        assert self.app is not None
        headers = {"Authorization": bearer(self.user)}
        with schemathesis_asgi.get_client(self.app) as client:
            created = client.post("/calendars", json={"name": "Doomed"}, headers=headers)
            assert created.status_code == 201, created.text
            key = created.json()["key"]
            added = client.post(f"/calendars/{key}/events", json=EVENT, headers=headers)
            assert added.status_code == 201, added.text
        return {"key": key, "uid": added.json()["uid"]}


async def _seed(database_url: str, namespace: str) -> World:
    """Create the world through the API, with an app instance of its own on the same Redis and database."""
    user, other = f"fuzz-{uuid.uuid4().hex[:8]}", f"fuzz-other-{uuid.uuid4().hex[:8]}"
    app = create_app(make_settings(database_url, namespace))
    async with app.test_app() as test_app:
        api = Api(app=app, client=test_app.test_client(), runtime=app.extensions[EXTENSION_KEY])

        async def export(uid: str, key: str) -> str:
            response = await api.client.post(f"/calendars/{key}/export", headers=api.headers(uid))
            assert response.status_code == 202, await response.get_data()
            job_id: str = (await response.get_json())["job_id"]
            return job_id

        key = await new_calendar(api, user)
        uid = (await add_event(api, user, key, **EVENT))["uid"]
        exported = await export(user, key)
        imported = await start_import(api, user, await new_calendar(api, user, "Imported"), ics_with_events(2))
        await api.drain()
        canceled = await export(user, key)
        assert (await api.client.post(f"/jobs/{canceled}/cancel", headers=api.headers(user))).status_code == 200
        # Left queued, so its result is a 409 (and so is the user's next export; imports stay open).
        pending = await export(user, key)
        other_key = await new_calendar(api, other)
        foreign = await export(other, other_key)
        jobs = {"large result": exported, "inline result": imported, "canceled": canceled, "pending": pending,
                "another user's": foreign}
        expected = {"large result": JobStatus.SUCCESS, "inline result": JobStatus.SUCCESS,
                    "canceled": JobStatus.CANCELED, "pending": JobStatus.PENDING, "another user's": JobStatus.PENDING}
        assert {name: (await api.state(job_id)).status for name, job_id in jobs.items()} == expected
    return World(user=user, key=key, uid=uid, other_key=other_key, jobs=jobs)


async def _forget(namespace: str) -> None:
    client = Redis.from_url(REDIS_URL)
    try:
        for pattern in (f"{namespace}:*", f"arq:*:{namespace}:*"):
            keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
            if keys:
                await client.delete(*keys)
        await client.zremrangebylex("arq:abort", f"[{namespace}:", f"[{namespace}:\xff")
    finally:
        await client.aclose()


def _load_document() -> dict[str, Any]:
    """The app's own /openapi.json, read in-process from an app that is never served (nothing connects)."""
    app = create_app(make_settings("sqlite+aiosqlite://", "openapi-document"))

    async def read() -> dict[str, Any]:
        document: dict[str, Any] = await (await app.test_client().get(OPENAPI_PATH)).get_json()
        return document

    return asyncio.run(read())


DOCUMENT = _load_document()
schema = schemathesis.openapi.from_dict(
    DOCUMENT,
    config=schemathesis.Config.from_dict({
        "seed": SEED,
        "generation": {"mode": "all", "max-examples": EXAMPLES, "deterministic": True},
    }),
)


@pytest.fixture(scope="module")
def fuzz_namespace() -> str:
    return f"t-fuzz-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def world(sqlite_url: str, fuzz_namespace: str) -> Iterator[World]:
    try:
        yield asyncio.run(_seed(sqlite_url, fuzz_namespace))
    finally:
        asyncio.run(_forget(fuzz_namespace))


@pytest.fixture(scope="module")
def served_app(world: World, sqlite_url: str, fuzz_namespace: str) -> Iterator[Quart]:
    """The app fuzzed (every case is sent with `app=served_app`): schemathesis's ASGI transport runs its
    lifespan (Redis, the SQL engine) in an event loop of its own, from the first request to
    shutdown_lifespans."""
    # With a metrics token, GET /metrics answers its 401s like every protected operation (unset, a 404).
    settings = dataclasses.replace(
        make_settings(sqlite_url, fuzz_namespace), metrics_token="fuzz-metrics-token-0123456789"
    )
    app = create_app(settings)
    world.app = app
    try:
        with schemathesis_asgi.get_client(app) as client:  # starts the lifespan
            assert client.get(OPENAPI_PATH).json() == DOCUMENT, "the fuzzed document is the served app's"
        yield app
    finally:
        schemathesis_asgi.shutdown_lifespans()


# The jobs of World.jobs that have ended (their event streams end too).
FINISHED_JOBS = {"large result", "inline result", "canceled"}


def _path_choices(world: World, case: schemathesis.Case) -> list[Callable[[], dict[str, Any]]]:
    """Ways to fill the case's path parameters: naming something that exists, or as generated."""
    generated = dict(case.path_parameters or {})
    names = set(generated)
    delete = case.operation.method.upper() == "DELETE"
    choices: list[Callable[[], dict[str, Any]]] = []
    if names == {"job_id"}:
        jobs = world.jobs
        if case.operation.path == "/jobs/{job_id}/events":
            # The stream of a job lasts until it ends, and no worker runs here: only finished jobs' streams end.
            jobs = {name: job_id for name, job_id in jobs.items() if name in FINISHED_JOBS}
        choices += [lambda job_id=job_id: {"job_id": job_id} for job_id in jobs.values()]
    elif names == {"name"}:
        choices.append(lambda: {"name": JobRequestCleanupLargeStore.name})
    elif names == {"key"}:
        # A delete gets a calendar of its own: deleting the shared one would starve every later case.
        choices.append((lambda: {"key": world.fresh_event()["key"]}) if delete else (lambda: {"key": world.key}))
        choices.append(lambda: {"key": world.other_key})
    elif names == {"key", "uid"}:
        choices.append(world.fresh_event if delete else (lambda: {"key": world.key, "uid": world.uid}))
        choices.append(lambda: {**generated, "key": world.key})
    return [*choices, lambda: generated]


def _pick(case: schemathesis.Case) -> int:
    """A number derived from the generated case: choices made with it are as deterministic as the case."""
    body = None if isinstance(case.body, NotSet) else case.body  # NotSet's repr holds its address
    return zlib.crc32(repr((case.operation.label, case.method, case.path_parameters, case.query, body)).encode())


def _undeclared_method(case: schemathesis.Case) -> bool:
    # The coverage phase also sends methods the path does not declare (TRACE, PUT...): 405 with Allow.
    return case.method.upper() != case.operation.method.upper()


# GET /admin/events follows every job's events and never ends by itself: with the admin token the
# in-process ASGI client would wait for its end forever. Its refusals (401 without a token, 403 for a
# non-admin, 422) are fuzzed by the token-less run and tested in tests/app/test_events_api.py.
@schema.exclude(path="/admin/events").parametrize()
@FUZZ_SETTINGS
def test_every_answer_conforms_to_the_document(case: schemathesis.Case, world: World, served_app: Quart) -> None:
    """With a token (the user's, an admin's, a stranger's), real and generated ids: no 5xx, all documented."""
    pick = _pick(case)
    if case.path_parameters:
        choices = _path_choices(world, case)
        case.path_parameters = choices[pick % len(choices)]()
    case.call_and_validate(app=served_app, headers={"Authorization": world.tokens[pick // 7 % 3]}, checks=CHECKS)


@schema.parametrize()
@FUZZ_SETTINGS
def test_without_a_token_every_protected_operation_is_a_conforming_401(
    case: schemathesis.Case, served_app: Quart
) -> None:
    """Whatever Authorization header schemathesis generates (none, empty, garbage), it is never a valid
    token: every protected operation answers 401, with a body and headers as documented."""
    response = case.call_and_validate(app=served_app, checks=CHECKS)
    if case.operation.path == "/health" or _undeclared_method(case):
        return
    assert response.status_code == 401, (response.status_code, case.headers, response.text[:200])
    assert response.headers["www-authenticate"][0].startswith("Bearer")
