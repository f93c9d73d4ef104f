"""How the wrapper logs in to its broker: a user name, a password read from a file, TLS with a CA and a client
certificate.

Theory of operation: a production Mosquitto has `allow_anonymous false`, a
password file, ACLs and often a TLS listener; the wrapper is then one more
client that must log in. Every secret stays in a file named by the
configuration (`broker_password_file`, `broker_tls_key`), never on the
command line (which every user of the host can read in /proc) nor in a log
line: `BrokerAuth` keeps the password out of its repr, and no message here
shows a secret or a line of a secret file.

`load_broker_auth` reads and checks everything at start-up, so a missing
file, a certificate without its key or a CA file that holds no certificate
stops the wrapper with exit status 2 and a message naming the option and
the fix (`BrokerAuthError`, turned into a `ConfigError` by config.py),
instead of a connection that fails later for a reason the operator must
guess. `ssl_context` builds the context paho's connection uses: the system's
CAs unless `broker_tls_ca` names others, the broker's host name checked
against its certificate, and the client certificate when one is given.

What the broker says when it refuses the login, or a TLS handshake that
fails, is turned into one message naming the setting to fix
(`refusal_hint`, `tls_failure_hint`); broker_health.py decides how often it
is repeated.
"""

from __future__ import annotations

import os
import ssl
import stat
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TLS_PORT = 8883
"""the broker port when TLS is asked for and `broker` names no port (the IANA port of MQTT over TLS)"""

USERNAME = "broker_username (--broker-username)"
PASSWORD_FILE = "broker_password_file (--broker-password-file)"
TLS_CA = "broker_tls_ca (--broker-tls-ca)"
TLS_CERT = "broker_tls_cert (--broker-tls-cert)"
TLS_KEY = "broker_tls_key (--broker-tls-key)"


class BrokerAuthError(ValueError):
    """A credential option that cannot be used; the message names the option and the fix, never a secret."""


@dataclass(frozen=True)
class BrokerAuth:
    """The wrapper's login at its broker; every field None means anonymous, without TLS."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    """read from `password_file`; never logged"""
    password_file: Path | None = None
    tls_ca: Path | None = None
    """PEM file of the CA(s) that signed the broker's certificate; None with TLS: the system's CAs"""
    tls_cert: Path | None = None
    """PEM client certificate (with its chain) presented to the broker"""
    tls_key: Path | None = None
    """PEM private key of `tls_cert`, not encrypted"""

    @property
    def tls(self) -> bool:
        """True when the connection speaks TLS (a CA or a client certificate was given)."""
        return self.tls_ca is not None or self.tls_cert is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for the broker connection (None without TLS); BrokerAuthError when a file cannot be
        used (read again at each call: the files may have been replaced since start-up)."""
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        except ssl.SSLError as error:  # the system CA store is unreadable
            raise BrokerAuthError(f"cannot load the system's CA certificates ({_reason(error)}); give the CA that "
                                  f"signed the broker's certificate with {TLS_CA}") from None
        if self.tls_ca is not None:
            try:
                context.load_verify_locations(cafile=str(self.tls_ca))
            except FileNotFoundError:
                raise BrokerAuthError(f"{TLS_CA}: file {str(self.tls_ca)!r} not found; give the PEM file of the CA "
                                      f"that signed the broker's certificate (its `cafile` if the broker checks "
                                      f"clients with the same CA)") from None
            except PermissionError:
                raise BrokerAuthError(f"{TLS_CA}: cannot read {str(self.tls_ca)!r}: permission denied; make it "
                                      f"readable by the user the wrapper runs as") from None
            except (ssl.SSLError, OSError, ValueError) as error:
                raise BrokerAuthError(f"{TLS_CA}: {str(self.tls_ca)!r} holds no usable CA certificate "
                                      f"({_reason(error)}); give a PEM file of the CA that signed the broker's "
                                      f"certificate") from None
        if self.tls_cert is not None:
            assert self.tls_key is not None  # load_broker_auth requires both
            for option, path in ((TLS_CERT, self.tls_cert), (TLS_KEY, self.tls_key)):
                _readable(path, option, "the client certificate and its key are PEM files")
            try:
                context.load_cert_chain(str(self.tls_cert), str(self.tls_key), password=_no_passphrase)
            except (ssl.SSLError, OSError, ValueError, TypeError) as error:
                raise BrokerAuthError(
                    f"{TLS_CERT} and {TLS_KEY}: cannot load the client certificate {str(self.tls_cert)!r} with the "
                    f"key {str(self.tls_key)!r} ({_reason(error)}); give a PEM certificate and its own private key, "
                    f"the key not encrypted (`openssl pkey -in KEY -out PLAIN.key` removes a passphrase)") from None
        return context

    def describe(self) -> str:
        """How the wrapper logs in, for the start-up line (no secret)."""
        parts = [f"as user {self.username!r}" + (" with a password" if self.password else "")
                 if self.username is not None else "anonymously"]
        if self.tls:
            parts.append(f"over TLS (CA {self.tls_ca or 'of the system'}"
                         + (f", client certificate {self.tls_cert})" if self.tls_cert else ")"))
        return " ".join(parts)

    def permission_warnings(self) -> list[str]:
        """Warnings for secret files other users may read (the password file, the client key)."""
        warnings = []
        for option, path in ((PASSWORD_FILE, self.password_file), (TLS_KEY, self.tls_key)):
            if path is None:
                continue
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                warnings.append(f"{option}: {path} can be read or written by other users (mode "
                                f"{stat.S_IMODE(mode):04o}): chmod 600 {path}")
        return warnings


