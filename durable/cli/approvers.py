"""The approver registry: ``durable approvers add|grant|revoke|resign|remove|list|keygen``.

An admin registers each approver's public key with its roles, signing the entry with the
admin private key (``--admin-key FILE``); every process trusts only entries signed by a key
of its ``DURABLE_ADMIN_KEYS``. An approver signs decisions with its own private key
(``durable approve ... --approver NAME --key FILE``). Rotating an approver's key:
``keygen`` a new one, ``add`` it under a new name, then ``revoke`` the old. Rotating the
admin key: list the new public key beside the old in ``DURABLE_ADMIN_KEYS`` everywhere,
``resign --admin-key NEW.key``, then drop the old key.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from durable.cli.output import CHECK_FAILED, OK, Add, client, json_out, local_time, table
from durable.controls.approvers import NAME_RE, Approver, Approvers
from durable.errors import UsageError
from durable.security.signing import (
    fingerprint,
    keygen,
    load_private_key,
    load_public_key,
    read_key_file,
)


def registry() -> Approvers:
    return client().approvers


def admin_key(args: argparse.Namespace) -> bytes:
    """The admin private key file's bytes (checked: a bad file is a usage error first)."""
    pem = read_key_file(args.admin_key)
    load_private_key(pem)
    return pem


def said(entry: Approver, what: str, args: argparse.Namespace) -> int:
    if args.json:
        json_out({"name": entry.name, "roles": entry.roles, "key": entry.fingerprint,
                  "revoked": entry.revoked, "admin_key": entry.admin_key})
    else:
        print(f"approver {entry.name}: {what}")
    return OK


def cmd_add(args: argparse.Namespace) -> int:
    public = load_public_key(read_key_file(args.public_key))
    entry = registry().add(args.name, args.role, public, admin_key=admin_key(args), by=args.by)
    return said(entry, f"roles {', '.join(entry.roles)}, key {entry.fingerprint}, signed by "
                       f"admin key {entry.admin_key}", args)


def cmd_grant(args: argparse.Namespace) -> int:
    entry = registry().grant(args.name, args.role, admin_key=admin_key(args))
    return said(entry, f"roles now {', '.join(entry.roles)}", args)


def cmd_revoke(args: argparse.Namespace) -> int:
    entry = registry().revoke(args.name, admin_key=admin_key(args))
    return said(entry, f"key {entry.fingerprint} revoked", args)


def cmd_remove(args: argparse.Namespace) -> int:
    entry = registry().remove_untrusted(args.name)
    return said(entry, f"removed an untrusted entry ({entry.distrust})", args)


def cmd_resign(args: argparse.Namespace) -> int:
    done, left = registry().resign(admin_key(args), adopt=args.adopt or ())
    if args.json:
        json_out({"resigned": [a.name for a in done], "left": left})
    else:
        for a in done:
            print(f"approver {a.name}: re-signed by admin key {a.admin_key} (key "
                  f"{a.fingerprint}, roles {', '.join(a.roles)})")
        for name, why in left.items():
            print(f"approver {name}: left alone: {why}", file=sys.stderr)
    return CHECK_FAILED if left else OK


def cmd_list(args: argparse.Namespace) -> int:
    found = registry().list()
    if args.json:
        for a in found:
            json_out({"name": a.name, "roles": a.roles, "key": a.fingerprint, "added": a.added,
                      "by": a.by, "revoked": a.revoked, "admin_key": a.admin_key,
                      "trusted": not a.distrust, "distrust": a.distrust})
        return OK
    table("approvers", ["name", "roles", "key", "added", "status"],
          [(a.name, ", ".join(a.roles), a.fingerprint, local_time(a.added), status(a))
           for a in found])
    return OK


def status(a: Approver) -> str:
    if a.distrust:
        return f"UNTRUSTED: {a.distrust}"
    return f"revoked {local_time(a.revoked)}" if a.revoked else "active"


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write NAME.key (PEM private key, mode 0600) and NAME.pub (PEM public key) in DIR."""
    if not NAME_RE.match(args.name):
        raise UsageError(f"invalid approver name {args.name!r}: use 1-64 of A-Z a-z 0-9 _ . @ -")
    where = Path(args.dir)
    private_path, public_path = where / f"{args.name}.key", where / f"{args.name}.pub"
    for path in (private_path, public_path):
        if path.exists():
            raise UsageError(f"{path} exists already; nothing written")
    private, public = keygen()
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(private)
        public_path.write_bytes(public)
    except OSError as exc:
        raise UsageError(f"cannot write the key files in {where}: "
                         f"{exc.strerror or exc}") from None
    key = fingerprint(load_public_key(public))
    if args.json:
        json_out({"name": args.name, "private_key": str(private_path),
                  "public_key": str(public_path), "key": key})
        return OK
    sys.stdout.write(public.decode())
    print(f"wrote {private_path} (private, mode 0600: keep it to yourself) and {public_path}; "
          f"key {key}")
    print(f"an admin registers it: durable approvers add {args.name} --role ROLE "
          f"--public-key {public_path} --admin-key ADMIN.key")
    return OK


def register(add: Add) -> None:
    sp = add("approvers", None,
             "the approver registry: add, grant, revoke, resign, remove, list; keygen",
             js=False)
    verbs = sp.add_subparsers(dest="verb", required=True, parser_class=type(sp))

    def verb(name: str, fn: object, help: str, *, admin: bool = False) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help, description=help)
        p.set_defaults(fn=fn)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if admin:
            p.add_argument("--admin-key", required=True, metavar="FILE",
                           help="the admin's Ed25519 private key (its public half must be "
                                "one of DURABLE_ADMIN_KEYS)")
        return p

    p = verb("add", cmd_add, "register an approver's public key with its roles", admin=True)
    p.add_argument("name")
    p.add_argument("--role", action="append", required=True,
                   help="a role the approver holds (repeat for several)")
    p.add_argument("--public-key", required=True, metavar="FILE",
                   help="Ed25519 public key: PEM, OpenSSH or base64 of the raw bytes")
    p.add_argument("--by", default="operator", help="who registers it (recorded)")
    p = verb("grant", cmd_grant, "add roles to an active approver", admin=True)
    p.add_argument("name")
    p.add_argument("--role", action="append", required=True, help="a role to add (repeat)")
    p = verb("revoke", cmd_revoke, "revoke an approver's key (its decisions stop counting)",
             admin=True)
    p.add_argument("name")
    p = verb("resign", cmd_resign,
             "re-sign every trusted entry with a new admin key (admin key rotation)",
             admin=True)
    p.add_argument("--adopt", action="append", metavar="NAME",
                   help="also sign this untrusted entry (checked by hand: its fingerprint)")
    p = verb("remove", cmd_remove, "delete an entry no admin key vouches for")
    p.add_argument("name")
    verb("list", cmd_list, "registered approvers, their roles, keys and trust")
    p = verb("keygen", cmd_keygen,
             "make a key pair: NAME.key (private, 0600) and NAME.pub in --dir")
    p.add_argument("name")
    p.add_argument("--dir", default=".", help="where to write the files (default: here)")
