"""Microsoft's sign-in side, for the Teams emulator: the hosts `login.botframework.com` and
`login.microsoftonline.com`, played over HTTPS through a proxy, so that the Agents SDK's own token code runs
unmodified against them.

The SDK fetches signing keys from URLs written into it, and MSAL insists on https, so nothing can be pointed
elsewhere by configuration. Instead a process gets `HTTPS_PROXY` (this module's CONNECT proxy) and a CA bundle
(`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`) holding a throwaway CA made at start: the proxy terminates TLS for the two
hosts with a certificate that CA signed and hands the plain requests to `LoginService`; it refuses every other
host. urllib (PyJWT's key fetching) and requests (MSAL) both honour those variables.

Served:
- login.botframework.com: `/v1/.well-known/openidconfiguration` and `/v1/.well-known/keys` (the channel's
  signing key, endorsed for "msteams"): what the bot checks an inbound activity's token against;
- login.microsoftonline.com: `/{tenant}/v2.0/.well-known/openid-configuration`, `/{tenant}/discovery/v2.0/keys`,
  `/{tenant}/oauth2/v2.0/token` (client credentials: the bot's token for the Bot Connector) and MSAL's instance
  discovery (`/common/discovery/instance`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import secrets
import ssl
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jwt
from aiohttp import web
from aiohttp.typedefs import Handler
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from jwt.algorithms import RSAAlgorithm

BOTFRAMEWORK_HOST = "login.botframework.com"
ENTRA_HOST = "login.microsoftonline.com"
LOGIN_HOSTS = (BOTFRAMEWORK_HOST, ENTRA_HOST)
CHANNEL_ISSUER = "https://api.botframework.com"
"""The issuer of the tokens on activities Teams sends, and the audience of the bot's Bot Connector token."""
CONNECTOR_SCOPE = f"{CHANNEL_ISSUER}/.default"
CLOCK_SKEW_S = 300
"""The Agents SDK accepts tokens this long past their expiry (PyJWT's leeway)."""
_CHANNEL_KEYS = f"https://{BOTFRAMEWORK_HOST}/v1/.well-known/keys"


class TokenKind(StrEnum):
    """The Authorization an activity is delivered with: the real thing, or one way of getting it wrong."""

    VALID = "valid"
    NONE = "none"
    """No Authorization header."""
    FORGED = "forged"
    """Signed by another key that claims the channel key's kid."""
    EXPIRED = "expired"
    """Expired longer ago than the clock skew the SDK allows."""
    WRONG_AUDIENCE = "wrong_audience"
    """Issued for another bot."""
    UNKNOWN_KID = "unknown_kid"
    """Signed by a key the published key set does not have."""


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass(frozen=True)
class SigningKey:
    """An RS256 key and its kid."""

    private: rsa.RSAPrivateKey
    kid: str = field(default_factory=lambda: secrets.token_urlsafe(20))

    def jwk(self, **extra: Any) -> dict[str, Any]:
        public = RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {
            "kty": "RSA",
            "use": "sig",
            "kid": self.kid,
            "x5t": self.kid,
            "n": public["n"],
            "e": public["e"],
        } | extra

    def sign(self, claims: Mapping[str, Any], *, kid: str | None = None) -> str:
        return jwt.encode(dict(claims), self.private, algorithm="RS256", headers={"kid": kid or self.kid})

    def verify(self, token: str, *, audience: str) -> dict[str, Any]:
        """The token's claims; raises jwt.PyJWTError when it is not this key's, expired or for another audience."""
        claims: dict[str, Any] = jwt.decode(token, self.private.public_key(), algorithms=["RS256"], audience=audience)
        return claims


_process_keys: dict[str, SigningKey] = {}


def process_key(name: str) -> SigningKey:
    """One signing key per purpose for the whole process, whichever emulator serves it. The SDK caches each key
    set URL's keys for the whole process (5 minutes), and PyJWT refetches a set for an unknown kid only 30 s
    after its last fetch: an emulator with keys of its own, started soon after another, would see its tokens
    refused by an in-process bot."""
    if name not in _process_keys:
        _process_keys[name] = SigningKey(_rsa_key())
    return _process_keys[name]


