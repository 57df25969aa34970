"""An admin key for a test's approver registry (``durable.controls.approvers``).

Every process trusts approver entries signed by a key of ``DURABLE_ADMIN_KEYS``; a test
makes one key pair, puts its public half in the environment its processes inherit, and signs
the approvers it registers with the private half::

    admin = AdminKey.make()
    monkeypatch.setenv("DURABLE_ADMIN_KEYS", admin.public)
    client.approvers.add("alice", ["finance"], alice_public, admin_key=admin.private)
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from durable.security.signing import fingerprint, keygen, load_public_key


@dataclass(frozen=True)
class AdminKey:
    #: PEM (PKCS#8) private key: what ``admin_key=`` and ``--admin-key`` take.
    private: bytes
    #: Base64 of the raw public key: an item of ``DURABLE_ADMIN_KEYS``.
    public: str

    @classmethod
    def make(cls) -> AdminKey:
        private, public_pem = keygen()
        return cls(private, base64.b64encode(load_public_key(public_pem)).decode())

    @property
    def fingerprint(self) -> str:
        return fingerprint(base64.b64decode(self.public))
