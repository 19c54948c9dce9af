"""The /admin/ui dashboard through the app's test client on real Redis: sign-in and cookie flags, roles
(a viewer's POST is 403), CSRF and same-origin refusals, security headers, every page and action, 404s,
redaction, and the indexes the jobs list is paged from."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from itsdangerous.encoding import base64_decode, base64_encode
from quart import Quart
from quart.typing import TestClientProtocol as DashClient
from redis.asyncio import Redis

from agent_async import Job, JobRequest, JobStatus, agent_job
from agent_async.registry import JobRegistry
from agent_async.store.scripts import PRUNE_EVERY
from app.dashboard.security import CSP
from app.dashboard.session import COOKIE_NAME, DashboardRole, DashboardSigner, SignInError
from app.factory import create_app
from app.runtime import EXTENSION_KEY, AppRuntime
from tests.app.conftest import SECRET, make_settings

pytestmark = pytest.mark.timeout(60)

SECRET_JOB = "tests.dash.secret"
OTHER_JOB = "tests.dash.other"
API_KEY = "sk-live-do-not-show-0123456789"
PAGES = ["/admin/ui/", "/admin/ui/jobs", "/admin/ui/schedules", "/admin/ui/runs", "/admin/ui/guards",
         "/admin/ui/workers"]


def declare_jobs() -> None:
    @dataclass
    class Secret(JobRequest):
        name: ClassVar[str] = SECRET_JOB
        text: str = ""
        api_key: str = ""
        fail: bool = False

    @agent_job
    class SecretJob(Job[Secret]):
        request_class = Secret

        def public_payload(self, payload: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in payload.items() if k != "api_key"}

        async def process(self, request: Secret, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            if request.fail:
                raise RuntimeError("failed on purpose")
            return {"text": request.text}

    @dataclass
    class Other(JobRequest):
        name: ClassVar[str] = OTHER_JOB

    @agent_job
    class OtherJob(Job[Other]):
        request_class = Other

        async def process(self, request: Other, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}


@dataclass
class Dash:
    app: Quart
    runtime: AppRuntime

    def client(self) -> DashClient:
        return self.app.test_client()

    async def signed_in(self, role: DashboardRole, uid: str = "ops-alice") -> tuple[DashClient, str]:
        """A client holding a session cookie, and the session's CSRF token (read from a page)."""
        client = self.client()
        response = await client.post("/admin/ui/login", form={"token": sign_in_token(uid, role)})
        assert response.status_code == 303, await response.get_data(as_text=True)
        page = await client.get("/admin/ui/jobs")
        return client, csrf_of(await page.get_data(as_text=True))

    async def enqueue(self, name: str = SECRET_JOB, user: str = "u1", **payload: Any) -> str:
        return await self.runtime.client.enqueue_named(name, payload, user)

    async def drain(self) -> None:
        # No cron ticks: a drain that ran across a 5-minute boundary queued the sweep schedule's run
        # into the listings under test.
        await self.runtime.agent.run_worker(burst=True, poll_delay=0, handle_signals=False, cron_jobs=[])

    async def status(self, job_id: str) -> JobStatus:
        state = await self.runtime.client.get_state(job_id)
        assert state is not None
        return state.status


def sign_in_token(uid: str, role: DashboardRole) -> str:
    return DashboardSigner(SECRET, token_max_age_s=60, session_max_age_s=60).issue_sign_in(uid, role)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


@pytest.fixture
async def dash(sqlite_url: str, namespace: str, redis: Redis, job_registry: JobRegistry) -> AsyncIterator[Dash]:
    declare_jobs()
    app = create_app(make_settings(sqlite_url, namespace))
    async with app.test_app():
        yield Dash(app=app, runtime=app.extensions[EXTENSION_KEY])


# -- access ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [*PAGES, "/admin/ui/jobs/x", "/admin/ui/bulk?action=retry_failed&job=x"])
async def test_a_page_without_a_session_redirects_to_the_sign_in(dash: Dash, path: str) -> None:
    response = await dash.client().get(path)
    assert response.status_code == 303
    assert response.headers["Location"] == "/admin/ui/login"


