"""TLS to a tenant database, as a matrix: each MySQL client mode against a TLS server and a plain one.

Real servers: :func:`tests.tls.conftest.tls_server` (TLS, a ``REQUIRE SSL`` user, a certificate for ``localhost``
only) and the plain MariaDB of ``scripts/with-mariadb.sh``. Each mode connects, or refuses, as the MySQL client
would; what a connection negotiated is read from the server (``Ssl_version``), not from the client's settings.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from nexus_cutover import tls
from nexus_cutover.db import make_engine, mask_dsn, tls_report, translate_errors
from nexus_cutover.errors import BadInput, Unreachable
from tests.tls.conftest import TLS_PASSWORD, X509_PASSWORD


def connect(dsn: str) -> dict:
    """Open one connection through :func:`make_engine` as every command does; its :func:`tls_report`."""
    engine = make_engine(dsn, connect_timeout=5)
    try:
        with translate_errors("connecting for the TLS test"), engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
            return tls_report(engine, conn)
    finally:
        engine.dispose()


def plain_dsn(mysql_server_url: str, **query) -> str:
    url = make_url(mysql_server_url)
    return url.set(database="mysql", query=query).render_as_string(hide_password=False)


#: mode -> what the TLS server (user REQUIRE SSL) does; what the plain server does.
MATRIX = {
    "DISABLED": ("refused: access denied", "plain"),
    "PREFERRED": ("tls", "plain"),
    "REQUIRED": ("tls", "refused: no TLS"),
    "VERIFY_CA": ("tls", "refused: no TLS"),
    "VERIFY_IDENTITY": ("tls", "refused: no TLS"),
}


@pytest.mark.parametrize("mode", MATRIX)
def test_each_mode_against_the_tls_server(tls_server, mode):
    query = {"ssl_mode": mode} | ({"ssl_ca": tls_server.ca} if mode.startswith("VERIFY") else {})
    expected = MATRIX[mode][0]
    if expected == "tls":
        report = connect(tls_server.dsn(**query))
        assert report["mode"] == mode and report["default"] is False
        assert report["in_use"] and report["in_use"].startswith("TLSv"), report
    else:  # the server refuses the REQUIRE SSL user in plain text, as it refuses the mysql client with --ssl-mode=DISABLED
        with pytest.raises(BadInput, match="refused the credentials") as refused:
            connect(tls_server.dsn(**query))
        assert "ssl_mode=DISABLED" in str(refused.value) and "REQUIRE SSL" in str(refused.value)
        assert TLS_PASSWORD not in str(refused.value)


@pytest.mark.parametrize("mode", MATRIX)
def test_each_mode_against_the_plain_server(mysql_server_url, tls_server, mode):
    query = {"ssl_mode": mode} | ({"ssl_ca": tls_server.ca} if mode.startswith("VERIFY") else {})
    dsn = plain_dsn(mysql_server_url, **query)
    if MATRIX[mode][1] == "plain":
        report = connect(dsn)
        assert report["mode"] == mode and report["in_use"] is None, report
    else:  # refused before authenticating: nothing is sent to a server that cannot encrypt it
        with pytest.raises(Unreachable) as refused:
            connect(dsn)
        message = str(refused.value)
        assert message.startswith("cannot connect to the tenant database")
        assert f"ssl_mode={mode} requires TLS, but the server at 127.0.0.1:" in message and "does not offer it" in message


def test_no_mode_on_a_local_server_is_preferred_and_uses_tls_where_offered(tls_server, mysql_server_url):
    on_tls = connect(tls_server.dsn())
    assert (on_tls["mode"], on_tls["default"]) == ("PREFERRED", True) and on_tls["in_use"].startswith("TLSv")
    assert on_tls["text"] == "TLS PREFERRED (the default for a local server)"
    on_plain = connect(plain_dsn(mysql_server_url))
    assert (on_plain["mode"], on_plain["in_use"]) == ("PREFERRED", None)


def test_a_ca_alone_means_verify_ca(tls_server):
    report = connect(tls_server.dsn(ssl_ca=tls_server.ca))
    assert (report["mode"], report["default"], report["ca"]) == ("VERIFY_CA", True, tls_server.ca)
    assert report["in_use"].startswith("TLSv")


def test_verify_identity_refuses_a_certificate_for_another_host_name(tls_server):
    """The certificate names ``localhost`` only: by ``127.0.0.1`` VERIFY_IDENTITY refuses, VERIFY_CA connects."""
    with pytest.raises(Unreachable) as refused:
        connect(tls_server.dsn(host="127.0.0.1", ssl_mode="VERIFY_IDENTITY", ssl_ca=tls_server.ca))
    message = str(refused.value)
    assert "refused under ssl_mode=VERIFY_IDENTITY" in message
    assert "not issued for the host name connected to" in message and "use ssl_mode=VERIFY_CA" in message
    assert connect(tls_server.dsn(host="127.0.0.1", ssl_mode="VERIFY_CA", ssl_ca=tls_server.ca))["in_use"]


@pytest.mark.parametrize("mode", ["VERIFY_CA", "VERIFY_IDENTITY"])
def test_a_wrong_ca_is_refused_in_words(tls_server, mode):
    with pytest.raises(Unreachable) as refused:
        connect(tls_server.dsn(ssl_mode=mode, ssl_ca=tls_server.other_ca))
    message = str(refused.value)
    assert f"refused under ssl_mode={mode}: the server's certificate does not chain to ssl_ca '{tls_server.other_ca}'" in message
    assert "give as ssl_ca the CA certificate that signed the server's certificate" in message


def test_verify_without_a_ca_checks_against_the_system_store(tls_server):
    """No ssl_ca: the system's CAs, which do not include the test CA, so the handshake is refused, naming the store."""
    with pytest.raises(Unreachable, match="does not chain to the system's CA store"):
        connect(tls_server.dsn(ssl_mode="VERIFY_CA"))


