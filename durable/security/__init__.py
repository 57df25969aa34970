"""Keys, seals and digests: what makes evidence trustworthy and secrets unreadable at rest.

- ``signing``: Ed25519 keys and signatures (approvers' decisions, the registry's admins);
- ``sealing``: AES-GCM seals of sensitive fields, written and read with the log;
- ``digests``: the digest an approval is bound to, over the action's consequential fields;
- ``users``: the console's users file (scrypt password hashes, roles), also read by
  ``durable a2a`` and ``durable mcp``;
- ``callers``: who calls a front door over HTTP (``durable mcp``): bearer tokens per tenant,
  or the console's operators.
"""
