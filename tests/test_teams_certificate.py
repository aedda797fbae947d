"""Teams with a certificate instead of a client secret (CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CERTPFXFILE):
checked at start-up, and handed to the Agents SDK's MSAL credentials, whose token request is read at the Teams
emulator's sign-in host. The emulator grants tokens for the client secret only, so the request is refused there;
what is checked is that it carries an assertion signed by the certificate, as Entra wants it."""

from __future__ import annotations

import datetime as dt
import hashlib
from base64 import urlsafe_b64encode
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID
from microsoft_agents.authentication.msal import MsalAuth
from microsoft_agents.hosting.core.authorization import AuthTypes

from bot.cli import main
from bot.settings import Settings, env_name, get_settings
from bot.teams.wiring import teams_credentials
from fakes.teams_api import TeamsEmulator
from fakes.teams_identity import CONNECTOR_SCOPE, ENTRA_HOST
from harness import teams as h

SDK = "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__"


def certificate() -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "helpdesk-bot")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return key, cert


def pfx(path: Path, *, password: bytes | None = None) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key, cert = certificate()
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    path.write_bytes(pkcs12.serialize_key_and_certificates(b"bot", key, cert, None, encryption))
    return key, cert


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.chdir(tmp_path)
    for name in Settings.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)
    monkeypatch.setenv(f"{SDK}CLIENTID", h.APP_ID)
    monkeypatch.setenv(f"{SDK}TENANTID", h.TENANT_ID)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_the_certificate_becomes_the_sdks_certificate_connection(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pfx(tmp_path / "bot.pfx")
    env.setenv(f"{SDK}CERTPFXFILE", str(tmp_path / "bot.pfx"))
    settings = Settings()
    assert settings.teams_configured and settings.teams_app_password is None
    config = teams_credentials(settings)
    auth, secret, certificate_file = config.AUTH_TYPE, config.CLIENT_SECRET, config.CERT_PFX_FILE
    assert (auth, secret, certificate_file) == (AuthTypes.certificate, None, str(tmp_path / "bot.pfx"))
    env.delenv(f"{SDK}CERTPFXFILE")
    env.setenv(f"{SDK}CLIENTSECRET", "s3cret")
    config = teams_credentials(Settings())
    auth, secret, certificate_file = config.AUTH_TYPE, config.CLIENT_SECRET, config.CERT_PFX_FILE
    assert (auth, secret, certificate_file) == (AuthTypes.client_secret, "s3cret", None)


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ({"CERTPFXFILE": "{dir}/bot.pfx", "CLIENTSECRET": "s3cret"}, "set one Teams credential"),
        ({}, "also set CONNECTIONS__SERVICE_CONNECTION__SETTINGS__CLIENTSECRET (or …__CERTPFXFILE)"),
        ({"CERTPFXFILE": "{dir}/absent.pfx"}, "CERTPFXFILE={dir}/absent.pfx: no such file"),
        ({"CERTPFXFILE": "{dir}/locked.pfx"}, "not a PKCS#12 (.pfx) file without a password"),
        ({"CERTPFXFILE": "{dir}/cert.pem"}, "not a PKCS#12 (.pfx) file without a password"),
    ],
)
def test_a_certificate_the_sdk_could_not_use_stops_the_start(
    variables: dict[str, str],
    says: str,
    env: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, cert = pfx(tmp_path / "bot.pfx")
    pfx(tmp_path / "locked.pfx", password=b"secret")
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    for name, value in variables.items():
        env.setenv(SDK + name, value.format(dir=tmp_path))
    assert main(["migrate"]) == 2
    assert says.format(dir=tmp_path) in capsys.readouterr().err


async def test_the_sdks_token_request_is_signed_by_the_certificate(
    teams: TeamsEmulator, env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key, cert = pfx(tmp_path / "bot.pfx")
    env.setenv(f"{SDK}CERTPFXFILE", str(tmp_path / "bot.pfx"))
    credentials = MsalAuth(teams_credentials(Settings()))
    with pytest.raises(ValueError, match="invalid_client"):  # the emulator takes client secrets only
        await credentials.get_access_token("https://api.botframework.com", [CONNECTOR_SCOPE])
    [request] = teams.login.token_requests
    form = request.form
    assert "client_secret" not in form and form["client_id"] == h.APP_ID
    assert form["client_assertion_type"] == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    endpoint = f"https://{ENTRA_HOST}/{h.TENANT_ID}/oauth2/v2.0/token"
    claims = jwt.decode(form["client_assertion"], key.public_key(), algorithms=["PS256", "RS256"], audience=endpoint)
    assert claims["iss"] == claims["sub"] == h.APP_ID
    header = jwt.get_unverified_header(form["client_assertion"])
    thumbprint = urlsafe_b64encode(hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).digest())
    assert header["x5t#S256"].rstrip("=") == thumbprint.decode().rstrip("=")