async def test_a_post_without_a_session_changes_nothing(dash: Dash) -> None:
    job_id = await dash.enqueue()
    response = await dash.client().post(f"/admin/ui/jobs/{job_id}/cancel", form={"csrf_token": "x"})
    assert response.status_code == 303
    assert await dash.status(job_id) is JobStatus.PENDING


async def test_the_events_stream_without_a_session_is_401(dash: Dash) -> None:
    response = await dash.client().get("/admin/ui/events")
    assert response.status_code == 401


async def test_sign_in_sets_a_strict_httponly_expiring_cookie_on_the_dashboard_path(dash: Dash) -> None:
    form = await dash.client().get("/admin/ui/login")
    assert form.status_code == 200 and 'name="token"' in await form.get_data(as_text=True)
    response = await dash.client().post(
        "/admin/ui/login", form={"token": sign_in_token("alice", DashboardRole.VIEWER)}
    )
    assert response.status_code == 303 and response.headers["Location"] == "/admin/ui/"
    cookie = response.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/admin/ui" in cookie
    assert "Max-Age=" in cookie and "Expires=" in cookie
    assert "Secure" not in cookie  # plain http: a Secure cookie would never come back


async def test_the_cookie_is_secure_over_https(dash: Dash) -> None:
    response = await dash.client().post(
        "/admin/ui/login", form={"token": sign_in_token("alice", DashboardRole.VIEWER)}, scheme="https"
    )
    assert response.status_code == 303
    assert "Secure" in response.headers["Set-Cookie"]


@pytest.mark.parametrize(
    "token",
    [
        "", "not-a-token",
        # An API bearer token is signed with the same key but another salt: not a sign-in token.
        "api",
        # Signed with another key.
        DashboardSigner("another-secret-0123456789", token_max_age_s=60, session_max_age_s=60)
        .issue_sign_in("alice", DashboardRole.OPERATOR),
    ],
)
async def test_a_bad_sign_in_token_is_refused_with_no_cookie(dash: Dash, token: str) -> None:
    if token == "api":
        from app.auth import TokenSigner

        token = TokenSigner(SECRET, max_age_s=60).issue("alice", admin=True)
    response = await dash.client().post("/admin/ui/login", form={"token": token})
    assert response.status_code == 401
    assert "Set-Cookie" not in response.headers
    assert "not valid or has expired" in await response.get_data(as_text=True)


async def test_an_expired_sign_in_token_or_session_is_refused() -> None:
    signer = DashboardSigner(SECRET, token_max_age_s=1, session_max_age_s=1)
    token = signer.issue_sign_in("alice", DashboardRole.OPERATOR)
    _, cookie = signer.exchange(token)
    assert signer.session(cookie) is not None
    await asyncio.sleep(2.1)  # itsdangerous counts whole seconds: 2 s is past a 1 s limit
    with pytest.raises(SignInError, match="not valid or has expired"):
        signer.exchange(token)
    assert signer.session(cookie) is None


async def test_a_tampered_or_role_edited_session_cookie_is_no_session(dash: Dash) -> None:
    login = await dash.client().post("/admin/ui/login", form={"token": sign_in_token("v", DashboardRole.VIEWER)})
    value = login.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    honest = dash.client()
    honest.set_cookie("localhost", COOKIE_NAME, value, path="/admin/ui")
    assert (await honest.get("/admin/ui/")).status_code == 200
    payload, _, signed = value.partition(".")
    # The role is inside the signed payload: promoting oneself to operator breaks the signature.
    data = json.loads(base64_decode(payload))
    assert data["role"] == "viewer"
    promoted = base64_encode(json.dumps({**data, "role": "operator"}).encode()).decode()
    for forged_value in (value[:-2] + ("AA" if not value.endswith("AA") else "BB"), f"{promoted}.{signed}"):
        forged = dash.client()
        forged.set_cookie("localhost", COOKIE_NAME, forged_value, path="/admin/ui")
        assert (await forged.get("/admin/ui/")).status_code == 303


