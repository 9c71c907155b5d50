"""The web console in a real browser (headless Chromium) on the real pipeline.

`jobwheel scheduler`, `jobwheel worker` and `jobwheel serve` (with an API token) run as
processes; Chromium logs in, looks at every page, opens a job from the jobs list and pauses it
with its button, as a user would. A screenshot of each page is saved in the test's temporary
directory, under ``screenshots/`` (the path is printed, and shown by pytest when the test
fails): ``01-login.png`` .. ``07-dead-letters.png``. Last, the dead run is replayed with its
button after its task is fixed, and ends SUCCEEDED.

Chromium and chromedriver are Debian's (``make setup`` installs them when root); Selenium only
talks WebDriver to the driver it is given, nothing is downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from jobwheel.producers import JobClient
from tests.stack_support import Stack, start_stack
from tests.support import Procs, scaled, wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
TOKEN = "browser-test-token-" + "7" * 24

pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="needs Debian's chromium and chromium-driver (make setup installs them as root)",
)


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(scaled(60))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def stack(settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path) -> Stack:
    return start_stack(settings, jobwheel_env, procs, tmp_path, token=TOKEN)


@pytest.mark.timeout(400)
def test_a_user_logs_in_looks_around_and_pauses_a_job_in_chromium(
    stack: Stack, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"console screenshots: {shots}")
    wait = WebDriverWait(browser, scaled(60), poll_frequency=0.2)

    def shot(name: str) -> None:
        assert browser.save_screenshot(str(shots / f"{name}.png")), name

    def text() -> str:
        return str(browser.find_element(By.TAG_NAME, "main").text)

    # something to look at: a finished job with a result, a recurring one, a dead one
    broken = stack.tmp / "broken"
    broken.touch()
    with JobClient(stack.settings) as client:
        done = client.schedule(task="demo.echo", args={"hello": "console"}, now=True)
        hourly = client.schedule(task="demo.echo", every=_hours(1))
        dead = client.schedule(
            task="test.switch", args={"fail_if": str(broken)}, now=True, max_attempts=1
        )
        assert client.wait(done, scaled(60)) == {"hello": "console"}
    stack.reaches(hourly, "SCHEDULED")
    stack.reaches(dead, "DEAD")

    # a page load without a session goes to the login form
    browser.get(stack.url + "/")
    wait.until(ec.presence_of_element_located((By.ID, "token")))
    assert "/console/login" in browser.current_url
    shot("01-login")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()

    # the overview: counts and both charts
    wait.until(ec.presence_of_element_located((By.ID, "chart-runs")))
    wait.until(lambda b: b.find_element(By.ID, "count-completed").text.startswith("1"))
    assert browser.find_element(By.ID, "count-dead").text.startswith("1")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-runs svg rect[data-series]")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-lateness svg polyline")
    shot("02-overview")

    # jobs list -> the recurring job's page
    browser.find_element(By.ID, "nav-jobs").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "table.jobs")))
    assert done in text() and hourly in text() and dead in text()
    shot("03-jobs")
    browser.find_element(By.ID, "tab-scheduled").click()
    wait.until(lambda b: "tab-scheduled" in b.current_url or "state=SCHEDULED" in b.current_url)
    browser.find_element(By.LINK_TEXT, hourly).click()
    wait.until(ec.presence_of_element_located((By.ID, "action-pause")))
    assert "SCHEDULED" in browser.find_element(By.TAG_NAME, "h1").text
    definition = browser.find_element(By.CSS_SELECTOR, "dl.facts").text
    assert "every 1h" in definition and "next fires" in definition  # its SCHEDULED event's
    shot("04-job")

    # pause: the button sends the command, waits for the scheduler's answer, reloads
    browser.find_element(By.ID, "action-pause").click()
    wait.until(ec.presence_of_element_located((By.ID, "action-resume")))
    assert "PAUSED" in browser.find_element(By.TAG_NAME, "h1").text
    assert stack.job(hourly)["state"] == "PAUSED"  # what the API (and the CLI) see too
    events = [e["state"] for e in stack.get(f"/jobs/{hourly}")["events"]]
    assert events[-1] == "PAUSED"
    shot("05-job-paused")

    # the finished job's page shows its run's result
    browser.get(stack.url + f"/console/jobs/{done}")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "code.result")))
    assert '{"hello": "console"}' in browser.find_element(By.CSS_SELECTOR, "code.result").text

    # workers and schedulers with their partitions
    browser.find_element(By.ID, "nav-cluster").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#schedulers table.members")))
    partitions = stack.settings.partitions
    owned = browser.find_elements(By.CSS_SELECTOR, "#schedulers table.members td:nth-child(3)")
    assert sorted(int(p) for cell in owned for p in cell.text.split(", ")) == list(
        range(partitions)
    )
    assert len(browser.find_elements(By.CSS_SELECTOR, "table.progress tbody tr")) == partitions
    assert browser.find_elements(By.CSS_SELECTOR, "#workers table.members td")
    shot("06-cluster")

    # the dead run is on the dead-letters page, with a replay button
    browser.find_element(By.ID, "nav-dead-letters").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "table.dead-letters")))
    wait_until(lambda: dead in text(), 30, message="the dead run is not listed")
    shot("07-dead-letters")

    # fix the task, replay the dead run with its button: the same run ends SUCCEEDED
    broken.unlink()
    browser.find_element(By.CSS_SELECTOR, "button.replay").click()
    wait.until(lambda b: "replayed" in b.find_element(By.ID, "flash").text)
    stack.reaches(dead, "COMPLETED")
    [run] = stack.get(f"/jobs/{dead}")["runs"]
    assert (run["state"], run["result"], run["attempts"]) == ("SUCCEEDED", "ok", 2)

    for name in ("01-login", "02-overview", "03-jobs", "04-job", "05-job-paused", "06-cluster"):
        assert (shots / f"{name}.png").stat().st_size > 5_000, name


def _hours(n: int) -> Any:
    from datetime import timedelta

    return timedelta(hours=n)
