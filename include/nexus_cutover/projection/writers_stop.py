"""The writer-stop controller (issue 50, item 1): how step 3 stops the old writers, symmetric to the new host's.

Seed 000, step 3: "Stop every old writer, receipt materializer and worker, retaining the fence. The database cannot
prove that an old binary will never resume." The controller is the deployment's way to stop them:

* ``manual`` (the default): a person stops them, as before; nothing is run and nothing is recorded.
* ``command``: an argv of the deployment's configuration (``nexus-cutover run -writers-stop-command``, or
  ``NEXUS_WRITERS_STOP_COMMAND``; the DAG: the Airflow Variable ``nexus_writers_stop_command``), ``{tenant}``
  replaced by the namespace, e.g. scaling the old writers' deployment to zero and waiting for it. Its environment
  names the tenant (``NEXUS_TENANT``) and holds no DSN and no secret of its starter's
  (:func:`nexus_cutover.dsn.host_environment` without a DSN): stopping a deployment needs no tenant database.
* ``http``: one POST to a deployment API (``-writers-stop-url``, or ``NEXUS_WRITERS_STOP_URL``; the DAG: an HTTP
  connection), ``{tenant}`` replaced; its answer is checked: a 2xx whose JSON body, if any, does not say
  ``"ok": false``.

Invariants:

* It runs only with the tenant's cutover fence in force (after the drain): without one it refuses, nothing run.
* It is bounded (:data:`DEFAULT_TIMEOUT_S`, a setting): a command still running at its timeout is killed (its
  whole process group: SIGTERM, then SIGKILL) and reported; an HTTP call that does not answer in time is reported.
  A failure (an exit other than 0, a non-2xx or refusing answer, a timeout, a command that cannot start) stops the
  run with the fence held: nothing after it runs, no checkpoint is written.
* Its answer is evidence (:class:`WritersStopAnswer`): what it stopped (the old writers live before it that the
  registry no longer shows live after it, and what the deployment API says it stopped), when, its exit code or
  HTTP status and its output's tail (bounded, every secret of the tenant DSN hidden). It is shown to the person at
  the confirmation and written to the delivery ledger (``writers_stopped_by_controller``).
* It is never trusted alone: ``check_old_writers`` still waits until the registry shows every old writer stopped or
  silent, the confirmation is still a person's and is re-checked against the registry when it arrives, and the
  checkpoint's audit runs under the locks with the fence in force, as without a controller.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from .. import settings
from ..clock import utcnow
from ..dsn import MASK, hide_dsn_secrets, host_environment, is_secret_parameter
from ..errors import BadInput

MANUAL, COMMAND, HTTP = "manual", "command", "http"
CONTROLLERS = (MANUAL, COMMAND, HTTP)
#: The bound of one controller call (a setting: ``-writers-stop-controller-timeout``, the form's
#: ``writers_stop_controller_timeout``).
DEFAULT_TIMEOUT_S = 300.0
#: The most characters of a controller's output (or answer body) kept as evidence: its tail.
OUTPUT_KEPT_CHARS = 4000
#: After a timeout's SIGTERM, how long the process group has before SIGKILL.
KILL_GRACE_S = 5.0
#: The environment variable that names the tenant to the command.
TENANT_ENV = "NEXUS_TENANT"
#: The command line's deployment configuration, when its flags are not given.
COMMAND_ENV, URL_ENV = settings.BY_NAME["writers_stop_command"].alias, settings.BY_NAME["writers_stop_url"].alias


@dataclass(frozen=True)
class WritersStopController:
    """A configured controller: its kind, and the argv or URL the deployment gave it."""

    kind: str = MANUAL
    argv: tuple[str, ...] = ()
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def manual(self) -> bool:
        return self.kind == MANUAL

    def describe(self, tenant: str) -> str:
        """What it runs, for a person (no header value: they may hold a token)."""
        if self.kind == COMMAND:
            return "command " + " ".join(shlex.quote(a) for a in self.argv_for(tenant))
        if self.kind == HTTP:
            return f"POST {shown_url(self.url_for(tenant))}"
        return "a person (manual)"

    def argv_for(self, tenant: str) -> list[str]:
        return [a.replace("{tenant}", tenant) for a in self.argv]

    def url_for(self, tenant: str) -> str:
        return (self.url or "").replace("{tenant}", tenant)


def controller(kind: str | None, *, argv: Any = None, url: str | None = None,
               headers: Mapping[str, str] | None = None, timeout_s: float | None = None) -> WritersStopController:
    """A controller of ``kind`` with its configuration; bad input (an unknown kind, a command without an argv, an
    http controller without a URL, a timeout that is not positive) is refused here, before anything runs."""
    kind = (kind or MANUAL).strip().lower()
    if kind not in CONTROLLERS:
        raise BadInput(f"unknown writers_stop_controller {kind!r}: one of {', '.join(CONTROLLERS)}")
    timeout = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    if not timeout > 0:
        raise BadInput(f"the writer-stop controller's timeout must be positive, not {timeout_s!r}")
    if kind == COMMAND:
        words = shlex.split(argv) if isinstance(argv, str) else list(argv or ())
        if not words or not all(isinstance(a, str) and a for a in words):
            raise BadInput("writers_stop_controller command needs the deployment's command: -writers-stop-command "
                           f"(or {COMMAND_ENV}); in Airflow the Variable nexus_writers_stop_command, a JSON list")
        return WritersStopController(COMMAND, tuple(words), timeout_s=timeout)
    if kind == HTTP:
        if not url or not url.startswith(("http://", "https://")):
            raise BadInput(f"writers_stop_controller http needs the deployment API's URL (http:// or https://), not "
                           f"{shown_url(url or '')!r}: -writers-stop-url (or {URL_ENV}); in Airflow the HTTP "
                           "connection writers_stop_http_conn_id")
        url, auth = _without_credentials(url)
        return WritersStopController(HTTP, url=url, headers={**auth, **dict(headers or {})}, timeout_s=timeout)
    return WritersStopController(MANUAL, timeout_s=timeout)


@dataclass
class WritersStopAnswer:
    """What a controller did: evidence, never proof."""

    controller: str
    ran: str
    started_at: dt.datetime
    finished_at: dt.datetime
    ok: bool
    exit_code: int | None = None
    http_status: int | None = None
    timed_out: bool = False
    error: str | None = None
    output_tail: str = ""
    #: What the deployment API's answer says it stopped (its JSON ``stopped``), as it says it.
    reported_stopped: list[Any] = field(default_factory=list)
    #: Old writers live just before the call, and which of them the registry shows live just after.
    live_before: list[str] = field(default_factory=list)
    still_live: list[str] = field(default_factory=list)

    @property
    def stopped(self) -> list[str]:
        """The old writers live before it that the registry no longer shows live after it."""
        return [p for p in self.live_before if p not in self.still_live]

    @property
    def seconds(self) -> float:
        return round((self.finished_at - self.started_at).total_seconds(), 3)

    def failure(self) -> str | None:
        """Why it failed, in words (None: it succeeded)."""
        if self.ok:
            return None
        if self.timed_out and self.controller == HTTP:
            why = f"did not answer within its timeout ({self.seconds:g} s)"
        elif self.timed_out:
            why = f"did not finish within its timeout ({self.seconds:g} s) and was killed"
        elif self.error:
            why = self.error
        elif self.http_status is not None:
            why = f"answered HTTP {self.http_status}"
        else:
            why = f"exited with {self.exit_code}"
        tail = self.output_tail.strip()
        return f"the writer-stop controller ({self.ran}) {why}" + (f"; its output ends:\n{tail[-1000:]}" if tail else "")

    def as_json(self) -> dict[str, Any]:
        return {"controller": self.controller, "ran": self.ran, "ok": self.ok,
                "started_at": self.started_at.isoformat(), "finished_at": self.finished_at.isoformat(),
                "seconds": self.seconds, "exit_code": self.exit_code, "http_status": self.http_status,
                "timed_out": self.timed_out, "error": self.error, "output_tail": self.output_tail,
                "reported_stopped": self.reported_stopped, "live_before": self.live_before,
                "still_live": self.still_live, "stopped": self.stopped}


def answer_text(answer: Mapping[str, Any]) -> str:
    """The controller's answer as the person reads it beside the registry evidence (plain text)."""
    what = answer.get("exit_code") if answer.get("http_status") is None else f"HTTP {answer.get('http_status')}"
    lines = [f"Writer-stop controller {answer.get('controller')}: {answer.get('ran')}",
             f"  ran {answer.get('started_at')} to {answer.get('finished_at')} ({answer.get('seconds')} s), "
             f"answer {what}" + (" OK" if answer.get("ok") else " FAILED"),
             "  old writers live before it: " + (", ".join(answer.get("live_before") or []) or "none")
             + "; live after it: " + (", ".join(answer.get("still_live") or []) or "none")]
    if answer.get("reported_stopped"):
        lines.append("  it reports it stopped: " + ", ".join(str(s) for s in answer["reported_stopped"]))
    tail = str(answer.get("output_tail") or "").strip()
    if tail:
        lines.append("  its output ends:\n" + "\n".join("    " + line for line in tail[-1500:].splitlines()))
    lines.append("  (evidence only: the registry below, and your answer, decide)")
    return "\n".join(lines)


