"""The approver registry: ``durable approvers add|list|revoke|keygen``.

An operator registers each approver's public key with its roles; an approver signs
decisions with the private key (``durable approve ... --approver NAME --key FILE``).
Rotating a key: ``keygen`` a new one, ``add`` it under a new name, then ``revoke`` the old.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from durable.approvals import NAME_RE, Approvers, fingerprint, keygen, load_public_key
from durable.cli.output import OK, Add, client, json_out, local_time, table
from durable.errors import UsageError


def read_key_file(path: str) -> bytes:
    """A key file's bytes, or a one-line ``UsageError``."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read key file {path}: {exc.strerror or exc}") from None


def cmd_add(args: argparse.Namespace) -> int:
    public = load_public_key(read_key_file(args.public_key))
    entry = Approvers(client().redis).add(args.name, args.role, public, by=args.by)
    if args.json:
        json_out({"name": entry.name, "roles": entry.roles, "key": entry.fingerprint})
    else:
        print(f"approver {entry.name}: roles {', '.join(entry.roles)}, key {entry.fingerprint}")
    return OK


def cmd_list(args: argparse.Namespace) -> int:
    found = Approvers(client().redis).list()
    if args.json:
        for a in found:
            json_out({"name": a.name, "roles": a.roles, "key": a.fingerprint, "added": a.added,
                      "by": a.by, "revoked": a.revoked})
        return OK
    table("approvers", ["name", "roles", "key", "added", "status"],
          [(a.name, ", ".join(a.roles), a.fingerprint, local_time(a.added),
            f"revoked {local_time(a.revoked)}" if a.revoked else "active") for a in found])
    return OK


def cmd_revoke(args: argparse.Namespace) -> int:
    entry = Approvers(client().redis).revoke(args.name)
    if args.json:
        json_out({"name": entry.name, "key": entry.fingerprint, "revoked": entry.revoked})
    else:
        print(f"approver {entry.name}: key {entry.fingerprint} revoked")
    return OK


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
    print(f"an operator registers it: durable approvers add {args.name} --role ROLE "
          f"--public-key {public_path}")
    return OK


def register(add: Add) -> None:
    sp = add("approvers", None, "the approver registry: add, list, revoke keys; keygen",
             js=False)
    verbs = sp.add_subparsers(dest="verb", required=True, parser_class=type(sp))

    def verb(name: str, fn: object, help: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help, description=help)
        p.set_defaults(fn=fn)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    p = verb("add", cmd_add, "register an approver's public key with its roles")
    p.add_argument("name")
    p.add_argument("--role", action="append", required=True,
                   help="a role the approver holds (repeat for several)")
    p.add_argument("--public-key", required=True, metavar="FILE",
                   help="Ed25519 public key: PEM, OpenSSH or base64 of the raw bytes")
    p.add_argument("--by", default="operator", help="who registers it (recorded)")
    verb("list", cmd_list, "registered approvers, their roles and keys")
    p = verb("revoke", cmd_revoke, "revoke an approver's key (its decisions stop counting)")
    p.add_argument("name")
    p = verb("keygen", cmd_keygen,
             "make a key pair: NAME.key (private, 0600) and NAME.pub in --dir")
    p.add_argument("name")
    p.add_argument("--dir", default=".", help="where to write the files (default: here)")
