"""TLS to a tenant database: the one place that decides how a MySQL-protocol connection is secured.

Invariants:

* The modes are the MySQL client's ``--ssl-mode`` (:data:`TLS_MODES`): ``DISABLED`` (no TLS), ``PREFERRED``
  (TLS when the server offers it, else plain), ``REQUIRED`` (TLS, the certificate not checked), ``VERIFY_CA``
  (TLS, the server's certificate must chain to the CA) and ``VERIFY_IDENTITY`` (``VERIFY_CA`` and the host name
  connected to must be one the certificate names). ``VERIFY_*`` without ``ssl_ca`` use the system's CA store.
* A DSN names them with query parameters (:data:`TLS_PARAMETERS`, any case, ``-`` read as ``_``): ``ssl_mode``,
  ``ssl_ca``, ``ssl_cert``, ``ssl_key`` (file paths, PEM). An Airflow connection names them with extras of the
  same names, which the tenant hook turns into these parameters: the DSN a child host is given carries them.
  Any other ``ssl*`` parameter is refused (:class:`BadInput`), never silently ignored.
* No mode given: ``VERIFY_CA`` when a CA is given; else ``PREFERRED`` for a local server (a loopback address,
  ``localhost``, a unix socket) and ``REQUIRED`` for any other: a remote tenant is never reached in plain text
  unless ``ssl_mode=DISABLED`` says so.
* Bad values are :class:`BadInput` (exit 2) naming the parameter and what to give, before any connection:
  an unknown mode, a file that does not exist or does not load, a key without a certificate, ``DISABLED`` with
  files, a key given as its contents. No message carries key contents or a password; the key's path is shown
  only as :func:`nexus_cutover.db.mask_dsn` shows it (hidden).
* Refusals of the handshake are words (:meth:`TlsSettings.handshake_refusal`, :meth:`TlsSettings.no_server_tls`)
  naming the mode and what to change; :mod:`nexus_cutover.db` raises them at connect.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from dataclasses import dataclass

from .errors import BadInput

TLS_MODES = ("DISABLED", "PREFERRED", "REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY")
#: Modes that refuse a server that offers no TLS.
MODES_REQUIRING_TLS = ("REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY")
TLS_PARAMETERS = ("ssl_mode", "ssl_ca", "ssl_cert", "ssl_key")
_ALIASES = {"sslmode": "ssl_mode", "sslca": "ssl_ca", "sslcert": "ssl_cert", "sslkey": "ssl_key"}
_LOCAL_HOSTS = {"localhost", "localhost.localdomain"}
_HOSTNAME_MISMATCH = {62, 64}  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


def parameter_name(name: str) -> str:
    """The canonical spelling of a DSN query parameter or connection extra name (lower case, ``_``)."""
    key = name.strip().lower().replace("-", "_")
    return _ALIASES.get(key, key)


def is_tls_parameter(name: str) -> bool:
    """Whether ``name`` is a TLS parameter (known or not): every ``ssl*`` name is this module's to read."""
    return parameter_name(name).startswith("ssl")