@dataclass(frozen=True)
class Certificates:
    """A throwaway CA and a server certificate it signed for the login hosts, written as PEM files to `folder`."""

    folder: Path

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def cert_file(self) -> Path:
        return self.folder / "login.pem"

    @property
    def key_file(self) -> Path:
        return self.folder / "login-key.pem"

    def write(self) -> None:
        now = dt.datetime.now(dt.UTC)
        ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Teams emulator test CA")])
        ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
        ca = (
            self._builder(ca_name, ca_name, ca_key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(self._usage(cert_sign=True), critical=True)
            .add_extension(ca_ski, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        leaf_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ENTRA_HOST)])
        leaf = (
            self._builder(leaf_name, ca_name, leaf_key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(self._usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in LOGIN_HOSTS]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        self.key_file.write_bytes(
            leaf_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    @staticmethod
    def _builder(
        subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: dt.datetime
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
        )

    @staticmethod
    def _usage(*, cert_sign: bool) -> x509.KeyUsage:
        return x509.KeyUsage(
            digital_signature=not cert_sign,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=cert_sign,
            crl_sign=cert_sign,
            encipher_only=False,
            decipher_only=False,
        )

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass(frozen=True)
class IssuedToken:
    """An access token the token endpoint handed out (time: time.monotonic())."""

    client_id: str
    scope: str
    token: str
    at: float


@dataclass(frozen=True)
class TokenRequest:
    """A request to the token endpoint, and the OAuth error it got (None when a token was issued)."""

    tenant: str
    form: dict[str, str]
    error: str | None
    at: float


def _oauth_error(status: int, error: str, description: str) -> web.Response:
    return web.json_response({"error": error, "error_description": description}, status=status)


class LoginService:
    """The two login hosts as one aiohttp application (told apart by the Host header the proxy passes on)."""

    def __init__(self, *, app_id: str, app_password: str, tenant_id: str, token_lifetime_s: int = 3600) -> None:
        self.app_id, self.app_password, self.tenant_id = app_id, app_password, tenant_id
        self.token_lifetime_s = token_lifetime_s
        self.channel_key = process_key("channel")
        """Signs the activities Teams delivers (published by login.botframework.com)."""
        self.entra_key = process_key("entra")
        """Signs the access tokens the bot gets (published by login.microsoftonline.com)."""
        self.issued: list[IssuedToken] = []
        self.token_requests: list[TokenRequest] = []
        self.fetches: list[tuple[str, str]] = []
        """(host, path) of every request, in order."""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._by_host])
        app.router.add_get("/v1/.well-known/openidconfiguration", self._channel_openid)
        app.router.add_get("/v1/.well-known/keys", self._channel_keys)
        app.router.add_get("/common/discovery/instance", self._entra_instances)
        app.router.add_get("/{tenant}/v2.0/.well-known/openid-configuration", self._entra_openid)
        app.router.add_get("/{tenant}/discovery/v2.0/keys", self._entra_keys)
        app.router.add_post("/{tenant}/oauth2/v2.0/token", self._token)
        return app

    @web.middleware
    async def _by_host(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Records the request; each host serves only its own paths."""
        host = request.host.split(":")[0]
        self.fetches.append((host, request.path))
        if host != (BOTFRAMEWORK_HOST if request.path.startswith("/v1/") else ENTRA_HOST):
            return web.json_response({"error": "not_found"}, status=404)
        return await handler(request)

    # -- login.botframework.com ------------------------------------------------------------------------------

    async def _channel_openid(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": CHANNEL_ISSUER,
                "authorization_endpoint": "https://invalid.botframework.com",
                "jwks_uri": _CHANNEL_KEYS,
                "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": ["private_key_jwt"],
            }
        )

    async def _channel_keys(self, request: web.Request) -> web.Response:
        return web.json_response({"keys": [self.channel_key.jwk(endorsements=["msteams"])]})

    # -- login.microsoftonline.com ---------------------------------------------------------------------------

    def _known_tenant(self, request: web.Request) -> str | None:
        tenant = request.match_info["tenant"]
        return tenant if tenant == self.tenant_id else None

    async def _entra_instances(self, request: web.Request) -> web.Response:
        """Instance discovery: MSAL asks for the host's aliases before looking in its token cache."""
        aliases = [ENTRA_HOST, "login.windows.net", "login.microsoft.com", "sts.windows.net"]
        metadata = {"preferred_network": ENTRA_HOST, "preferred_cache": "login.windows.net", "aliases": aliases}
        discovery = f"https://{ENTRA_HOST}/common/v2.0/.well-known/openid-configuration"
        return web.json_response({"tenant_discovery_endpoint": discovery, "api-version": "1.1", "metadata": [metadata]})

    async def _entra_openid(self, request: web.Request) -> web.Response:
        tenant = self._known_tenant(request)
        if tenant is None:
            return _oauth_error(400, "invalid_tenant", f"Tenant '{request.match_info['tenant']}' not found.")
        base = f"https://{ENTRA_HOST}/{tenant}"
        return web.json_response(
            {
                "issuer": f"{base}/v2.0",
                "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                "token_endpoint": f"{base}/oauth2/v2.0/token",
                "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
                "jwks_uri": f"{base}/discovery/v2.0/keys",
                "token_endpoint_auth_methods_supported": [
                    "client_secret_post",
                    "private_key_jwt",
                    "client_secret_basic",
                ],
                "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
                "subject_types_supported": ["pairwise"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "tenant_region_scope": "EU",
            }
        )

    async def _entra_keys(self, request: web.Request) -> web.Response:
        if self._known_tenant(request) is None:
            return _oauth_error(400, "invalid_tenant", "Tenant not found.")
        return web.json_response({"keys": [self.entra_key.jwk()]})

    async def _token(self, request: web.Request) -> web.Response:
        form = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
        response, error = self._grant(request, form)
        self.token_requests.append(TokenRequest(request.match_info["tenant"], form, error, time.monotonic()))
        return response

    def _grant(self, request: web.Request, form: dict[str, str]) -> tuple[web.Response, str | None]:
        """Client credentials, as Entra answers them (AADSTS codes left out: the SDK shows the description)."""
        if self._known_tenant(request) is None:
            return _oauth_error(400, "invalid_request", "Tenant not found."), "invalid_request"
        if form.get("grant_type") != "client_credentials":
            return _oauth_error(400, "unsupported_grant_type", "Only client_credentials."), "unsupported_grant_type"
        if form.get("client_id") != self.app_id or form.get("client_secret") != self.app_password:
            return _oauth_error(401, "invalid_client", "Invalid client secret provided."), "invalid_client"
        scope = form.get("scope", "")
        if CONNECTOR_SCOPE not in scope.split():
            return _oauth_error(400, "invalid_scope", f"The scope '{scope}' is not valid."), "invalid_scope"
        token = self.access_token()
        self.issued.append(IssuedToken(self.app_id, CONNECTOR_SCOPE, token, time.monotonic()))
        lifetime = self.token_lifetime_s
        body = {"token_type": "Bearer", "expires_in": lifetime, "ext_expires_in": lifetime, "access_token": token}
        return web.json_response(body), None

    def access_token(self, *, lifetime_s: int | None = None) -> str:
        """A Bot Connector access token for the bot, as the token endpoint issues it (v1 shape, as Entra gives
        for api.botframework.com)."""
        now = int(time.time())
        claims = {
            "aud": CHANNEL_ISSUER,
            "iss": f"https://sts.windows.net/{self.tenant_id}/",
            "iat": now,
            "nbf": now,
            "exp": now + (self.token_lifetime_s if lifetime_s is None else lifetime_s),
            "appid": self.app_id,
            "appidacr": "1",
            "idp": f"https://sts.windows.net/{self.tenant_id}/",
            "tid": self.tenant_id,
            "oid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"sp:{self.app_id}")),
            "sub": str(uuid.uuid5(uuid.NAMESPACE_URL, f"sp:{self.app_id}")),
            "ver": "1.0",
        }
        return self.entra_key.sign(claims)

    def bearer_problem(self, token: str) -> str | None:
        """Why the Bot Connector refuses this bearer token, or None: it must be the token endpoint's, for the bot."""
        try:
            claims = self.entra_key.verify(token, audience=CHANNEL_ISSUER)
        except jwt.PyJWTError as exc:
            return f"{type(exc).__name__}: {exc}"
        if claims.get("appid") != self.app_id:
            return "a token for another app"
        return None

    # -- tokens on activities --------------------------------------------------------------------------------

    def channel_token(self, kind: TokenKind, *, service_url: str) -> str | None:
        """The bearer token Teams puts on an activity it delivers to the bot, or one of its broken variants."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "serviceurl": service_url,
            "nbf": now - 60,
            "exp": now + 3600,
            "iss": CHANNEL_ISSUER,
            "aud": self.app_id,
            "appid": self.app_id,
        }
        match kind:
            case TokenKind.NONE:
                return None
            case TokenKind.VALID:
                return self.channel_key.sign(claims)
            case TokenKind.FORGED:
                return process_key("forger").sign(claims, kid=self.channel_key.kid)
            case TokenKind.EXPIRED:
                expired = now - CLOCK_SKEW_S - 60
                return self.channel_key.sign(claims | {"nbf": expired - 3600, "exp": expired})
            case TokenKind.WRONG_AUDIENCE:
                return self.channel_key.sign(claims | {"aud": str(uuid.uuid4())})
            case TokenKind.UNKNOWN_KID:
                return self.channel_key.sign(claims, kid=hashlib.sha256(self.channel_key.kid.encode()).hexdigest())


_sticky_ports: dict[str, int] = {}
"""The port each kind of listener last had in this process. urllib builds its default opener, proxies included,
once per process (on its first request); an emulator started later binds the port the first one had, so that
an in-process bot's key fetches still reach the running emulator."""


async def _start_sticky_server(
    name: str, handler: Any, **kwargs: Any
) -> tuple[asyncio.Server, int]:  # handler: asyncio's client-connected callback
    wanted = _sticky_ports.get(name, 0)
    try:
        server = await asyncio.start_server(handler, "127.0.0.1", wanted, **kwargs)
    except OSError:  # still taken (another emulator running at once): any port
        server = await asyncio.start_server(handler, "127.0.0.1", 0, **kwargs)
    port = int(server.sockets[0].getsockname()[1])
    _sticky_ports.setdefault(name, port)
    return server, port


class TlsProxy:
    """An HTTP CONNECT proxy that terminates TLS for the login hosts (with `certificates`) and passes the
    requests to `upstream_port` on 127.0.0.1; CONNECT to any other host gets 403, recorded in `refused`."""

    def __init__(self, certificates: Certificates, upstream_port: int) -> None:
        self._tls = certificates.server_context()
        self._upstream_port = upstream_port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.tunnels: list[str] = []
        """The host:port of every tunnel opened."""
        self.refused: list[str] = []
        self.forwarded: list[str] = []
        """Plain requests passed on to a server on this machine."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server, self.port = await _start_sticky_server("proxy", self._client)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._server = None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._tunnel(reader, writer)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the client went away or spoke nonsense: nothing to answer
        except asyncio.CancelledError:
            pass  # stop(): asyncio's stream server would log a cancelled handler as an error
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        method, _, rest = head.decode("latin-1").partition(" ")
        target = rest.split(" ", 1)[0]
        if method != "CONNECT" and (local := _loopback(target)) is not None:
            # A plain request for a local server (the Slack emulator, through a client that honours HTTPS_PROXY
            # but not NO_PROXY, as slack_sdk does): forwarded as any proxy would.
            self.forwarded.append(target)
            up_reader, up_writer = await asyncio.open_connection(*local)
            try:
                up_writer.write(head)
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
            return
        host, _, port = target.rpartition(":")
        if method != "CONNECT" or host.lower() not in LOGIN_HOSTS or port != "443":
            self.refused.append(target)
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            return
        self.tunnels.append(target)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await writer.start_tls(self._tls)  # server side: this stream came from start_server
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()


def _loopback(target: str) -> tuple[str, int] | None:
    """The host and port of an absolute http:// URL on this machine, else None."""
    url = urlsplit(target)
    if url.scheme != "http" or url.hostname not in ("127.0.0.1", "localhost") or url.port is None:
        return None
    return url.hostname, url.port


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()


class SignInHosts:
    """`LoginService` and the proxy in front of it, on an event loop in a thread of their own: MsalAuth builds
    its MSAL client (whose constructor fetches the OpenID configuration) synchronously on the caller's event
    loop, so hosts served from that same loop would never answer it."""

    def __init__(self, login: LoginService, certificates: Certificates) -> None:
        self.login, self.certificates = login, certificates
        self.proxy: TlsProxy | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    def start(self) -> None:
        """Blocks until both listen (call it through asyncio.to_thread from async code)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="teams-sign-in", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.login.app(), shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.proxy = TlsProxy(self.certificates, int(self._runner.addresses[0][1]))
        await self.proxy.start()

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
        self._loop = self._thread = None

    async def _stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        if self._runner is not None:
            await self._runner.cleanup()