async def test_sign_out_clears_the_cookie(dash: Dash) -> None:
    client, csrf = await dash.signed_in(DashboardRole.VIEWER)
    response = await client.post("/admin/ui/logout", form={"csrf_token": csrf})
    assert response.status_code == 303 and response.headers["Location"].startswith("/admin/ui/login")
    assert f"{COOKIE_NAME}=;" in response.headers["Set-Cookie"]
    assert (await client.get("/admin/ui/")).status_code == 303


# -- headers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [*PAGES, "/admin/ui/login"])
async def test_every_page_sends_the_security_headers_and_no_inline_script_or_style(dash: Dash, path: str) -> None:
    client, _ = await dash.signed_in(DashboardRole.OPERATOR)
    response = await client.get(path)
    assert response.status_code == 200
    assert response.headers["Content-Security-Policy"] == CSP
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert response.headers["Cache-Control"] == "no-store"
    html = await response.get_data(as_text=True)
    assert not re.search(r"<script(?![^>]*\ssrc=)", html), "an inline script"
    assert not re.search(r"<style|\sstyle=", html), "inline style"
    assert not re.search(r"\son[a-z]+=", html), "an inline event handler"
    assert "//cdn" not in html and "https://" not in html  # nothing fetched from elsewhere


async def test_static_files_are_served_by_the_blueprint(dash: Dash) -> None:
    client = dash.client()
    for name, kind in (("live.js", "javascript"), ("dashboard.css", "text/css")):
        response = await client.get(f"/admin/ui/static/{name}")
        assert response.status_code == 200 and kind in response.headers["Content-Type"]
        assert response.headers["Content-Security-Policy"] == CSP


# -- roles and CSRF ----------------------------------------------------------------------------


async def test_a_viewer_sees_every_page_and_no_action(dash: Dash) -> None:
    job_id = await dash.enqueue(text="hello")
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    for path in [*PAGES, f"/admin/ui/jobs/{job_id}"]:
        response = await client.get(path)
        assert response.status_code == 200, path
        html = await response.get_data(as_text=True)
        forms = re.findall(r'<form method="post" action="([^"]+)"', html)
        assert forms == ["/admin/ui/logout"], (path, forms)
    assert "Cancel all queued" not in await (await client.get(f"/admin/ui/jobs?job={SECRET_JOB}")).get_data(
        as_text=True
    )


async def test_an_operator_sees_the_actions(dash: Dash) -> None:
    job_id = await dash.enqueue()
    client, _ = await dash.signed_in(DashboardRole.OPERATOR)
    html = await (await client.get(f"/admin/ui/jobs/{job_id}")).get_data(as_text=True)
    assert f'action="/admin/ui/jobs/{job_id}/cancel"' in html
    html = await (await client.get("/admin/ui/schedules")).get_data(as_text=True)
    assert "Disable" in html and 'name="cron"' in html


async def test_every_action_is_403_for_a_viewer_even_with_its_csrf_token(dash: Dash) -> None:
    job_id = await dash.enqueue()
    client, csrf = await dash.signed_in(DashboardRole.VIEWER)
    schedule = next(iter(dash.runtime.client.schedules.schedules()))
    for path, form in [
        (f"/admin/ui/jobs/{job_id}/cancel", {}),
        (f"/admin/ui/jobs/{job_id}/retry", {}),
        (f"/admin/ui/schedules/{schedule}", {"enabled": "false"}),
        (f"/admin/ui/runs/{uuid.uuid4().hex}/cancel", {}),
        ("/admin/ui/guards/ics:example.org/reset", {}),
        ("/admin/ui/bulk", {"action": "cancel_queued", "job": SECRET_JOB}),
    ]:
        response = await client.post(path, form={"csrf_token": csrf, **form})
        assert response.status_code == 403, path
        assert "viewer cannot change anything" in await response.get_data(as_text=True)
    assert await dash.status(job_id) is JobStatus.PENDING
    view = await dash.runtime.client.schedules.view(schedule)
    assert view is not None and view.override is None