def answer_markdown(answer: Mapping[str, Any]) -> str:
    """The same for the question's page (markdown)."""
    return "### What the writer-stop controller did\n\n```\n" + answer_text(answer) + "\n```\n"


def _without_credentials(url: str) -> tuple[str, dict[str, str]]:
    """A URL's ``user:password@`` as a basic ``Authorization`` header, and the URL without it (never shown)."""

    parts = urlsplit(url)
    if parts.username is None:
        return url, {}
    token = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc)), {"Authorization": f"Basic {token}"}


def shown_url(url: str) -> str:
    """``url`` as a person, a log and the ledger may see it: a password and every query parameter named like a
    secret (a token, a key) as ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            netloc = netloc.replace(f":{parts.password}@", f":{MASK}@", 1)
        query = [(k, MASK if is_secret_parameter(k, v) else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*")))
    except ValueError:
        return "<malformed URL>"


# -- running it ---------------------------------------------------------------------------------------------------

def run_controller(c: WritersStopController, tenant: str, *, body: Mapping[str, Any] | None = None,
                   hide: str = "") -> WritersStopAnswer:
    """Run ``c`` once for ``tenant``, bounded by its timeout; never raises for the controller's own failure (the
    answer says it). ``body``: the JSON an http controller POSTs. ``hide``: a DSN whose secrets are hidden in the
    output kept."""
    if c.kind == COMMAND:
        answer = _run_command(c, tenant)
    elif c.kind == HTTP:
        answer = _call_http(c, tenant, dict(body or {"tenant": tenant}))
    else:
        raise BadInput("a manual writer stop runs nothing: a person stops the old writers")
    if hide:

        answer.output_tail = hide_dsn_secrets(answer.output_tail, hide)
    return answer


def _tail(data: bytes) -> str:
    return data[-OUTPUT_KEPT_CHARS:].decode("utf-8", errors="replace")


def _run_command(c: WritersStopController, tenant: str) -> WritersStopAnswer:
    argv = c.argv_for(tenant)
    env = {**host_environment(os.environ, ""), TENANT_ENV: tenant}  # no DSN, no secret of ours
    started = utcnow()
    ran = "command " + " ".join(shlex.quote(a) for a in argv)
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        except OSError as exc:
            return WritersStopAnswer(COMMAND, ran, started, utcnow(), ok=False,
                                     error=f"could not be started ({type(exc).__name__}: {exc.strerror or exc})")
        timed_out = False
        try:
            code = proc.wait(timeout=c.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _kill_group(proc)
        out.seek(0, os.SEEK_END)
        out.seek(max(0, out.tell() - OUTPUT_KEPT_CHARS))
        tail = _tail(out.read())
    return WritersStopAnswer(COMMAND, ran, started, utcnow(), ok=code == 0 and not timed_out, exit_code=code,
                             timed_out=timed_out, output_tail=tail)


def _kill_group(proc: subprocess.Popen) -> int | None:
    """A hung command's whole process group: SIGTERM, then SIGKILL after :data:`KILL_GRACE_S`; its exit code."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


