"""How mtpbench reaches a server it attaches to (``--server``, ``--baseline-server``): its base URL, where
``/metrics`` is read, the headers it sends and the TLS context. Both HTTP clients (urllib for the probes and
``/metrics``, aiohttp for the load) take their headers and SSL context from here, so they cannot disagree.

Secrets: the API key (from ``OPENAI_API_KEY``, or the variable ``--api-key-env`` names) goes out as
``Authorization: Bearer <key>``; ``--header 'Name: value'`` and ``--header-env 'Name=VAR'`` add gateway
headers. Their values live only in a ``Connection`` in memory (its repr hides them); what is written
(``SweepConfig.to_json``, provenance) holds header names and variable names, never a value.

Credentials go only to the origins (scheme, host, port) they were given for: the servers the user named.
A ``--metrics-url`` on another origin gets none unless ``--metrics-credentials`` says so. Redirects are not
followed, so no header is carried to an origin by a server's say-so.

A server mtpbench launches itself is open on loopback: ``Connection.open(url)``, no credentials.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from mtpbench.errors import MtpBenchError

API_KEY_ENV = "OPENAI_API_KEY"  # as `vllm bench serve`
INSECURE_NOTE = "TLS certificate verification was off (--insecure): the server's identity was not checked"


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL, the port made explicit."""
    u = urlsplit(url)
    scheme = u.scheme.lower()
    return scheme, (u.hostname or "").lower(), u.port or (443 if scheme == "https" else 80)


class Hidden(dict):
    """Header name -> value, secret: printed as a count, never as values (a config's repr, a traceback)."""

    def __repr__(self) -> str:
        return f"<{len(self)} hidden header value(s)>"

    __str__ = __repr__


@dataclass(frozen=True)
class Connection:
    base_url: str  # no trailing slash
    metrics_url: str  # where /metrics is read
    credentials: Hidden = field(default_factory=Hidden, repr=False)  # header -> value, for credential origins only
    credential_origins: frozenset = frozenset()
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    insecure: bool = False
    key_source: str | None = None  # the variable the API key came from (None: no key sent)
    metrics_credentials: bool = False

    @classmethod
    def open(cls, base_url: str) -> "Connection":
        """A server with no credentials and no TLS options: one mtpbench launched on loopback."""
        base = base_url.rstrip("/")
        return cls(base, base + "/metrics")

    def headers(self, url: str) -> dict:
        """The headers for a request to ``url``: the credentials only if ``url`` is on an origin they were
        given for."""
        return dict(self.credentials) if origin(url) in self.credential_origins else {}

    def sends_credentials(self, url: str) -> bool:
        return bool(self.credentials) and origin(url) in self.credential_origins

    def for_server(self, base_url: str, metrics_url: str | None = None) -> "Connection":
        """The same credentials and TLS for another server the user named (check-lossless's baseline)."""
        base = base_url.rstrip("/")
        return Connection(base, metrics_url or base + "/metrics", self.credentials, self.credential_origins,
                          self.ssl_context, self.insecure, self.key_source, self.metrics_credentials)

    def notes(self) -> list[str]:
        return [INSECURE_NOTE] if self.insecure else []


def as_connection(target) -> Connection:
    """A ``Connection`` as given, or an open one for a bare base URL."""
    return target if isinstance(target, Connection) else Connection.open(target)


