"""Process start against its floor, counted in instructions: ``durable runs`` and a worker's
start (``durable worker --burst`` on an empty queue), each beside a process that imports
only the third-party modules the command loaded (its dependencies alone), and beside a bare
interpreter.

Wall and CPU time of a process start on a shared machine are noise; the instructions a
process executes are not (a fixed hash seed, the same server). This machine's CPU counters
are not exposed to ``perf``, so the count is Valgrind's (``callgrind``: every instruction
of the process, the interpreter's start included). Each process runs once under it, about
10-40 s apiece; without ``valgrind`` on the PATH the item reports that and measures
nothing.

How the floor is found: the command runs once natively inside a probe that, when it ends,
writes every module it loaded that is neither the standard library nor this project's; the
floor process imports exactly those (each one, in the order they were loaded).

``python -m bench.startup`` runs it alone; ``--quick`` (in ``python -m bench --quick``)
measures ``durable runs`` only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable.testing import Server

#: The commands timed: label -> ``durable`` arguments.
COMMANDS = {"durable runs": ["runs"], "worker start": ["worker", "--burst"]}

#: Runs the command (``argv``) in this process, then writes the third-party modules it
#: loaded to the file named by ``DURABLE_BENCH_MODULES``.
_PROBE = """
import atexit, json, os, sys
def _dump():
    own = ("durable", "examples", "bench", "__main__", "__editable__", "_distutils_hack")
    std = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    mods = [m for m in sys.modules if not m.startswith(own) and m.split(".")[0] not in std]
    with open(os.environ["DURABLE_BENCH_MODULES"], "w") as f:
        json.dump(mods, f)
atexit.register(_dump)
from durable.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

_FLOOR = """
import importlib, json, sys
for m in json.load(open(sys.argv[1])):
    try:
        importlib.import_module(m)
    except Exception:
        pass
"""


def _env(url: str) -> dict[str, str]:
    return {**os.environ, "DURABLE_REDIS_URL": url, "DURABLE_AGENTS": "",
            "PYTHONHASHSEED": "0", "DURABLE_QUEUE": "bench-startup-empty"}


def instructions(argv: list[str], env: dict[str, str]) -> int:
    """Instructions ``argv`` executed, start to exit, as callgrind counts them."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                               *argv], env=env, capture_output=True, text=True, timeout=600)
        for line in done.stderr.splitlines():
            if "Collected :" in line:
                return int(line.rsplit(":", 1)[1].strip())
    raise RuntimeError(f"callgrind printed no count for {argv}: {done.stderr[-500:]}")


def run(*, quick: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    if shutil.which("valgrind") is None:
        return {"skipped": "valgrind is not installed (Debian's package: valgrind)"}
    srv = Server().start()
    py = sys.executable
    try:
        env = _env(srv.url)
        res: dict[str, Any] = {"interpreter": instructions([py, "-c", "pass"], env)}
        for label, args in list(COMMANDS.items())[:1 if quick else None]:
            with tempfile.TemporaryDirectory() as tmp:
                mods = Path(tmp) / "modules.json"
                probed = subprocess.run([py, "-c", _PROBE, *args], capture_output=True,
                                        text=True, timeout=120,
                                        env={**env, "DURABLE_BENCH_MODULES": str(mods)})
                if probed.returncode != 0:
                    raise RuntimeError(f"durable {' '.join(args)}: {probed.stderr[-500:]}")
                loaded = json.loads(mods.read_text())
                command = instructions([py, "-m", "durable", *args], env)
                floor = instructions([py, "-c", _FLOOR, str(mods)], env)
            res[label] = {"instructions": command, "floor": floor, "modules": len(loaded),
                          "ratio": round(command / floor, 2)}
            log(f"[startup] {label}: {command / 1e6:,.0f} M instructions, floor "
                f"{floor / 1e6:,.0f} M ({len(loaded)} modules): x{command / floor:.2f}")
        return res
    finally:
        srv.stop()


def markdown(st: dict[str, Any]) -> list[str]:
    """The report's section for ``run``'s result."""
    out = ["## Process start against its floor (instructions, callgrind)\n"]
    if "skipped" in st:
        return [*out, f"Not measured: {st['skipped']}.\n"]
    out.append("The floor imports only the third-party modules the command loaded; a bare "
               f"interpreter executes {st['interpreter'] / 1e6:,.0f} M instructions.\n")
    out.append("| command | instructions | floor | ratio (target ≤ 1.3x) |\n|---|---:|---:|---:|")
    for label in (c for c in COMMANDS if c in st):
        row = st[label]
        out.append(f"| `{label}` | {row['instructions'] / 1e6:,.0f} M | "
                   f"{row['floor'] / 1e6:,.0f} M ({row['modules']} modules) | "
                   f"**{row['ratio']:.2f}x** |")
    return [*out, ""]


if __name__ == "__main__":
    print("\n".join(markdown(run(quick="--quick" in sys.argv[1:]))))