def _call_http(c: WritersStopController, tenant: str, body: dict[str, Any]) -> WritersStopAnswer:
    url = c.url_for(tenant)
    ran = f"POST {shown_url(url)}"
    data = json.dumps(body, default=str).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **dict(c.headers)})
    started = utcnow()
    status, text, error, timed_out = None, "", None, False
    deadline = time.monotonic() + c.timeout_s
    try:
        with urllib.request.urlopen(request, timeout=c.timeout_s) as resp:  # noqa: S310 - the deployment's URL
            status, text = resp.status, _tail(resp.read(1_000_000))
    except urllib.error.HTTPError as exc:
        status, text = exc.code, _tail(exc.read(1_000_000) if exc.fp is not None else b"")
    except (TimeoutError, OSError) as exc:  # URLError is an OSError; a socket timeout a TimeoutError
        reason = getattr(exc, "reason", exc)
        timed_out = isinstance(reason, TimeoutError) or time.monotonic() >= deadline
        error = None if timed_out else f"could not be reached ({type(reason).__name__}: {shown_url(str(reason))})"
    said = _json_of(text)
    ok = status is not None and 200 <= status < 300 and not (isinstance(said, dict) and said.get("ok") is False)
    reported = said.get("stopped") if isinstance(said, dict) and isinstance(said.get("stopped"), list) else []
    if status is not None and 200 <= status < 300 and not ok:
        error = f"answered HTTP {status} with \"ok\": false"
    return WritersStopAnswer(HTTP, ran, started, utcnow(), ok=ok, http_status=status, timed_out=timed_out,
                             error=error, output_tail=text, reported_stopped=list(reported))


def _json_of(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return None
