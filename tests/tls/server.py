"""A throwaway MariaDB serving TLS, with certificates made by ``openssl``: :func:`tls_mariadb` starts it and stops it.

Its certificates: a CA; a server certificate signed by it for the name ``localhost`` only, so ``127.0.0.1`` is a host
name the certificate does not carry (``VERIFY_CA`` connects by it, ``VERIFY_IDENTITY`` refuses); a client certificate
signed by it; a second, unrelated CA. The server starts as ``scripts/with-mariadb.sh`` starts one
(``mariadb-install-db``, then ``mariadbd`` on a free port with its own datadir and socket) and serves TLS with
``--ssl-cert/--ssl-key/--ssl-ca``. Its users: ``tls_user`` (``REQUIRE SSL``, refused in plain text) and ``x509_user``
(``REQUIRE X509``: only with a client certificate the CA signed). Used by tests/tls (the session's ``tls_server``
fixture) and tests/test_install_path.py (the installed wheel's real cutover over ``VERIFY_CA``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import urlencode

TLS_PASSWORD = "Tls-pw-5c9e1d"
X509_PASSWORD = "X509-pw-0b7a44"


@dataclasses.dataclass(frozen=True)
class TlsServer:
    port: int
    certs: pathlib.Path
    socket: str

    @property
    def ca(self) -> str:
        return str(self.certs / "ca.pem")

    @property
    def other_ca(self) -> str:
        return str(self.certs / "other-ca.pem")

    @property
    def client_cert(self) -> str:
        return str(self.certs / "client.pem")

    @property
    def client_key(self) -> str:
        return str(self.certs / "client.key")

    def dsn(self, database: str = "tls_tenant", *, host: str = "localhost", user: str = "tls_user",
            password: str = TLS_PASSWORD, **tls) -> str:
        """A DSN to this server; ``tls``: its TLS query parameters (``ssl_mode=...``, ``ssl_ca=...``)."""
        query = f"?{urlencode(tls)}" if tls else ""
        return f"mysql+pymysql://{user}:{password}@{host}:{self.port}/{database}{query}"


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(where: pathlib.Path) -> None:
    """ca.pem (+key), server.pem/.key for DNS:localhost, client.pem/.key, other-ca.pem: all signed as named."""
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "2", "-subj", f"/CN=nexus test {ca}", cwd=where)
    (where / "server.ext").write_text("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n"
                                      "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    (where / "client.ext").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for name, cn in (("server", "localhost"), ("client", "nexus test client")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=where)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=where)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tls_mariadb() -> Iterator[TlsServer]:
    """A MariaDB serving TLS (see the module docstring); stopped (bounded waits) and removed on exit."""
    mariadbd = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
    work = pathlib.Path(tempfile.mkdtemp(prefix="nexus-tls-mariadb."))
    certs = work / "certs"
    certs.mkdir()
    (work / "tmp").mkdir()
    make_certificates(certs)
    sock = str(work / "sock")
    port = _free_port()
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={work / 'data'}", f"--tmpdir={work / 'tmp'}",
                    "--user=root", "--auth-root-authentication-method=normal", "--skip-test-db"],
                   check=True, capture_output=True)
    server = subprocess.Popen(
        [mariadbd, "--no-defaults", f"--datadir={work / 'data'}", f"--tmpdir={work / 'tmp'}", f"--socket={sock}",
         f"--port={port}", "--bind-address=127.0.0.1", "--user=root", f"--log-error={work / 'error.log'}",
         "--innodb-buffer-pool-size=64M", "--skip-name-resolve",
         f"--ssl-ca={certs / 'ca.pem'}", f"--ssl-cert={certs / 'server.pem'}", f"--ssl-key={certs / 'server.key'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            ping = subprocess.run(["mariadb-admin", "--no-defaults", f"--socket={sock}", "-uroot", "ping"],
                                  capture_output=True)
            if ping.returncode == 0:
                break
            if server.poll() is not None:
                raise RuntimeError("the TLS MariaDB exited at start: " + (work / "error.log").read_text()[-2000:])
            time.sleep(0.1)
        sql = (f"CREATE DATABASE tls_tenant; "
               f"CREATE USER 'tls_user'@'127.0.0.1' IDENTIFIED BY '{TLS_PASSWORD}' REQUIRE SSL; "
               f"GRANT ALL ON *.* TO 'tls_user'@'127.0.0.1'; "
               f"CREATE USER 'x509_user'@'127.0.0.1' IDENTIFIED BY '{X509_PASSWORD}' REQUIRE X509; "
               f"GRANT ALL ON *.* TO 'x509_user'@'127.0.0.1';")
        subprocess.run(["mariadb", "--no-defaults", f"--socket={sock}", "-uroot", "-e", sql], check=True, capture_output=True)
        yield TlsServer(port=port, certs=certs, socket=sock)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)
