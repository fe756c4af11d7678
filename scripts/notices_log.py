"""A stand-in for a team's chat channel on this machine: a Slack-compatible incoming webhook whose messages (the
notices a run sends: a question waiting, a stop, the pause ahead, admission resumed, a back-out, a cut-over) are
appended to a file a person can ``tail -f`` (``make airflow``: ``.run/airflow/notices.log``). A deployment points the
``nexus_notify_conn_id`` Variable (or a run's ``notify_conn_id``) at its own Slack webhook or SMTP connection instead
(runbook, "Notifications")."""

from __future__ import annotations

import http.server
import json
import pathlib
import threading
import time

#: The connection the demo's runs notify through (a ``slackwebhook`` to this listener; the token is not a secret).
CONN_ID = "nexus_notify_demo"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            text = str(json.loads(body or b"{}").get("text") or "")
        except ValueError:
            text = body.decode(errors="replace")
        self.server.write(text)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:  # the file is the log
        pass


class NoticesLog(http.server.ThreadingHTTPServer):
    """An HTTP listener on 127.0.0.1 answering Slack's webhook reply and appending each message to ``path``."""

    daemon_threads = True

    def __init__(self, path: pathlib.Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.path = path
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
                                       name="notices-log")

    @property
    def port(self) -> int:
        return self.server_address[1]

    def connection(self) -> dict[str, str]:
        """The Airflow connection (REST fields) of a Slack webhook that is this listener."""
        return {"host": f"http://127.0.0.1:{self.port}", "password": "demo-webhook-token",
                "description": "the demo's notices: a local Slack-compatible webhook that writes notices.log"}

    def write(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(f"--- {stamp}\n{text.strip()}\n")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def is_alive(self) -> bool:
        return self.thread.is_alive()
