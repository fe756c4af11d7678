"""Real receivers of the notifications: an SMTP server (aiosmtpd) and an HTTP listener standing in for a Slack
incoming webhook, both on loopback, each keeping what it received as the text a person reads."""

from __future__ import annotations

import email
import email.policy
import html
import http.server
import json
import re
import socket
import threading

SLACK_TOKEN = "T0NEXUS00/B0NEXUS00/notarealsecret0000000000"  # the webhook's secret: never in a message


def free_port() -> int:
    """A port nothing listens on now (aiosmtpd's controller connects to its port to start, so 0 will not do)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SmtpSink:
    """An aiosmtpd server on 127.0.0.1 (no auth, no TLS) that keeps every message and its recipients."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[email.message.EmailMessage] = []
        self.recipients: list[list[str]] = []
        self._lock = threading.Lock()
        self._controller = Controller(self, hostname="127.0.0.1", port=free_port())

    async def handle_DATA(self, server, session, envelope) -> str:  # aiosmtpd's handler hook
        msg = email.message_from_bytes(envelope.original_content or envelope.content, policy=email.policy.default)
        with self._lock:
            self.messages.append(msg)
            self.recipients.append(list(envelope.rcpt_tos))
        return "250 Message accepted for delivery"

    @property
    def port(self) -> int:
        return self._controller.port

    def connection_json(self) -> str:
        """An Airflow ``smtp`` connection to this server, plain SMTP, two recipients."""
        return json.dumps({
            "conn_type": "smtp", "host": "127.0.0.1", "port": self.port,
            "extra": {"to": "delivery@example.test, l2@example.test", "from_email": "airflow@example.test",
                      "disable_ssl": True, "disable_tls": True, "timeout": 5, "retry_limit": 0},
        })

    def rest_connection(self) -> dict:
        """The same connection as fields of Airflow's REST API (``AirflowStack.put_connection``)."""
        conn = json.loads(self.connection_json())
        return {**conn, "extra": json.dumps(conn["extra"])}

    def texts(self) -> list[str]:
        """Each message as ``subject\\nbody`` (the body's HTML ``<pre>`` unwrapped)."""
        with self._lock:
            messages = list(self.messages)
        out = []
        for msg in messages:
            body = msg.get_body(preferencelist=("html", "plain")).get_content()
            body = html.unescape(re.sub(r"</?pre>", "", body))
            out.append(f"{msg['Subject']}\n{body}")
        return out

    def subjects(self) -> list[str]:
        with self._lock:
            return [str(m["Subject"]) for m in self.messages]

    def __enter__(self) -> SmtpSink:
        self._controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self._controller.stop()


class SlackWebhookSink(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 answering Slack's webhook reply (``200 ok``) and keeping each posted payload."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SlackHandler)
        self.posts: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def connection_json(self) -> str:
        """An Airflow ``slackwebhook`` connection to this listener: its endpoint as host, the token as password."""
        return json.dumps({"conn_type": "slackwebhook", "host": f"http://127.0.0.1:{self.port}",
                           "password": SLACK_TOKEN})

    def rest_connection(self) -> dict:
        """The same connection as fields of Airflow's REST API (``AirflowStack.put_connection``)."""
        return json.loads(self.connection_json())

    def texts(self) -> list[str]:
        """Each message's text as a person reads it in Slack (mrkdwn escapes undone)."""
        with self._lock:
            posts = list(self.posts)
        return [html.unescape(body.get("text", "")) for _, body in posts]

    def subjects(self) -> list[str]:
        return [t.split("\n", 1)[0].strip("*") for t in self.texts()]

    def paths(self) -> list[str]:
        with self._lock:
            return [p for p, _ in self.posts]

    def __enter__(self) -> SlackWebhookSink:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


class _SlackHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server._lock:
            self.server.posts.append((self.path, json.loads(body or b"{}")))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:  # quiet: the test reads what was posted
        pass