SECRET_HEADERS = ("authorization", "proxy-authorization", "cookie", "x-api-key", "api-key")


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` -> (name, value); MtpBenchError naming the header, never its value."""
    name, sep, value = text.partition(":")
    name = name.strip()
    if not sep or not _token(name):
        raise MtpBenchError(f"--header takes 'Name: value', got one without a valid name before ':' "
                            f"({name[:40]!r})" if sep else "--header takes 'Name: value' (no ':' in it)")
    if name.lower() in SECRET_HEADERS:
        raise MtpBenchError(f"--header {name}: a credential on the command line shows in ps and shell history: give "
                            f"it with --header-env '{name}=VAR'" + (" or OPENAI_API_KEY" if name.lower() == "authorization"
                                                                    else ""))
    if "\n" in value or "\r" in value:
        raise MtpBenchError(f"--header {name}: its value holds a line break")
    return name, value.strip()


def parse_header_env(text: str) -> tuple[str, str]:
    """``'Name=VAR'`` -> (name, VAR)."""
    name, sep, var = text.partition("=")
    name, var = name.strip(), var.strip()
    if not sep or not _token(name) or not _variable(var):
        # never echo the text: a value pasted in place of a variable's name is a secret
        raise MtpBenchError("--header-env takes 'Name=VAR' (a header name and the name of an environment variable "
                            "that holds its value)" + (f", got one for header {name!r}" if sep and _token(name) else ""))
    return name, var


def _variable(name: str | None) -> bool:
    """An environment variable's name (not a value pasted in its place)."""
    return bool(name) and (name[0].isalpha() or name[0] == "_") and all(c.isalnum() or c == "_" for c in name)


def _token(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in name)


def check_options(cfg, baseline_server: str | None = None) -> None:
    """The connection options: only with an attached server, and consistent. MtpBenchError (bad input)."""
    given = [name for name, on in (("--api-key-env", cfg.api_key_env), ("--header", cfg.header),
                                   ("--header-env", cfg.header_env), ("--ca-cert", cfg.ca_cert),
                                   ("--insecure", cfg.insecure), ("--metrics-url", cfg.metrics_url),
                                   ("--metrics-credentials", cfg.metrics_credentials)) if on]
    if given and not cfg.server:
        raise MtpBenchError(f"{', '.join(given)} describe a server you attach to (--server URL); a server "
                            "mtpbench launches is open on 127.0.0.1")
    if not cfg.server:
        return
    urls = [("--server", cfg.server), ("--baseline-server", baseline_server), ("--metrics-url", cfg.metrics_url)]
    for opt, url in urls:
        if url is None:
            continue
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise MtpBenchError(f"{opt} takes an http:// or https:// URL, got {url!r}")
        if u.username or u.password:
            raise MtpBenchError(f"{opt}: a URL with user:password@ in it would be written into the results; "
                                "give credentials with --header-env 'Authorization=VAR' or OPENAI_API_KEY")
    if cfg.ca_cert and cfg.insecure:
        raise MtpBenchError("--ca-cert verifies the server's certificate and --insecure skips verification: give one")
    if cfg.ca_cert and not os.path.isfile(cfg.ca_cert):
        raise MtpBenchError(f"--ca-cert {cfg.ca_cert}: no such file")
    if cfg.api_key_env is not None and not _variable(cfg.api_key_env):
        raise MtpBenchError("--api-key-env takes the name of an environment variable that holds the key, not the key "
                            "itself (which is not echoed here)")
    if cfg.metrics_credentials and not cfg.metrics_url:
        raise MtpBenchError("--metrics-credentials sends the credentials to --metrics-url's origin: give --metrics-url")
    missing = [n for n in cfg.header if n not in cfg.header_values]
    if missing:  # e.g. a profile that lists header names: their values come from the command line only
        raise MtpBenchError(f"header(s) {', '.join(missing)} have no value: give them with --header 'Name: value'")
    names = [n.lower() for n in (*cfg.header, *(parse_header_env(h)[0] for h in cfg.header_env))]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise MtpBenchError(f"header(s) given twice: {', '.join(dup)}")


def connect(cfg, baseline_server: str | None = None, environ=None) -> Connection:
    """The connection to ``cfg.server``: credentials from the environment and ``cfg.header_values``, sent to
    the origins of ``cfg.server`` and ``baseline_server`` (both named by the user), and to ``cfg.metrics_url``'s
    only with ``cfg.metrics_credentials``. MtpBenchError when a variable named is not set."""
    env = os.environ if environ is None else environ
    check_options(cfg, baseline_server)
    if (cfg.ca_cert or cfg.insecure) and not any(
            (url or "").startswith("https://") for url in (cfg.server, baseline_server, cfg.metrics_url)):
        raise MtpBenchError(f"{'--ca-cert' if cfg.ca_cert else '--insecure'} applies to https:// servers, and none "
                            "is given")
    creds = Hidden()
    key_var = cfg.api_key_env or API_KEY_ENV
    key = env.get(key_var)
    if cfg.api_key_env and not key:
        raise MtpBenchError(f"--api-key-env {key_var}: that environment variable is not set (or empty)")
    from_env = [parse_header_env(text) for text in cfg.header_env]
    if key and any(name.lower() == "authorization" for name, _ in from_env):
        raise MtpBenchError(f"Authorization is given twice: by the API key in {key_var} and by --header-env: give one")
    if key:
        creds["Authorization"] = f"Bearer {_one_line(key, key_var)}"
    for name in cfg.header:
        creds[name] = cfg.header_values[name]
    for name, var in from_env:
        if not env.get(var):
            raise MtpBenchError(f"--header-env {name}={var}: the environment variable {var} is not set (or empty)")
        creds[name] = _one_line(env[var], var)
    origins = {origin(cfg.server)} | ({origin(baseline_server)} if baseline_server else set())
    if cfg.metrics_url and cfg.metrics_credentials:
        origins.add(origin(cfg.metrics_url))
    base = cfg.server.rstrip("/")
    return Connection(base, cfg.metrics_url or base + "/metrics", creds, frozenset(origins),
                      ssl_context(cfg.ca_cert, cfg.insecure), cfg.insecure, key_var if key else None,
                      cfg.metrics_credentials)


def _one_line(value: str, var: str) -> str:
    """A header value from the environment, stripped; one holding a line break (a secret file's last newline
    inside the value, say) is refused, naming the variable, never the value."""
    value = value.strip()
    if "\n" in value or "\r" in value:
        raise MtpBenchError(f"the environment variable {var} holds a line break inside its value: a header value is "
                            "one line")
    return value


def ssl_context(ca_cert: str | None = None, insecure: bool = False) -> ssl.SSLContext:
    """Verified against the system store, or ``ca_cert``; ``insecure``: no verification at all."""
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=ca_cert)
    except (OSError, ssl.SSLError) as e:
        raise MtpBenchError(f"--ca-cert {ca_cert}: not a readable PEM certificate ({e})") from None


def tls_message(url: str, err) -> str:
    """One line for a TLS failure at ``url``: the verification error, and how to pass a CA."""
    reason = getattr(err, "verify_message", None) or getattr(err, "reason", None) or str(err)
    if isinstance(err, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(err):
        return (f"TLS verification of {url} failed ({reason}): give the CA that signed its certificate with "
                "--ca-cert FILE (or skip verification, knowingly, with --insecure)")
    return f"TLS with {url} failed ({reason})"