@pytest.mark.parametrize(
    ("form", "headers"),
    [
        ({}, {}),  # no token
        ({"csrf_token": "forged"}, {}),
        ("valid", {"Sec-Fetch-Site": "cross-site"}),
        ("valid", {"Sec-Fetch-Site": "same-site"}),
        ("valid", {"Origin": "https://evil.example"}),
        ("valid", {"Origin": "http://localhost", "Sec-Fetch-Site": "cross-site"}),
    ],
)
async def test_a_post_without_the_sessions_csrf_token_or_from_another_site_is_refused(
    dash: Dash, form: Any, headers: dict[str, str]
) -> None:
    job_id = await dash.enqueue()
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR)
    body = {"csrf_token": csrf} if form == "valid" else form
    response = await client.post(f"/admin/ui/jobs/{job_id}/cancel", form=body, headers=headers)
    assert response.status_code == 403
    assert await dash.status(job_id) is JobStatus.PENDING


async def test_the_csrf_token_of_another_session_is_refused(dash: Dash) -> None:
    job_id = await dash.enqueue()
    _, other_csrf = await dash.signed_in(DashboardRole.OPERATOR, uid="bob")
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR)
    assert other_csrf != csrf
    response = await client.post(f"/admin/ui/jobs/{job_id}/cancel", form={"csrf_token": other_csrf})
    assert response.status_code == 403


@pytest.mark.parametrize("origin", ["http://localhost", "null"])
async def test_the_csrf_token_may_come_as_a_header_from_the_same_origin(dash: Dash, origin: str) -> None:
    """`Origin: null` is what a browser sends from our own page under Referrer-Policy: no-referrer."""
    job_id = await dash.enqueue()
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR)
    response = await client.post(
        f"/admin/ui/jobs/{job_id}/cancel", headers={"X-CSRF-Token": csrf, "Sec-Fetch-Site": "same-origin",
                                                    "Origin": origin},
    )
    assert response.status_code == 303
    assert await dash.status(job_id) is JobStatus.CANCELED


# -- pages and actions -------------------------------------------------------------------------


async def test_job_pages_show_the_public_view_never_the_redacted_secret(dash: Dash) -> None:
    job_id = await dash.enqueue(text="visible-text", api_key=API_KEY)
    await dash.drain()
    client, _ = await dash.signed_in(DashboardRole.OPERATOR)
    for path in [*PAGES, f"/admin/ui/jobs/{job_id}", f"/admin/ui/jobs?job={SECRET_JOB}"]:
        html = await (await client.get(path)).get_data(as_text=True)
        assert API_KEY not in html, path
        assert SECRET not in html, path
    detail = await (await client.get(f"/admin/ui/jobs/{job_id}")).get_data(as_text=True)
    assert "visible-text" in detail and "SUCCESS" in detail
    assert 'data-event-id="' in detail  # the timeline from the event stream


async def test_unknown_things_are_404(dash: Dash) -> None:
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR)
    assert (await client.get("/admin/ui/jobs/nope")).status_code == 404
    assert (await client.get(f"/admin/ui/jobs/{'x' * 300}")).status_code == 404
    for path in ["/admin/ui/jobs/nope/cancel", "/admin/ui/jobs/nope/retry", "/admin/ui/schedules/nope",
                 f"/admin/ui/runs/{uuid.uuid4().hex}/cancel", "/admin/ui/runs/not-a-run-id/cancel",
                 "/admin/ui/guards/ics:nowhere.example/reset"]:
        response = await client.post(path, form={"csrf_token": csrf, "enabled": "false"})
        assert response.status_code == 404, path
        assert "text/html" in response.headers["Content-Type"]
    search = await client.get("/admin/ui/jobs?q=nope")
    assert search.status_code == 404 and "No job with id" in await search.get_data(as_text=True)


@pytest.mark.parametrize("query", ["status=DONE", "cursor=-1", "cursor=abc", "user=" + "u" * 300])
async def test_a_bad_filter_is_422_not_500(dash: Dash, query: str) -> None:
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    assert (await client.get(f"/admin/ui/jobs?{query}")).status_code == 422


