"""A person's browser: headless Debian Chromium driven by Selenium through Debian's ChromeDriver.

What a delivery engineer does in the Airflow UI, as small verbs: log in, open a
DAG's trigger form, fill a field, pick an option, open a collapsed section,
click Trigger, read what the form says, answer a required action. Everything
goes through the page (clicks and keys), never through the REST API; the tests
use the REST API only to look at what the clicks did.

The window is 1600x1000, what a laptop shows. Chromium runs with a new empty
profile and the flags this machine's closed network needs (field notes).
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

WIDTH, HEIGHT = 1600, 1000
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--window-size={WIDTH},{HEIGHT}"]


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 60.0, every_s: float = 0.5) -> Any:
    """``check()``'s first truthy value; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception as exc:  # noqa: BLE001 - a page still rendering: look again
            last_error, value = exc, None
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}" +
                         (f" (last error: {last_error})" if last_error else ""))


class Person:
    """One browser, logged in to one Airflow."""

    def __init__(self, base_url: str, artifacts: pathlib.Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        for path in (CHROMIUM, CHROMEDRIVER):
            if not pathlib.Path(path).exists():
                raise RuntimeError(f"{path} is missing: scripts/bootstrap.sh installs chromium and chromium-driver")
        self.base_url = base_url
        self.artifacts = artifacts
        self.profile = tempfile.mkdtemp(prefix="nexus-ui-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in [*FLAGS, f"--user-data-dir={self.profile}"]:
            options.add_argument(flag)
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(120)

    # -- pages ------------------------------------------------------------------------------------------

    def open(self, path: str) -> None:
        self.driver.switch_to.default_content()
        self.driver.get(f"{self.base_url}{path}")

    def log_in(self, user: str, password: str) -> None:
        from selenium.webdriver.common.by import By

        self.open("/auth/login")
        fields = wait_until("the login form", lambda: self.driver.find_elements(By.CSS_SELECTOR, "input"))
        fields[0].send_keys(user)
        fields[1].send_keys(password)
        self.driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_until("the home page after login", lambda: "/auth/login" not in self.driver.current_url)

    def text(self) -> str:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.TAG_NAME, "body").text

    def button(self, label: str, within=None):
        """The visible button whose text is ``label`` (the last one: a dialog's sits after the page's)."""
        from selenium.webdriver.common.by import By

        scope = within or self.driver
        found = [b for b in scope.find_elements(By.TAG_NAME, "button") if b.text.strip() == label and b.is_displayed()]
        return found[-1] if found else None

    def click(self, label: str, within=None, timeout_s: float = 60.0) -> None:
        button = wait_until(f"a button {label!r}", lambda: self.button(label, within), timeout_s)
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
        button.click()

    def screenshot(self, name: str) -> pathlib.Path:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        path = self.artifacts / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    # -- the trigger form ------------------------------------------------------------------------------

    def open_trigger_form(self, dag_id: str):
        """The trigger dialog of ``dag_id``, opened with the DAG page's Trigger button."""
        from selenium.webdriver.common.by import By

        self.open(f"/dags/{dag_id}")
        self.click("Trigger")
        return wait_until("the trigger form", lambda: next(
            (d for d in self.driver.find_elements(By.CSS_SELECTOR, "[role=dialog]") if "Trigger Dag" in d.text), None))

    def field(self, form, name: str):
        from selenium.webdriver.common.by import By

        return wait_until(f"the form field {name}", lambda: form.find_element(By.NAME, f"element_{name}"))

    def type_into(self, form, name: str, value: str) -> None:
        from selenium.webdriver.common.keys import Keys

        element = self.field(form, name)
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
        element.send_keys(Keys.CONTROL, "a")
        element.send_keys(Keys.DELETE)
        element.send_keys(value)

    def choose(self, form, name: str, option: str) -> None:
        """Pick ``option`` in the select field ``name`` (a combobox: type it, then Enter)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        hidden = form.find_element(By.NAME, f"element_{name}")
        box = hidden.find_element(By.XPATH, "./ancestor::*[.//input[@type='text']][1]//input[@type='text']")
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
        box.click()
        box.send_keys(option)
        box.send_keys(Keys.ENTER)
        wait_until(f"{name} = {option}", lambda: option in hidden.get_attribute("value"))

    def options(self, form, name: str) -> list[str]:
        """The choices the select field ``name`` offers, as a person reads them. Escape closes the choices and the
        trigger dialog with them: open the form again to fill it."""
        import time

        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        hidden = form.find_element(By.NAME, f"element_{name}")
        box = hidden.find_element(By.XPATH, "./ancestor::*[.//input[@type='text']][1]//input[@type='text']")
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
        box.click()
        shown = wait_until(f"the choices of {name}", lambda: [o.text for o in self.driver.find_elements(
            By.CSS_SELECTOR, "[role=option]") if o.text] or None)
        box.send_keys(Keys.ESCAPE)
        time.sleep(0.3)
        return shown

    def open_section(self, form, title: str) -> None:
        self.click(title, within=form)

    def submit(self, form) -> None:
        trigger = wait_until("an enabled Trigger button", lambda: (b := self.button("Trigger", form)) and b.is_enabled() and b)
        trigger.click()

    # -- required actions ------------------------------------------------------------------------------

    def answer_required_action(self, run_id: str, option: str) -> None:
        """Browse -> Required Actions, open the one of ``run_id``, click ``option``."""
        from selenium.webdriver.common.by import By

        self.open("/required_actions")
        row = wait_until(f"the required action of run {run_id}", lambda: next(
            (r for r in self.driver.find_elements(By.CSS_SELECTOR, "tbody tr") if run_id in r.text), None), 120)
        self.screenshot(f"required_actions_{run_id}")
        row.find_element(By.CSS_SELECTOR, "a").click()  # the subject: the task's Required Action tab
        self.click(option, timeout_s=60)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)