def test_a_client_certificate_is_presented(tls_server):
    """A REQUIRE X509 user connects only with the client certificate and key the server's CA signed."""
    with_cert = tls_server.dsn(user="x509_user", password=X509_PASSWORD, ssl_mode="VERIFY_IDENTITY", ssl_ca=tls_server.ca,
                               ssl_cert=tls_server.client_cert, ssl_key=tls_server.client_key)
    report = connect(with_cert)
    assert report["in_use"].startswith("TLSv") and report["cert"] == tls_server.client_cert and report["client_key"] is True
    assert tls_server.client_key not in mask_dsn(with_cert) and "ssl_key=***" in mask_dsn(with_cert)
    with pytest.raises(BadInput, match="refused the credentials"):
        connect(tls_server.dsn(user="x509_user", password=X509_PASSWORD, ssl_mode="VERIFY_IDENTITY", ssl_ca=tls_server.ca))


@pytest.mark.parametrize(("query", "words"), [
    ({"ssl_mode": "VERIFY_FULL"}, "ssl_mode 'VERIFY_FULL' is not a TLS mode: use one of DISABLED, PREFERRED, REQUIRED"),
    ({"ssl_mode": "VERIFY_CA", "ssl_ca": "/nonexistent/ca.pem"}, "the ssl_ca file '/nonexistent/ca.pem' does not exist"),
    ({"ssl_mode": "REQUIRED", "ssl_cert": "{cert}", "ssl_key": "/nonexistent/Key-path-3f1"},
     "the ssl_key file (its path is hidden) does not exist"),
    ({"ssl_mode": "REQUIRED", "ssl_key": "-----BEGIN PRIVATE KEY-----\nKey-body-77aa"}, "ssl_key must be the path"),
    ({"ssl_mode": "REQUIRED", "ssl_key": "{key}"}, "ssl_key is given without ssl_cert"),
    ({"ssl_mode": "DISABLED", "ssl_ca": "{ca}"}, "ssl_mode=DISABLED with ssl_ca: remove them"),
    ({"ssl_capath": "/etc/ssl/certs"}, "TLS parameter 'ssl_capath', which nexus-cutover does not read"),
    ({"ssl_mode": "VERIFY_CA", "ssl_ca": "{not_pem}"}, "is not a CA certificate file (PEM) that loads"),
    ({"ssl_mode": "REQUIRED", "ssl_cert": "{ca}", "ssl_key": "{key}"}, "the client certificate ssl_cert"),
])
def test_bad_tls_parameters_are_bad_input_naming_what_to_fix(tls_server, query, words):
    files = {"{cert}": tls_server.client_cert, "{key}": tls_server.client_key, "{ca}": tls_server.ca,
             "{not_pem}": str(tls_server.certs / "client.ext")}
    query = {k: files.get(v, v) for k, v in query.items()}
    with pytest.raises(BadInput) as bad:
        connect(tls_server.dsn(**query))
    message = str(bad.value)
    assert words in message, message
    for secret in ("Key-path-3f1", "Key-body-77aa", TLS_PASSWORD, tls_server.client_key):
        assert secret not in message, message


@pytest.mark.parametrize(("host", "query", "mode"), [
    ("tidb.example.com", {}, "REQUIRED"),
    ("10.1.2.3", {}, "REQUIRED"),
    ("127.0.0.1", {}, "PREFERRED"),
    ("::1", {}, "PREFERRED"),
    ("localhost", {}, "PREFERRED"),
    ("tidb.example.com", {"unix_socket": "/run/mysqld.sock"}, "PREFERRED"),
    ("tidb.example.com", {"SSL-MODE": "verify_identity"}, "VERIFY_IDENTITY"),
    ("tidb.example.com", {"sslmode": "disabled"}, "DISABLED"),
])
def test_the_default_mode_of_a_non_local_host_requires_tls(host, query, mode):
    _, values = tls.split_tls(query)
    assert tls.settings_of(values, local=tls.is_local_host(host, query)).mode == mode


def test_pymysql_alone_would_go_on_in_plain_text_so_the_refusal_is_ours(mysql_server_url, tls_server):
    """Why ``nexus_cutover.db`` refuses in its own handshake step: PyMySQL's public TLS arguments (a context, an
    ``ssl`` mapping with a CA, ``ssl_verify_cert``/``ssl_verify_identity``) connect in plain text to a server that
    offers no TLS, where the MySQL client's REQUIRED refuses. When this fails, PyMySQL refuses by itself: drop the
    subclass (db._pymysql_connection_class) and keep the refusal test above."""
    import ssl

    import pymysql

    url = make_url(mysql_server_url)
    context = ssl.create_default_context(cafile=tls_server.ca)
    for public in ({"ssl": context}, {"ssl": {"ca": tls_server.ca}, "ssl_verify_cert": True},
                   {"ssl_ca": tls_server.ca, "ssl_verify_cert": True, "ssl_verify_identity": True}):
        conn = pymysql.connect(host=url.host, port=url.port, user=url.username, password=url.password or "",
                               connect_timeout=5, **public)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
                assert cur.fetchone()[1] == "", public  # connected, and in plain text
        finally:
            conn.close()
    with pytest.raises(Unreachable, match="requires TLS, but the server"):
        connect(plain_dsn(mysql_server_url, ssl_mode="REQUIRED"))