async def test_cancel_then_retry_from_the_detail_page(dash: Dash) -> None:
    job_id = await dash.enqueue(text="again")
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR)
    response = await client.post(f"/admin/ui/jobs/{job_id}/cancel", form={"csrf_token": csrf})
    assert response.status_code == 303 and "notice=cancelled" in response.headers["Location"]
    assert await dash.status(job_id) is JobStatus.CANCELED
    page = await client.get(response.headers["Location"])
    assert "The job was cancelled." in await page.get_data(as_text=True)
    response = await client.post(f"/admin/ui/jobs/{job_id}/retry", form={"csrf_token": csrf})
    assert response.status_code == 303
    new_id = response.headers["Location"].split("/jobs/")[1].split("?")[0]
    state = await dash.runtime.client.get_state(new_id)
    assert state is not None and state.retry_of == job_id and state.status is JobStatus.PENDING
    # A job that has not failed cannot be retried: 409, nothing queued.
    again = await client.post(f"/admin/ui/jobs/{new_id}/retry", form={"csrf_token": csrf})
    assert again.status_code == 409


async def test_the_jobs_list_filters_pages_and_searches(dash: Dash) -> None:
    failed = [await dash.enqueue(fail=True, user="u2") for _ in range(3)]
    ok = [await dash.enqueue(text=str(n)) for n in range(4)]
    other = [await dash.enqueue(OTHER_JOB) for _ in range(2)]
    await dash.drain()
    queued = await dash.enqueue(OTHER_JOB)
    client, _ = await dash.signed_in(DashboardRole.VIEWER)

    def ids(html: str) -> set[str]:
        return set(re.findall(r'<tr data-job-id="([^"]+)"', html))

    async def page(query: str) -> str:
        response = await client.get(f"/admin/ui/jobs?{query}")
        assert response.status_code == 200, query
        return str(await response.get_data(as_text=True))

    assert ids(await page("")) == {*failed, *ok, *other, queued}
    assert ids(await page("status=FAILURE")) == set(failed)
    assert ids(await page(f"job={OTHER_JOB}")) == {*other, queued}
    assert ids(await page(f"job={OTHER_JOB}&status=PENDING")) == {queued}
    assert ids(await page(f"job={SECRET_JOB}&status=SUCCESS")) == set(ok)
    assert ids(await page("user=u2")) == set(failed)
    assert ids(await page("user=u2&status=SUCCESS")) == set()

    store = dash.runtime.client.listing
    first = await store.list_page(limit=4)
    assert len(first.states) == 4 and first.next_cursor == 4
    second = await store.list_page(limit=4, cursor=4)
    assert not {s.job_id for s in first.states} & {s.job_id for s in second.states}
    html = await page("cursor=8")
    assert len(ids(html)) == 2 and 'rel="next"' not in html

    response = await client.get(f"/admin/ui/jobs?q={ok[0]}")
    assert response.status_code == 303 and response.headers["Location"] == f"/admin/ui/jobs/{ok[0]}"


async def test_the_overview_counts_by_type_and_status(dash: Dash) -> None:
    for _ in range(2):
        await dash.enqueue(fail=True)
    await dash.enqueue(text="x")
    await dash.drain()
    await dash.enqueue(OTHER_JOB)
    counts = await dash.runtime.client.listing.overview_counts(since_ms=0)
    assert counts.ended == {(SECRET_JOB, JobStatus.FAILURE): 2, (SECRET_JOB, JobStatus.SUCCESS): 1}
    assert counts.active == {(OTHER_JOB, JobStatus.PENDING): 1} and counts.active_read == 1
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    html = await (await client.get("/admin/ui/")).get_data(as_text=True)
    assert re.search(rf'job={re.escape(SECRET_JOB)}&amp;status=FAILURE">2<', html)
    assert re.search(rf'job={re.escape(OTHER_JOB)}&amp;status=PENDING">1<', html)
    assert re.search(r'id="stat-failed">2<', html) and re.search(r'id="stat-finished">1<', html)


