"""Redis's work per run, counted in instructions: ``python -m bench.scriptcost``.

Redis's CPU per run (``bench.styles``) moves by 10-20 % with the machine's load; the
instructions Redis executes do not. This item runs one styles row (``--agent``, ``--runs``
queued first, 2 workers), records every command sent to Redis (the producer's starts, by
patching this process; each worker's, by the ``Recorder`` worker hook), and replays them,
in the order they were sent, into a fresh ``redis-server`` (the embedded server's binary)
run under valgrind's callgrind, counting only inside command execution (``call``). It
reports the instructions per run of the starts and of the run itself (from the workers'
SIGCONT to the last append), the latter against the floor's record of the same run
(``bench.cpufloor``, counted the same way), and its share inside script calls
(``EVALSHA``). What it leaves out: reading and writing sockets, which depends on how the
calls were pipelined (the replay sends 50 at a time).

``--variant FILE``: the same replay with ``append.lua`` replaced by FILE (same call header),
to measure what a change to the script buys before making it. ``--what-if``: the replay
once more for each change of :data:`WHAT_IF`, each a product decision: the record a run
would lose is named with it.

    python -m bench.scriptcost [--agent async_count] [--runs 1000] [--what-if] [--variant F]

Needs valgrind (Debian's ``valgrind`` package). About 30 s per replay of 1,000 runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hiredis
import redis
from redis.connection import AbstractConnection

#: A record: when it was sent (``time.monotonic_ns``, one clock for every process) and the
#: length of the bytes that follow (one or more commands, as sent).
RECORD = struct.Struct("=QI")

#: Commands not replayed: connection set-up, blocking pops, pub/sub, the bench's own resets
#: (none of them is work a run makes Redis do).
SKIP = frozenset({b"HELLO", b"CLIENT", b"BLMOVE", b"BLPOP", b"BRPOP", b"BZPOPMIN",
                  b"SUBSCRIBE", b"UNSUBSCRIBE", b"PSUBSCRIBE", b"PUNSUBSCRIBE", b"FLUSHALL",
                  b"FLUSHDB", b"BGREWRITEAOF", b"CONFIG", b"SHUTDOWN", b"MULTI", b"EXEC",
                  b"WATCH", b"UNWATCH", b"DISCARD"})

#: Commands per pipeline of the replay.
PIPELINE = 50

#: Changes to ``append.lua`` measured by ``--what-if``: (name, what a run's record would
#: lose, [(text of the script, its replacement)]).
WHAT_IF: tuple[tuple[str, str, list[tuple[str, str]]], ...] = (
    ("no hash chain", "the log is no longer tamper-evident (``durable verify``)",
     [("local link = redis.sha1hex(chain .. id .. '\\n' .. data)", "local link = chain")]),
    ("no counters in the script", "counters no longer move in the call of their events",
     [("  redis.call('HINCRBY', metrics_key, field, amount)", "  local _ = amount")]),
    ("state index scored on a state change only",
     "the state indexes' scores are when the run entered the state, not its last update",
     [("redis.call('ZADD', new_index_key, now, run_id)\n",
       "if old_state ~= new_state or TERMINAL[new_state] then\n"
       "  redis.call('ZADD', new_index_key, now, run_id)\nend\n")]),
    ("no index by update time", "no listing of all runs by last update",
     [("redis.call('ZADD', runs_key, now, run_id)\n", "")]),
    ("no compaction", "a 4-step run's log keeps ~1.3 KB per step instead of ~0.4 KB",
     [("if TERMINAL[new_state] and new_version <= compact_max then",
       "if false and compact_max then")]),
)

_lock = threading.Lock()
_fd: int | None = None
_original = AbstractConnection.send_packed_command


def _recording(self: Any, command: Any, check_health: bool = True) -> Any:
    fd = _fd
    if fd is not None:
        parts = [command] if isinstance(command, (bytes, str, memoryview)) else command
        data = b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts)
        os.write(fd, RECORD.pack(time.monotonic_ns(), len(data)) + data)  # one write: whole
    return _original(self, command, check_health)


def _install(path: Path) -> None:
    global _fd, _original
    with _lock:
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
        current = AbstractConnection.send_packed_command
        if current is not _recording:  # (another hook, bench.rtcount, may have patched it)
            _original = current
            AbstractConnection.send_packed_command = _recording


def _uninstall() -> None:
    global _fd
    with _lock:
        if _fd is not None:
            os.close(_fd)
            _fd = None
        AbstractConnection.send_packed_command = _original


class Recorder:
    """The worker hook: ``durable worker --hook bench.scriptcost:Recorder=PATH`` appends
    every command the worker sends to ``PATH``."""

    def __init__(self, path: str) -> None:
        _install(Path(path))


def commands(paths: list[Path]) -> list[tuple[int, list[bytes]]]:
    """Every recorded command of ``paths``, in the order sent: (when, its arguments)."""
    out: list[tuple[int, list[bytes]]] = []
    for path in paths:
        raw = path.read_bytes()
        at = 0
        while at + RECORD.size <= len(raw):
            when, size = RECORD.unpack_from(raw, at)
            at += RECORD.size
            reader = hiredis.Reader()
            reader.feed(raw[at:at + size])
            at += size
            while (command := reader.gets()) is not False:
                out.append((when, command))
    out.sort(key=lambda c: c[0])
    return out


def _name(command: list[bytes]) -> bytes:
    return command[0].upper()


def record(agent: str, runs: int, directory: Path) -> dict[str, Any]:
    """Run the styles row of ``agent`` at ``runs`` runs, recording every process's commands
    in ``directory``; the times (``time.monotonic_ns``) its starts began and ended."""
    from bench import iobound, styles
    from bench.common import servers

    threads = any(agent == a and t for _, a, t in styles.STYLES)
    cfg = styles._config(agent, agent, runs // 2, threads)
    workers = [directory / f"worker-{i}.rec" for i in range(cfg.workers)]
    cfg = dataclasses.replace(cfg, hooks=tuple(f"bench.scriptcost:Recorder={p}" for p in workers))
    marks: dict[str, int] = {}
    start = iobound._start

    def recorded_start(*args: Any, **kw: Any) -> None:
        _install(directory / "producer.rec")
        marks["start"] = time.monotonic_ns()
        try:
            start(*args, **kw)
        finally:
            marks["started"] = time.monotonic_ns()
            _uninstall()

    iobound._start = recorded_start
    try:
        with servers(("everysec",)) as s:
            srv = s.get("everysec")
            res = iobound.durable(srv.url, srv.client(), cfg, runs, directory, tag="cost")
    finally:
        iobound._start = start
    if res.get("incomplete"):
        raise RuntimeError(f"the recorded row did not complete: {res['incomplete']}")
    return marks


def _callgrind_total(path: Path, function: str | None = None) -> int:
    """Instructions in a callgrind output: the program's total, or ``function``'s inclusive."""
    args = ["callgrind_annotate"] + (["--inclusive=yes"] if function else []) + [str(path)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    pattern = rf"([\d,]+) \([^)]*\)\s+\S*:{function}\b" if function else \
        r"([\d,]+) \([^)]*\)\s+PROGRAM TOTALS"
    found = re.search(pattern, out)
    return int(found.group(1).replace(",", "")) if found else 0


def _load_scripts(r: redis.Redis) -> None:
    """Every script of the project: a process may have loaded one before its recorder was
    installed (a worker loads some as it starts, before its hooks)."""
    from durable.flow import fairness, tenants
    from durable.log import scripts

    folder = Path(scripts.__file__).parent / "scripts"
    for name in sorted(p.stem for p in folder.glob("*.lua")):
        r.script_load(scripts.source(name))
        r.script_load(fairness._script(name))  # (the ready scripts are sent without comments)
    r.script_load(tenants._LABEL)


class _Counted:
    """A ``redis-server`` (the embedded server's binary) run under callgrind, counting
    inside command execution only (``call``); ``part()`` ends a part of the count."""

    def __init__(self) -> None:
        from durable.backend.embedded import port_free, server_args

        self.workdir = Path(tempfile.mkdtemp(prefix="scriptcost-"))
        port = random.randint(20000, 40000)
        while not port_free(port):
            port = random.randint(20000, 40000)
        # (%p: a fork, BGREWRITEAOF's, writes a file of its own)
        self.server = subprocess.Popen(
            ["valgrind", "--tool=callgrind",
             f"--callgrind-out-file={self.workdir / 'callgrind.out.%p'}",
             "--toggle-collect=call", *server_args(self.workdir, port, "everysec")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.parts = 0
        self.r = redis.Redis(port=port)
        for _ in range(600):
            try:
                pid = int(self.r.info("server")["process_id"])
            except redis.ConnectionError:
                time.sleep(0.1)
                continue
            if pid == self.server.pid:
                return
            self.server.kill()  # (never replay into, or shut down, another server)
            raise RuntimeError(f"port {port} is answered by another server (pid {pid})")
        self.server.kill()
        raise RuntimeError("the server under callgrind did not answer within 60 s")

    def part(self) -> None:
        """Dump what was counted so far (counting starts from zero again)."""
        subprocess.run(["callgrind_control", "--dump", str(self.server.pid)],
                       capture_output=True, check=True)
        self.parts += 1

    def stop(self) -> list[Path]:
        """Stop the server; the count of each part, then the rest's (the final file)."""
        try:
            with contextlib.suppress(redis.ConnectionError):
                self.r.shutdown(nosave=True)
            self.server.wait(120)
        finally:
            if self.server.poll() is None:
                self.server.kill()
        out = self.workdir / f"callgrind.out.{self.server.pid}"
        files = [Path(f"{out}.{i}") for i in range(1, self.parts + 1)] + [out]
        missing = [p.name for p in files if not p.exists()]
        if missing:
            raise RuntimeError(f"callgrind wrote no {', '.join(missing)} in {self.workdir}")
        return files


def replay(cmds: list[tuple[int, list[bytes]]], marks: dict[str, int],
           variant: str | None = None) -> dict[str, Any]:
    """Replay ``cmds`` into a counted server; instructions inside commands for the three
    parts: set-up (before the starts), starts, the run (to the last append)."""
    from durable.log.scripts import source

    counted = _Counted()
    r = counted.r
    try:
        _load_scripts(r)
        shipped = hashlib.sha1(source("append").encode()).hexdigest().encode()
        shas = {shipped: r.script_load(variant).encode()} if variant is not None else {}
        appends = {shipped, *shas.values()}
        last_append = max(when for when, c in cmds if _name(c) == b"EVALSHA" and c[1] in appends)
        bounds = [marks["start"], marks["started"], last_append + 1]
        refused = 0
        pipe = r.pipeline(transaction=False)

        def send() -> int:
            bad = 0
            for reply in pipe.execute(raise_on_error=False):
                if isinstance(reply, redis.ResponseError):
                    bad += 1
                elif isinstance(reply, list) and reply and reply[0] in (
                        b"conflict", b"lease", b"foreign", b"claimed"):
                    bad += 1
            return bad

        for when, command in cmds:
            if when >= bounds[-1]:
                break
            while counted.parts < len(bounds) - 1 and when >= bounds[counted.parts]:
                refused += send()
                counted.part()
            if _name(command) in SKIP:
                continue
            if _name(command) == b"EVALSHA" and command[1] in shas:
                command = [command[0], shas[command[1]], *command[2:]]
            pipe.execute_command(*command)
            if len(pipe) >= PIPELINE:
                refused += send()
        refused += send()
    finally:
        files = counted.stop()
    setup, starts, run = (_callgrind_total(p) for p in files)
    result = {"setup": setup, "starts": starts, "run": run,
              "run_evalsha": _callgrind_total(files[-1], "evalShaCommand"),
              "refused": refused}
    shutil.rmtree(counted.workdir, ignore_errors=True)
    return result


def floor(runs: int) -> int:
    """Instructions per run of the styles floor's record (``bench.cpufloor.recorded``: the
    same run's 12 events, one ``transition.lua`` call each, pipelined)."""
    from bench import cpufloor

    counted = _Counted()
    try:
        counted.part()
        # (emptied without the AOF rewrite of bench.common.fresh: a fork under valgrind)
        cpufloor.recorded(counted.r, runs, reset=lambda r: r.flushall())
    finally:
        files = counted.stop()
    total = _callgrind_total(files[-1])
    shutil.rmtree(counted.workdir, ignore_errors=True)
    return total // runs


def variants(what_if: bool, variant: Path | None) -> Iterator[tuple[str, str, str | None]]:
    """(name, what is lost, the script's text or None for the shipped one)."""
    from durable.log.scripts import source

    yield "append.lua as shipped", "", None
    if variant is not None:
        yield f"append.lua replaced by {variant}", "", variant.read_text()
    if what_if:
        shipped = source("append")
        for name, loses, edits in WHAT_IF:
            text = shipped
            for old, new in edits:
                if old not in text:
                    raise RuntimeError(f"what-if {name!r}: its text is no longer in "
                                       "append.lua; update bench.scriptcost.WHAT_IF")
                text = text.replace(old, new)
            yield name, loses, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scriptcost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", default="async_count")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--what-if", action="store_true")
    parser.add_argument("--variant", type=Path)
    args = parser.parse_args(argv)
    if not all(shutil.which(t) for t in ("valgrind", "callgrind_control", "callgrind_annotate")):
        print("bench.scriptcost needs valgrind (Debian: apt-get install valgrind)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="scriptcost-rec-") as d:
        directory = Path(d)
        marks = record(args.agent, args.runs, directory)
        cmds = commands(sorted(directory.glob("*.rec")))
    n = args.runs
    floor_run = floor(n)
    print(f"{args.agent}, {n:,} runs: {len(cmds) / n:.1f} commands sent per run; "
          "instructions inside Redis's commands per run, replayed in the order sent")
    print(f"the floor's record of the same run (bench.cpufloor): {floor_run / 1e3:,.0f} k")
    print("| append.lua | starts | the run | x the floor | of which in scripts | vs shipped |"
          " what a run's record loses |")
    print("|---|---:|---:|---:|---:|---:|---|")
    base = 0
    for name, loses, text in variants(args.what_if, args.variant):
        got = replay(cmds, marks, text)
        base = base or got["run"]
        note = f" ({got['refused']} calls refused: the replay differs)" if got["refused"] else ""
        cells = [f"{got['starts'] / n / 1e3:,.0f} k", f"{got['run'] / n / 1e3:,.0f} k",
                 f"{got['run'] / n / floor_run:.1f}x",
                 f"{got['run_evalsha'] / max(got['run'], 1):.0%}",
                 f"{got['run'] / base - 1:+.1%}", loses]
        print(f"| {name}{note} | {' | '.join(cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