def _no_passphrase() -> str:
    raise BrokerAuthError("the key is encrypted")


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None) or getattr(error, "strerror", None) or str(error) or type(error).__name__
    return str(reason)


def _readable(path: Path, option: str, what: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise BrokerAuthError(f"{option}: file {str(path)!r} not found; {what}") from None
    except IsADirectoryError:
        raise BrokerAuthError(f"{option}: {str(path)!r} is a directory; give a file ({what})") from None
    except OSError as error:
        raise BrokerAuthError(f"{option}: cannot read {str(path)!r}: {error.strerror or error}; make it readable "
                              f"by the user the wrapper runs as") from None


def read_password_file(path: Path) -> str:
    """The password in the first line of `path` (its line end removed; spaces are kept); BrokerAuthError with
    what to do when the file cannot be used. The message never shows the file's content."""
    what = "write the broker password on the first line of the file (chmod 600)"
    _readable(path, PASSWORD_FILE, what)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise BrokerAuthError(f"{PASSWORD_FILE}: {str(path)!r} is not UTF-8 text; {what}") from None
    password = text.split("\n", 1)[0].rstrip("\r")
    if not password:
        raise BrokerAuthError(f"{PASSWORD_FILE}: the first line of {str(path)!r} is empty; {what}")
    return password


def load_broker_auth(username: str | None, password_file: Path | None, tls_ca: Path | None,
                     tls_cert: Path | None, tls_key: Path | None) -> BrokerAuth:
    """Check the credential options together and read the files; BrokerAuthError naming the option and the fix."""
    if password_file is not None and username is None:
        raise BrokerAuthError(f"{PASSWORD_FILE} needs {USERNAME}: Mosquitto checks a password only together "
                              f"with a user name; give the user the broker's password_file lists")
    if username is not None and ("\0" in username or len(username.encode("utf-8")) > 65535):
        raise BrokerAuthError(f"{USERNAME}: not a valid MQTT user name (no NUL, at most 65535 bytes)")
    if tls_cert is not None and tls_key is None:
        raise BrokerAuthError(f"{TLS_CERT} needs {TLS_KEY}: give the client certificate's private key file")
    if tls_key is not None and tls_cert is None:
        raise BrokerAuthError(f"{TLS_KEY} needs {TLS_CERT}: give the client certificate the key belongs to")
    password = read_password_file(password_file) if password_file is not None else None
    auth = BrokerAuth(username, password, password_file, tls_ca, tls_cert, tls_key)
    auth.ssl_context()  # every TLS file loads now, or the wrapper does not start
    return auth


# ------------------------------------------------------------------ what to tell the operator


def refusal_hint(reason: str, auth: BrokerAuth) -> str:
    """What to fix when the broker's CONNACK refuses the connection with `reason` (paho's reason text;
    Mosquitto 2.0 says "Not authorized" for a wrong password as for an unknown user)."""
    lowered = reason.lower()
    if "user name or password" in lowered or "not authori" in lowered:
        if auth.username is None:
            return (f"the broker does not accept anonymous clients: give a user of its password_file with "
                    f"{USERNAME} and that user's password in a file named by {PASSWORD_FILE}")
        password = (f"the password in {auth.password_file}" if auth.password_file is not None
                    else "no password (none given)")
        return (f"the broker's password_file must hold user {auth.username!r} with {password}: fix "
                f"{USERNAME} or {PASSWORD_FILE}, or the broker's password_file")
    if "banned" in lowered or "client identifier" in lowered:
        return "check client_id (--client-id) and the broker's rules for client ids"
    return "check the broker's log for why"


def tls_failure_hint(reason: str, auth: BrokerAuth) -> str:
    """What to fix when the TLS handshake with the broker fails with `reason` (the ssl module's text), or the
    broker closes the connection before it answers CONNECT (how a TLS 1.3 broker refuses a client certificate,
    and how a TLS listener ends a plain connection)."""
    lowered = reason.lower()
    if not auth.tls:
        return (f"if the broker's listener expects TLS, give {TLS_CA} (and {TLS_CERT}, {TLS_KEY} if it asks for "
                f"a client certificate); else see the broker's log")
    if "certificate verify failed" in lowered or "mismatch" in lowered:
        ca = auth.tls_ca or "none given: the system CAs"
        return (f"the broker's certificate is not signed by the CA in {TLS_CA} ({ca}), or does not name the host "
                f"of broker (--broker) in its subjectAltName: give the CA that signed it, or connect by a name the "
                f"certificate holds")
    if "closed the connection" in lowered or "certificate required" in lowered or "unknown ca" in lowered \
            or "bad certificate" in lowered or "certificate unknown" in lowered:
        if auth.tls_cert is None:
            return f"the broker may ask for a client certificate: give {TLS_CERT} and {TLS_KEY}"
        return (f"the broker may have refused the client certificate {auth.tls_cert}: check {TLS_CERT} and "
                f"{TLS_KEY}, and the CA the broker checks clients with (its cafile)")
    if "wrong version number" in lowered or "during the tls handshake" in lowered or "unexpected eof" in lowered \
            or "record layer" in lowered or "packet length too long" in lowered:
        return (f"the listener at broker (--broker) may not speak TLS: give the broker's TLS port, or leave "
                f"{TLS_CA} and {TLS_CERT} out for a plain listener")
    return f"check {TLS_CA}, {TLS_CERT} and {TLS_KEY}"