async def test_bulk_actions_ask_first_then_touch_only_that_job_type(dash: Dash) -> None:
    queued = [await dash.enqueue() for _ in range(3)]
    other = await dash.enqueue(OTHER_JOB)
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR)
    confirm = await client.get(f"/admin/ui/bulk?action=cancel_queued&job={SECRET_JOB}")
    assert confirm.status_code == 200
    assert "cancel</strong> 3 queued" in await confirm.get_data(as_text=True)
    assert [await dash.status(j) for j in queued] == [JobStatus.PENDING] * 3  # asking changed nothing
    done = await client.post("/admin/ui/bulk", form={"csrf_token": csrf, "action": "cancel_queued", "job": SECRET_JOB})
    assert done.status_code == 303
    assert [await dash.status(j) for j in queued] == [JobStatus.CANCELED] * 3
    assert await dash.status(other) is JobStatus.PENDING

    retry = await client.get(f"/admin/ui/bulk?action=retry_failed&job={SECRET_JOB}")
    assert "No failed" in await retry.get_data(as_text=True)
    bad = await client.get("/admin/ui/bulk?action=drop_all&job=x")
    assert bad.status_code == 422


async def test_bulk_retry_of_the_failed(dash: Dash) -> None:
    failed = [await dash.enqueue(fail=True) for _ in range(2)]
    await dash.drain()
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR)
    done = await client.post("/admin/ui/bulk", form={"csrf_token": csrf, "action": "retry_failed", "job": SECRET_JOB})
    assert done.status_code == 303
    page = await dash.runtime.client.list_page(status=JobStatus.PENDING, name=SECRET_JOB)
    assert sorted(s.retry_of or "" for s in page.states) == sorted(failed)


async def test_schedules_disable_and_edit_the_cron_with_the_parsers_reason_inline(dash: Dash) -> None:
    scheduler = dash.runtime.client.schedules
    name = sorted(scheduler.schedules())[0]
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR, uid="ops-carol")
    bad = await client.post(f"/admin/ui/schedules/{name}", form={"csrf_token": csrf, "cron": "61 * * * *"})
    assert bad.status_code == 422
    html = await bad.get_data(as_text=True)
    assert 'class="error cron-error"' in html and "Not saved:" in html
    assert 'value="61 * * * *"' in html  # what the operator typed stays in the field
    view = await scheduler.view(name)
    assert view is not None and view.override is None

    ok = await client.post(f"/admin/ui/schedules/{name}", form={"csrf_token": csrf, "cron": "*/7 * * * *"})
    assert ok.status_code == 303
    off = await client.post(f"/admin/ui/schedules/{name}", form={"csrf_token": csrf, "enabled": "false"})
    assert off.status_code == 303
    view = await scheduler.view(name)
    assert view is not None and not view.enabled and view.effective_cron == "*/7 * * * *"
    html = await (await client.get("/admin/ui/schedules")).get_data(as_text=True)
    section = html.split(f'id="schedule-{name}"')[1].split("</section>")[0]
    assert 'data-enabled="false"' in section and "ops-carol" in section  # the change log: who
    empty = await client.post(f"/admin/ui/schedules/{name}", form={"csrf_token": csrf})
    assert empty.status_code == 422


async def test_runs_list_and_cancel_a_running_run_records_cancelled(dash: Dash) -> None:
    from agent_async.runs import RunStatus, RunTrigger

    runs = dash.runtime.agent.runs
    job_id = await dash.enqueue()
    run_id = (await runs.start("tests.dash.kind", triggered_by=RunTrigger.MANUAL, user_uid="u1", job_id=job_id)).run_id
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR)
    html = await (await client.get("/admin/ui/runs")).get_data(as_text=True)
    assert f'data-run-id="{run_id}"' in html and "running" in html
    response = await client.post(f"/admin/ui/runs/{run_id}/cancel", form={"csrf_token": csrf})
    assert response.status_code == 303
    record = await runs.get(run_id)
    assert record is not None and record.status is RunStatus.CANCELLED
    assert await dash.status(job_id) is JobStatus.CANCELED
    again = await client.post(f"/admin/ui/runs/{run_id}/cancel", form={"csrf_token": csrf})
    assert again.status_code == 409


