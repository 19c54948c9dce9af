"""The dashboard in a real headless Chromium (Debian's `chromium` + `chromium-driver`, driven by Selenium)
against real processes: the API served by `python -m app api` and a worker `python -m app worker`, on
real Redis and a migrated SQLite database. Each page is saved as a screenshot in artifacts/screenshots/.

Skipped only when /usr/bin/chromium is missing and CI is not set; under CI=true a missing browser fails."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.auth import TokenSigner
from app.dashboard.session import DashboardRole, DashboardSigner
from tests.app.conftest import ROOT, SECRET
from tests.conftest import REDIS_URL

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = ROOT / "artifacts" / "screenshots"

if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"CI needs {CHROMIUM} and {CHROMEDRIVER}: .ci/run installs chromium and chromium-driver")
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium chromium-driver)", allow_module_level=True)

from selenium import webdriver  # noqa: E402 (only once the browser is known to be there)
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

WAIT_S = 20.0
# What chromedriver says of an element a live update detached from the page after it was found.
_DETACHED = "does not belong to the document"
# tests/app/test_dashboard_jobs/jobs/steps.py, imported by the API and worker processes only.
STEPS = "tests.dashboard.steps"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Stack:
    """The API and a worker as processes of their own, in this test's namespace."""

    env: dict[str, str]
    port: int
    logs: Path
    api: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None
    _opened: list[Any] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{args[0]}-{len(self._opened)}.log").open("wb")
        self._opened.append(log)
        return subprocess.Popen(
            [sys.executable, "-m", "app", *args], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )

    def start_api(self) -> None:
        self.api = self._spawn("api", "--host", "127.0.0.1", "--port", str(self.port))
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if self.api.poll() is not None:
                raise AssertionError(f"the API exited: {self.log_tail()}")
            try:
                if httpx.get(f"{self.base}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError(f"the API did not start: {self.log_tail()}")

    def kill_api(self) -> None:
        assert self.api is not None
        self.api.send_signal(signal.SIGKILL)
        self.api.wait(10)

    def start_worker(self) -> None:
        self.worker = self._spawn("worker")

    def stop(self) -> None:
        for process in (self.api, self.worker):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (self.api, self.worker):
            if process is not None:
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
        for log in self._opened:
            log.close()

    def log_tail(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.logs.glob("*.log")))

    def bearer(self, uid: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {TokenSigner(SECRET, max_age_s=300).issue(uid)}"}


@pytest.fixture
def stack(sqlite_url: str) -> Iterator[Stack]:
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "AGENT_SECRET_KEY": SECRET,
        "AGENT_NAMESPACE": namespace,
        "AGENT_REDIS_URL": REDIS_URL,
        "AGENT_DATABASE_URL": sqlite_url,
        "AGENT_JOB_PACKAGES": "app.module,tests.app.test_dashboard_jobs",
        "AGENT_POLL_DELAY_SECONDS": "0.05",
        "AGENT_CANCEL_GRACE_SECONDS": "0.5",
        # Stopping the worker at the end must not wait for a long job the test left running.
        "AGENT_SHUTDOWN_DRAIN_SECONDS": "0.5",
        "PYTHONPATH": str(ROOT),
    }
    logs = Path(tempfile.mkdtemp(prefix="dash-logs-"))
    stack = Stack(env=env, port=_free_port(), logs=logs)
    stack.start_api()
    stack.start_worker()
    try:
        yield stack
    finally:
        stack.stop()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
        shutil.rmtree(logs, ignore_errors=True)


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    profile = tempfile.mkdtemp(prefix="dash-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Without the background-networking flags Chromium misbehaves on a machine with no outside network.
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_until(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (StaleElementReferenceException, NoSuchElementException, AssertionError) as exc:
            # NoSuchElement: the page is between two loads (a form's POST, then its redirect).
            last = exc
        except WebDriverException as exc:
            # A live update replaced the element between its lookup and its read: chromedriver
            # reports that as an "unknown error" from the inspector, not as a stale element.
            if _DETACHED not in str(exc):
                raise
            last = exc
        time.sleep(0.05)
    raise TimeoutException(f"timed out waiting for {what}" + (f" ({last})" if last else ""))


def sign_in(browser: WebDriver, stack: Stack, role: DashboardRole, uid: str = "ops-alice") -> None:
    browser.delete_all_cookies()
    token = DashboardSigner(SECRET, token_max_age_s=300, session_max_age_s=3600).issue_sign_in(uid, role)
    browser.get(f"{stack.base}/admin/ui/login")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    try:
        wait_until(lambda: browser.current_url.rstrip("/").endswith("/admin/ui"), "the overview after sign-in")
    except TimeoutException:
        raise AssertionError(f"not signed in: at {browser.current_url}: {browser.page_source[:1500]}") from None


def live(browser: WebDriver) -> None:
    wait_until(lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-live") == "connected",
               "the live stream to connect")


def screenshot(browser: WebDriver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def row_status(browser: WebDriver, job_id: str) -> str:
    rows = browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{job_id}"] .status .badge')
    return rows[0].text if rows else ""


def in_stack(stack: Stack, body: str, *args: str) -> str:
    """Run `body` (async code with `rt`, the app's opened runtime, and `sys.argv`) in a process of the
    stack's own settings; returns what it printed last."""
    code = (
        "import asyncio, json, sys\n"
        "from app.factory import create_app\n"
        "from app.runtime import EXTENSION_KEY\n"
        "async def main():\n"
        "    rt = create_app().extensions[EXTENSION_KEY]\n"
        "    await rt.start_serving()\n"
        "    try:\n"
        + "".join(f"        {line}\n" for line in body.strip().splitlines())
        + "    finally:\n"
        "        await rt.stop_serving()\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=stack.env, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode().strip().splitlines()[-1] if done.stdout.strip() else ""


def enqueue_steps(stack: Stack, **payload: Any) -> str:
    """A Steps job queued in the stack's namespace by the library (the API has no generic enqueue)."""
    import json

    return in_stack(stack, f"print(await rt.client.enqueue_named({STEPS!r}, json.loads(sys.argv[1]), 'u-browser'))",
                    json.dumps(payload))


def seed_runs_and_guards(stack: Stack) -> None:
    """Run records (one running, one partial) and a connection in cooldown, for the pages' screenshots."""
    in_stack(stack, """
from agent_async.runs import RunStatus, RunTrigger
runs = rt.agent.runs
await runs.start("calendar.sync.external", triggered_by=RunTrigger.SCHEDULED)
done = await runs.start("calendar.sync.external", triggered_by=RunTrigger.MANUAL, user_uid="ops-alice")
await runs.finish(done.run_id, RunStatus.PARTIAL, counters={"fetched": 12, "failed": 2},
                  failed_ids=["cal-17", "cal-42"])
for _ in range(rt.settings.ics_failure_threshold):
    try:
        async with rt.ics_guard.request("ics:calendar.example.org"):
            raise ConnectionError("refused")
    except ConnectionError:
        pass
""")


def test_a_job_enqueued_through_the_api_appears_and_reaches_success_without_a_reload(
    driver: WebDriver, stack: Stack
) -> None:
    sign_in(driver, stack, DashboardRole.OPERATOR)
    driver.get(f"{stack.base}/admin/ui/jobs")
    live(driver)
    marker = driver.execute_script("window.__noReload = 1; return window.__noReload;")
    assert marker == 1
    headers = stack.bearer("u-api")
    key = httpx.post(f"{stack.base}/calendars", json={"name": "Team"}, headers=headers).json()["key"]
    response = httpx.post(f"{stack.base}/calendars/{key}/export", headers=headers)
    assert response.status_code == 202
    job_id = response.json()["job_id"]
    wait_until(lambda: row_status(driver, job_id) != "", "the new job's row")
    wait_until(lambda: row_status(driver, job_id) == "SUCCESS", "the row to reach SUCCESS")
    assert driver.execute_script("return window.__noReload;") == 1  # the same page: no reload happened
    screenshot(driver, "jobs")
    driver.get(f"{stack.base}/admin/ui/")
    screenshot(driver, "overview")


def test_the_progress_bar_moves_on_the_detail_page(driver: WebDriver, stack: Stack) -> None:
    sign_in(driver, stack, DashboardRole.VIEWER)
    job_id = enqueue_steps(stack, steps=10, pause_s=0.8)
    driver.get(f"{stack.base}/admin/ui/jobs/{job_id}")
    live(driver)

    def progress() -> float:
        return float(driver.find_element(By.ID, "job-progress").get_attribute("value") or 0)

    seen = {progress()}
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and driver.find_element(By.ID, "job-status").text != "SUCCESS":
        seen.add(progress())
        time.sleep(0.05)
    assert driver.find_element(By.ID, "job-status").text == "SUCCESS"
    intermediate = {v for v in seen if 0 < v < 1}
    assert len(intermediate) >= 2, f"the bar did not move step by step: {sorted(seen)}"
    assert progress() == 1
    # The page fetches itself once the job has ended: the result and end time appear.
    wait_until(lambda: "None yet" not in driver.find_element(By.TAG_NAME, "main").text, "the refreshed result")
    screenshot(driver, "job")


def test_cancel_a_running_job_from_its_detail_page(driver: WebDriver, stack: Stack) -> None:
    sign_in(driver, stack, DashboardRole.OPERATOR)
    job_id = enqueue_steps(stack, steps=100, pause_s=0.3)
    driver.get(f"{stack.base}/admin/ui/jobs/{job_id}")
    live(driver)
    wait_until(lambda: driver.find_element(By.ID, "job-status").text == "STARTED", "the job to start")
    driver.find_element(By.ID, "cancel-job").click()
    wait_until(lambda: driver.find_element(By.ID, "job-status").text == "CANCELED", "the job to be CANCELED")
    assert "cancel" in driver.find_element(By.CSS_SELECTOR, ".notice").text.lower()
    state = httpx.get(f"{stack.base}/jobs/{job_id}", headers=stack.bearer("u-browser")).json()
    assert state["status"] == "CANCELED"


def test_a_viewer_sees_no_action_buttons_and_a_forged_post_is_refused(driver: WebDriver, stack: Stack) -> None:
    job_id = enqueue_steps(stack, steps=100, pause_s=0.3)
    sign_in(driver, stack, DashboardRole.VIEWER, uid="viewer-vic")
    for path in ("/admin/ui/", "/admin/ui/jobs", f"/admin/ui/jobs/{job_id}", "/admin/ui/schedules",
                 "/admin/ui/runs", "/admin/ui/guards", "/admin/ui/workers"):
        driver.get(stack.base + path)
        actions = driver.find_elements(By.CSS_SELECTOR, "main form[method=post], main button.danger, #cancel-job")
        assert actions == [], path
    driver.get(f"{stack.base}/admin/ui/jobs/{job_id}")
    # The viewer's own page forges the POST an operator's button would send, CSRF token included.
    status = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const csrf = document.querySelector('input[name=csrf_token]').value;
        const body = new URLSearchParams({csrf_token: csrf});
        fetch(arguments[0], {method: 'POST', body: body, credentials: 'same-origin', redirect: 'manual'})
          .then(r => done(r.status)).catch(e => done(String(e)));
        """,
        f"/admin/ui/jobs/{job_id}/cancel",
    )
    assert status == 403
    state = httpx.get(f"{stack.base}/jobs/{job_id}", headers=stack.bearer("u-browser")).json()
    assert state["status"] != "CANCELED"
    screenshot(driver, "viewer-job")


def test_disable_a_schedule_and_see_it_disabled_after_a_reload(driver: WebDriver, stack: Stack) -> None:
    sign_in(driver, stack, DashboardRole.OPERATOR)
    driver.get(f"{stack.base}/admin/ui/schedules")
    section = driver.find_elements(By.CSS_SELECTOR, "section.schedule")[0]
    name = section.get_attribute("data-schedule")
    assert section.find_element(By.CSS_SELECTOR, "h2 .badge").get_attribute("data-enabled") == "true"
    screenshot(driver, "schedules")
    # A cron the parser refuses: the reason is shown next to the field, nothing saved.
    field_ = section.find_element(By.NAME, "cron")
    field_.clear()
    field_.send_keys("99 * * * *")
    section.find_element(By.CSS_SELECTOR, ".cron-form button").click()
    error = wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, ".cron-error"), "the cron error")
    assert "Not saved" in error[0].text
    screenshot(driver, "schedules-invalid-cron")
    driver.get(f"{stack.base}/admin/ui/schedules")
    driver.find_element(By.CSS_SELECTOR, f'section[data-schedule="{name}"] .toggle-schedule').click()
    wait_until(lambda: "schedule was saved" in driver.page_source, "the saved notice")
    driver.refresh()
    badge = driver.find_element(By.CSS_SELECTOR, f'section[data-schedule="{name}"] h2 .badge')
    assert badge.get_attribute("data-enabled") == "false" and badge.text == "disabled"
    seed_runs_and_guards(stack)
    for page in ("runs", "guards", "workers"):
        driver.get(f"{stack.base}/admin/ui/{page}")
        screenshot(driver, page)
    driver.get(f"{stack.base}/admin/ui/")
    assert "ics:calendar.example.org" in driver.find_element(By.CSS_SELECTOR, ".alerts").text
    screenshot(driver, "overview-alert")


def test_the_page_reconnects_after_the_api_is_killed_and_restarted_and_catches_up(
    driver: WebDriver, stack: Stack
) -> None:
    sign_in(driver, stack, DashboardRole.VIEWER)
    first = enqueue_steps(stack, steps=1, pause_s=0.1)
    driver.get(f"{stack.base}/admin/ui/jobs")
    live(driver)
    wait_until(lambda: row_status(driver, first) == "SUCCESS", "the first job to end")
    driver.execute_script("window.__noReload = 1;")
    stack.kill_api()
    wait_until(lambda: driver.find_element(By.ID, "live-banner").is_displayed(), "the disconnected banner")
    assert "retrying" in driver.find_element(By.ID, "live-banner").text.lower()
    screenshot(driver, "jobs-disconnected")
    # While the API is down the worker runs a job: its events wait in the Redis stream.
    missed = enqueue_steps(stack, steps=1, pause_s=0.1)
    stack.start_api()
    live(driver)
    wait_until(lambda: not driver.find_element(By.ID, "live-banner").is_displayed(), "the banner to go")
    try:
        wait_until(lambda: row_status(driver, missed) == "SUCCESS", "the missed job, caught up from Last-Event-ID")
    except TimeoutException:
        rows = driver.find_element(By.ID, "job-rows").get_attribute("outerHTML")
        raise AssertionError(f"{missed}: {rows} {stack.log_tail()}") from None
    assert driver.execute_script("return window.__noReload;") == 1


def test_pause_holds_the_live_updates_until_resumed(driver: WebDriver, stack: Stack) -> None:
    sign_in(driver, stack, DashboardRole.VIEWER)
    driver.get(f"{stack.base}/admin/ui/jobs")
    live(driver)
    toggle = driver.find_element(By.ID, "live-toggle")
    toggle.click()
    assert toggle.text == "Resume live"  # nothing held yet
    job_id = enqueue_steps(stack, steps=1, pause_s=0.1)

    def ended() -> bool:
        state = httpx.get(f"{stack.base}/jobs/{job_id}", headers=stack.bearer("u-browser")).json()
        return bool(state["status"] == "SUCCESS")

    wait_until(ended, "the job to end")
    # Its three events (queued, started, ended; progress too) reached the page and are held, not shown.
    wait_until(lambda: toggle.text.startswith("Resume live (") and int(toggle.text[13:-1]) >= 3, "held events")
    assert row_status(driver, job_id) == ""
    toggle.click()
    assert toggle.text == "Pause live"
    wait_until(lambda: row_status(driver, job_id) == "SUCCESS", "the held events to be applied")
