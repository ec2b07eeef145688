"""Loopback proxies for the secured-server tests: what stands between a user and a production vLLM server.

``Proxy(upstream_port)`` listens on 127.0.0.1 and forwards every connection to ``127.0.0.1:upstream_port``:

* ``tls=TestCA(...)``: it speaks HTTPS to the client (a TLS terminator), plain HTTP upstream;
* every request's method, path and headers are recorded in ``proxy.requests`` (a recording proxy);
* ``allow=GATEWAY_PATHS``: only those paths are forwarded, every other one (``/metrics``) gets a 404 and the
  connection is closed (a gateway).

Requests are parsed one by one (request line, headers, then a body of ``Content-Length`` bytes or chunked), so
a keep-alive connection that carries several requests is recorded and filtered request by request. Responses
are not parsed: upstream's bytes go back as they come, so a streamed (SSE) response streams through. This
relies on the client not pipelining requests (aiohttp and urllib do not): a client sends its next request
on a connection only after it has read the previous response, which is what makes the 404 safe to write.
Nothing is written to disk but the certificates.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

NOT_FOUND = (b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n"
             b"Connection: close\r\n\r\nnot found\n")


def gateway_paths(path: str) -> bool:
    """A gateway that exposes the OpenAI routes (and the health and version probes), not /metrics."""
    path = path.split("?", 1)[0]
    return path.startswith("/v1/") or path in ("/health", "/version")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value


@dataclass
class TestCA:
    """A CA and a server certificate for 127.0.0.1 and localhost, signed by it, written to ``directory``.
    Clients trust ``ca_path``; the terminator serves ``cert_path`` with ``key_path``."""

    directory: Path
    ca_path: Path = field(init=False)
    cert_path: Path = field(init=False)
    key_path: Path = field(init=False)

    __test__ = False  # not a pytest test class

    def __post_init__(self):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.timezone.utc)
        ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mtpbench test CA")])
        # the extensions Python's default context checks under VERIFY_X509_STRICT (3.13 and newer)
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                           crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                            x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                               critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                             crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_path, self.cert_path, self.key_path = (self.directory / n for n in ("ca.pem", "server.pem", "server.key"))
        self.ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_path, self.key_path)
        return ctx


def parse_head(head: bytes) -> Request:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return Request(method, path, headers)


async def copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: dict[str, str]) -> None:
    """Forward one request's body, as its headers frame it."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = await reader.readuntil(b"\r\n")
            writer.write(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:  # trailers, then the blank line
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    writer.write(line)
                writer.write(line)
                break
            writer.write(await reader.readexactly(size + 2))
            await writer.drain()
    else:
        left = int(headers.get("content-length", "0"))
        while left:
            data = await reader.read(min(left, 1 << 16))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            writer.write(data)
            left -= len(data)
            await writer.drain()
    await writer.drain()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Upstream's bytes back to the client as they arrive; upstream closing closes the client's connection."""
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


class Proxy:
    """A loopback proxy to ``127.0.0.1:upstream_port``, running in a thread of its own while the ``with``
    block lasts. ``url`` is where clients connect (``https://`` with ``tls``)."""

    def __init__(self, upstream_port: int, tls: TestCA | None = None, allow=None):
        self.upstream_port = upstream_port
        self.tls = tls
        self.allow = allow
        self.requests: list[Request] = []
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> "Proxy":
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10) or self.port is None:
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        ctx = self.tls.server_context() if self.tls else None
        try:
            server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=ctx))
            self.port = server.sockets[0].getsockname()[1]
        finally:
            ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        back = asyncio.create_task(pipe(up_reader, writer))
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request = parse_head(head)
                self.requests.append(request)
                if self.allow is not None and not self.allow(request.path):
                    writer.write(NOT_FOUND)
                    await writer.drain()
                    break
                up_writer.write(head)
                await copy_body(reader, up_writer, request.headers)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError, ValueError):
            pass  # the client closed the connection (or spoke no HTTP): so does the proxy
        finally:
            back.cancel()
            up_writer.close()
            writer.close()