async def test_runs_filter_by_kind_and_the_older_link_keeps_the_filters(dash: Dash) -> None:
    """51 finished runs of one kind and one of another: a page of 50 of the kind asked for, and
    its "Older" link leads to the 51st under the same filters (not to the other kind's run)."""
    from agent_async.runs import RunStatus, RunTrigger

    runs = dash.runtime.agent.runs
    kind, other = f"tests.dash.{uuid.uuid4().hex[:8]}", f"tests.dash.{uuid.uuid4().hex[:8]}"
    ids = []
    for i in range(51):
        run = await runs.start(kind, triggered_by=RunTrigger.SCHEDULED)
        await runs.finish(run.run_id, RunStatus.PARTIAL, counters={"synced": i, "failed": 1})
        ids.append(run.run_id)
    stranger = (await runs.start(other, triggered_by=RunTrigger.SCHEDULED)).run_id
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    html = await (await client.get(f"/admin/ui/runs?kind={kind}&status=partial")).get_data(as_text=True)
    assert html.count("data-run-id=") == 50 and stranger not in html
    assert "failed 1 · synced 50" in html  # counters as words, newest first
    older = html.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    assert f"kind={kind}" in older and "status=partial" in older
    rest = await (await client.get(older)).get_data(as_text=True)
    assert rest.count("data-run-id=") == 1 and f'data-run-id="{ids[0]}"' in rest
    unfiltered = await (await client.get(f"/admin/ui/runs?kind={kind}")).get_data(as_text=True)
    link = unfiltered.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
    assert f"kind={kind}" in link and "status" not in link  # no filter that was not asked for
    assert (await client.get("/admin/ui/runs?kind=" + "k" * 201)).status_code == 422


async def test_guards_page_and_reset(dash: Dash) -> None:
    guard = dash.runtime.ics_guard
    name = "ics:down.example"
    for _ in range(dash.runtime.settings.ics_failure_threshold):
        try:
            async with guard.request(name):
                raise ConnectionError("down")
        except Exception:
            pass
    state = await guard.state(name)
    assert state.state.value == "open"
    client, csrf = await dash.signed_in(DashboardRole.OPERATOR)
    html = await (await client.get("/admin/ui/guards")).get_data(as_text=True)
    assert f'data-guard="{name}"' in html and "open" in html
    overview = await (await client.get("/admin/ui/")).get_data(as_text=True)
    assert name in overview  # an open guard is an alert
    response = await client.post(f"/admin/ui/guards/{name}/reset", form={"csrf_token": csrf})
    assert response.status_code == 303
    assert (await guard.state(name)).state.value == "closed"


async def test_workers_page_lists_a_live_worker(dash: Dash) -> None:
    from agent_async.testing import running_worker

    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    async with running_worker(dash.runtime.agent):
        for _ in range(100):
            html = await (await client.get("/admin/ui/workers")).get_data(as_text=True)
            if "No worker is alive" not in html:
                break
            await asyncio.sleep(0.05)
    assert "<code>" in html and "No worker is alive" not in html


# -- the CLI -----------------------------------------------------------------------------------