def is_local_host(host: str | None, query: dict | None = None) -> bool:
    """A server on this machine: a loopback address, ``localhost``, or a unix socket (``unix_socket`` parameter)."""
    if query and any(parameter_name(k) == "unix_socket" for k in query):
        return True
    name = (host or "").strip().strip("[]").lower()
    if not name or name in _LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TlsSettings:
    """How one tenant connection is secured (see the module docstring); ``defaulted``: no ``ssl_mode`` was given."""

    mode: str
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    defaulted: bool = False
    local: bool = True

    @property
    def requires_tls(self) -> bool:
        return self.mode in MODES_REQUIRING_TLS

    def describe(self) -> str:
        """``TLS VERIFY_IDENTITY``, or ``TLS PREFERRED (the default for a local server)``: what a run reports."""
        if not self.defaulted:
            return f"TLS {self.mode}"
        why = "a CA is given" if self.ca else ("a local server" if self.local else "a non-local server")
        return f"TLS {self.mode} (the default for {why})"

    def report(self) -> dict:
        """The settings as a report shows them: the mode and the certificate paths; of the key only whether one is given."""
        ca = self.ca or ("system CA store" if self.mode.startswith("VERIFY") else None)
        return {"mode": self.mode, "default": self.defaulted, "ca": ca, "cert": self.cert, "client_key": bool(self.key)}

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context PyMySQL is given as its ``ssl`` connect argument; None for ``DISABLED``. Loads the files now,
        so a bad file is :class:`BadInput` before any connection."""
        if self.mode == "DISABLED":
            return None
        if self.mode.startswith("VERIFY"):
            try:
                ctx = ssl.create_default_context(cafile=self.ca)
            except (ssl.SSLError, OSError) as exc:
                raise BadInput(f"ssl_ca {self.ca!r} is not a CA certificate file (PEM) that loads ({exc.__class__.__name__}): "
                               "give the PEM file of the CA that signed the tenant server's certificate") from None
            # As PyMySQL does: the strict X.509 checks of Python 3.13 refuse certificates MySQL servers generate.
            ctx.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
            ctx.check_hostname = self.mode == "VERIFY_IDENTITY"
            ctx.verify_mode = ssl.CERT_REQUIRED
        else:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert:
            try:
                ctx.load_cert_chain(self.cert, keyfile=self.key)
            except (ssl.SSLError, OSError) as exc:
                raise BadInput(f"the client certificate ssl_cert {self.cert!r} and its ssl_key do not load "
                               f"({exc.__class__.__name__}): give a PEM certificate and the PEM key that belongs to it "
                               "(an unencrypted key)") from None
        return ctx

    def no_server_tls(self, where: str) -> str:
        """The refusal of a server that offers no TLS under a mode that requires it (the MySQL client's too)."""
        return (f"ssl_mode={self.mode} requires TLS, but the server at {where} does not offer it (it runs without a "
                "certificate): enable TLS on the server (ssl_cert/ssl_key in its configuration), or connect with "
                "ssl_mode=PREFERRED or DISABLED if plain text to it is acceptable; nothing was sent to it")

    def handshake_refusal(self, exc: ssl.SSLError, where: str) -> str:
        """Words for a TLS handshake the client refused (``exc``), naming the mode and what to fix."""
        code = getattr(exc, "verify_code", None)
        reason = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or exc.__class__.__name__
        if code in _HOSTNAME_MISMATCH:
            return (f"the TLS handshake with {where} was refused under ssl_mode={self.mode}: the server's certificate is "
                    f"not issued for the host name connected to ({reason}): connect by a name the certificate carries "
                    "(its subjectAltName), or use ssl_mode=VERIFY_CA to check only that it chains to the CA")
        if isinstance(exc, ssl.SSLCertVerificationError):
            ca = f"ssl_ca {self.ca!r}" if self.ca else "the system's CA store (no ssl_ca given)"
            return (f"the TLS handshake with {where} was refused under ssl_mode={self.mode}: the server's certificate "
                    f"does not chain to {ca} ({reason}): give as ssl_ca the CA certificate that signed the server's "
                    "certificate")
        return (f"the TLS handshake with {where} failed under ssl_mode={self.mode} ({reason}): check that the server "
                "serves TLS on this port and that the client certificate (ssl_cert/ssl_key), if any, is one it accepts")


def settings_of(values: dict[str, str], *, local: bool, where: str = "the DSN") -> TlsSettings:
    """The :class:`TlsSettings` of the TLS parameters ``values`` (canonical names, see :func:`parameter_name`)."""
    several = sorted(k for k, v in values.items() if isinstance(v, tuple))
    if several:
        raise BadInput(f"{where} gives the TLS parameter {several[0]} more than once: give it once")
    unknown = sorted(k for k in values if k not in TLS_PARAMETERS)
    if unknown:
        raise BadInput(f"{where} has the TLS parameter {unknown[0]!r}, which nexus-cutover does not read: give TLS as "
                       "ssl_mode (" + ", ".join(TLS_MODES) + "), ssl_ca, ssl_cert and ssl_key (file paths)")
    raw_mode = str(values.get("ssl_mode") or "").strip()
    mode = raw_mode.upper().replace("-", "_")
    if raw_mode and mode not in TLS_MODES:
        raise BadInput(f"{where}: ssl_mode {raw_mode!r} is not a TLS mode: use one of " + ", ".join(TLS_MODES))
    files = {name: (str(values.get(name) or "").strip() or None) for name in ("ssl_ca", "ssl_cert", "ssl_key")}
    key = files["ssl_key"]
    if key and ("-----BEGIN" in key or "\n" in key):
        raise BadInput(f"{where}: ssl_key must be the path of the client key file, not the key itself (it was not shown)")
    for name, path in files.items():
        if path and not os.path.isfile(path):
            shown = "(its path is hidden)" if name == "ssl_key" else repr(path)
            raise BadInput(f"{where}: the {name} file {shown} does not exist: give the path of a PEM file readable here "
                           "(on the machine that connects, and on the one the new host runs on)")
    if key and not files["ssl_cert"]:
        raise BadInput(f"{where}: ssl_key is given without ssl_cert: give the client certificate too, or neither")
    if mode == "DISABLED" and any(files.values()):
        given = ", ".join(n for n, p in files.items() if p)
        raise BadInput(f"{where}: ssl_mode=DISABLED with {given}: remove them, or choose a mode that uses TLS "
                       "(REQUIRED, VERIFY_CA, VERIFY_IDENTITY)")
    defaulted = not raw_mode
    if defaulted:
        mode = "VERIFY_CA" if files["ssl_ca"] else ("PREFERRED" if local else "REQUIRED")
    return TlsSettings(mode=mode, ca=files["ssl_ca"], cert=files["ssl_cert"], key=key, defaulted=defaulted, local=local)


def split_tls(query: dict) -> tuple[dict, dict]:
    """``(the query without its TLS parameters, those parameters by canonical name)`` of a DSN's query (SQLAlchemy's
    ``url.query``); never raises: :func:`settings_of` judges the parameters (a name given twice keeps all its values)."""
    rest: dict = {}
    values: dict = {}
    for name, value in query.items():
        if not is_tls_parameter(name):
            rest[name] = value
            continue
        key = parameter_name(name)
        given = value if isinstance(value, tuple) else (value,)
        values[key] = values.get(key, ()) + given if key in values else given
    return rest, {k: (v[0] if len(v) == 1 else v) for k, v in values.items()}