def test_the_cli_mints_a_sign_in_token_the_dashboard_accepts(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from app.__main__ import main

    monkeypatch.setenv("AGENT_SECRET_KEY", SECRET)
    assert main(["dashboard-token", "carol", "--role", "operator"]) == 0
    token = capsys.readouterr().out.strip()
    signer = DashboardSigner(SECRET, token_max_age_s=60, session_max_age_s=60)
    session, _ = signer.exchange(token)
    assert session.uid == "carol" and session.role is DashboardRole.OPERATOR
    assert main(["dashboard-token", "", "--role", "viewer"]) == 2
    with pytest.raises(SystemExit):
        main(["dashboard-token", "carol", "--role", "admin"])


async def test_the_dashboard_is_no_api_operation_and_the_api_still_needs_its_bearer_token(dash: Dash) -> None:
    document = await (await dash.client().get("/openapi.json")).get_json()
    assert not [path for path in document["paths"] if path.startswith("/admin/ui")]
    client, _ = await dash.signed_in(DashboardRole.OPERATOR)
    # The session cookie is scoped to /admin/ui and means nothing to the JSON API.
    assert (await client.get("/admin/schedules")).status_code == 401


async def test_the_job_type_and_status_indexes_stay_bounded_by_the_retention(
    sqlite_url: str, namespace: str, redis: Redis, job_registry: JobRegistry
) -> None:
    declare_jobs()
    app = create_app(make_settings(sqlite_url, namespace, state_retention_s=1))
    async with app.test_app():
        runtime: AppRuntime = app.extensions[EXTENSION_KEY]
        keys = runtime.agent.job_store.keys

        async def run(count: int) -> list[str]:
            ids = [await runtime.client.enqueue_named(OTHER_JOB, {}, "u1") for _ in range(count)]
            # No cron ticks: one run across a minute boundary would add a test schedule's run.
            await runtime.agent.run_worker(burst=True, poll_delay=0, handle_signals=False, cron_jobs=[])
            return ids

        # Both indexes are pruned at every PRUNE_EVERY-th end of a job type and status.
        old = await run(PRUNE_EVERY)
        assert set(await redis.zrange(keys.name_index(OTHER_JOB), 0, -1)) == {i.encode() for i in old}
        assert await redis.zcard(keys.status_index(JobStatus.SUCCESS.value)) == PRUNE_EVERY
        await asyncio.sleep(2.2)  # the states expire (1 s retention): their index entries are dead weight
        new = await run(PRUNE_EVERY)
        assert set(await redis.zrange(keys.name_index(OTHER_JOB), 0, -1)) == {i.encode() for i in new}
        assert set(await redis.zrange(keys.status_index(JobStatus.SUCCESS.value), 0, -1)) == {i.encode() for i in new}
        state = await runtime.client.get_state(new[-1])
        assert state is not None and state.finished_ms is not None
        bucket = keys.ended_counts(state.finished_ms // 3_600_000)
        assert 0 < await redis.ttl(bucket) <= 1 + 3600  # the hourly counters expire too


def test_the_timeline_keeps_every_transition_and_the_latest_of_each_run_of_progress() -> None:
    from agent_async import JobEvent
    from agent_async.store.events import EventType
    from app.dashboard.views import _timeline

    def event(n: int, kind: EventType, status: JobStatus, fraction: float | None = None) -> JobEvent:
        return JobEvent(event_id=f"{n}-0", type=kind, job_id="j", status=status, name="x", user_uid=None,
                        attempts=1, at_ms=n, fraction=fraction)

    events = [event(1, EventType.STATUS, JobStatus.PENDING), event(2, EventType.STATUS, JobStatus.STARTED),
              *(event(3 + n, EventType.PROGRESS, JobStatus.STARTED, n / 10) for n in range(10)),
              event(20, EventType.STATUS, JobStatus.RETRY), event(21, EventType.PROGRESS, JobStatus.STARTED, 0.5),
              event(22, EventType.STATUS, JobStatus.SUCCESS)]
    shown = _timeline(events)
    assert [(e["type"], e["status"], e["fraction"]) for e in shown] == [
        ("status", "PENDING", None), ("status", "STARTED", None), ("progress", "STARTED", 0.9),
        ("status", "RETRY", None), ("progress", "STARTED", 0.5), ("status", "SUCCESS", None),
    ]


async def test_a_group_childs_page_shows_its_group_and_links_its_finalizer(dash: Dash) -> None:
    from agent_async.groups import GroupFinalizer

    @dataclass
    class Final(GroupFinalizer):
        name: ClassVar[str] = "tests.dash.final"

    @agent_job
    class FinalJob(Job[Final]):
        request_class = Final

        async def process(self, request: Final, *, user_uid: str | None, job_id: str) -> dict[str, Any]:
            return {}

    registry = dash.runtime.agent.registry
    children = [registry.request(OTHER_JOB).from_payload({}) for _ in range(2)]  # type: ignore[union-attr]
    group_id = await dash.runtime.client.enqueue_group(children, Final(), user_uid="u1")
    await dash.drain()
    page = await dash.runtime.client.list_page(name=OTHER_JOB)
    child = page.states[0].job_id
    assert await dash.runtime.client.listing.group_id_of(child) == group_id
    group = await dash.runtime.client.get_group(group_id)
    assert group is not None
    client, _ = await dash.signed_in(DashboardRole.VIEWER)
    html = await (await client.get(f"/admin/ui/jobs/{child}")).get_data(as_text=True)
    assert f"<code>{group_id}</code>" in html and "2 succeeded" in html
    assert f'href="/admin/ui/jobs/{group.finalizer_job_id}">finalizer<' in html
    assert await dash.runtime.client.listing.group_id_of(group.finalizer_job_id) is None
