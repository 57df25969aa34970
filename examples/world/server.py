"""The external world: a separate HTTP process on loopback, and the database it owns.

Endpoints (JSON in and out; see ``examples.world.protocol`` for headers and status codes):

=====  ==========================  ===============================================
GET    /health, /info              liveness; the database path and the mode
GET    /source/{name}              the data source: a read (faultable)
POST   /notify                     the notification API: an effect (faultable)
GET    /notify/{key}               lookup: applied or not, with the stored result
POST   /notify/{key}/abort         refuse an attempt (by deadline) unless applied
POST   /v1/chat/completions        the model: scripted, OpenAI-compatible (faultable)
GET    /v1/models                  the model's name
GET    /applications[?prefix=P]    applications per key (api and db), reads and model
                                   requests per key
GET    /applications/rows          every application with its times
GET    /requests?key=K             every request for a key and what became of it
GET    /control/faults             the fault plan and the faults injected so far
POST   /control/faults             add faults (see ``examples.world.faults``)
POST   /control/reset              clear the fault plan
=====  ==========================  ===============================================
"""

from __future__ import annotations

import json
import random
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from examples.world import model
from examples.world.faults import Fault, FaultPlan
from examples.world.protocol import DEADLINE_HEADER, KEY_HEADER, REPLAYED_HEADER
from examples.world.store import ApiStore, ExampleDb, ModeMismatch, now_ms

#: The data source's catalogue: any other name is a 404.
SOURCES = ("orders", "invoices", "signups", "refunds")
REGIONS = ("eu", "us", "apac")


def records(name: str) -> list[dict[str, Any]]:
    """The source's content: deterministic per name, so every read of it agrees."""
    rng = random.Random(name)
    return [{"id": i + 1, "amount": round(rng.uniform(5, 500), 2),
             "region": rng.choice(REGIONS)} for i in range(rng.randint(4, 8))]


class World:
    def __init__(self, data_dir: Path, dedupe: bool) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir, self.dedupe = data_dir, dedupe
        self.api = ApiStore(data_dir / "api.sqlite", dedupe)
        self.db = ExampleDb(data_dir / "example.sqlite", dedupe)
        self.faults = FaultPlan()
        self.started = now_ms()
        self.url = ""

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "dedupe": self.dedupe, "db": str(self.db.path.resolve()),
                "api_db": str(self.api.path.resolve()), "sources": list(SOURCES),
                "started_ms": self.started}

    def hold_db_lock(self, seconds: float) -> None:
        self.faults.count("db_lock")
        threading.Thread(target=self.db.hold_lock, args=(seconds,), daemon=True).start()


class WorldServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], world: World, verbose: bool = False) -> None:
        self.world, self.verbose = world, verbose
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class BadRequest(Exception):
    pass


class Handler(BaseHTTPRequestHandler):
    server: WorldServer
    server_version = "durable-world/1"

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    # Plumbing -----------------------------------------------------------------------

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except ConnectionError:
            pass  # the caller gave up (timed out) before the reply: nothing to tell it

    def _drop(self) -> None:
        """Close the connection without a word: the caller cannot tell what happened."""
        self.close_connection = True

    def _json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            raise BadRequest(f"body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body

    def _effect_headers(self, required: bool) -> tuple[str, int]:
        key = self.headers.get(KEY_HEADER, "")
        raw = self.headers.get(DEADLINE_HEADER, "")
        if required and (not key or not raw):
            raise BadRequest(f"{KEY_HEADER} and {DEADLINE_HEADER} headers are required")
        try:
            deadline = int(raw) if raw else now_ms() + 30_000
        except ValueError:
            raise BadRequest(f"{DEADLINE_HEADER} must be ms since the epoch") from None
        return key, deadline

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path.rstrip("/") or "/"
        for verb, pattern, name in ROUTES:
            m = re.fullmatch(pattern, path)
            if verb == method and m:
                try:
                    getattr(self, name)(*[unquote(g) for g in m.groups()], query=query)
                except BadRequest as exc:
                    self._reply(400, {"error": str(exc)})
                except ValueError as exc:
                    self._reply(400, {"error": str(exc)})
                return
        self._reply(404, {"error": f"no route {method} {path}",
                          "routes": [f"{v} {p}" for v, p, _ in ROUTES]})

    @property
    def world(self) -> World:
        return self.server.world

    # Effects --------------------------------------------------------------------------

    def source(self, name: str, query: dict[str, str]) -> None:
        key, deadline = self._effect_headers(required=False)
        admitted = self._admit("source", key, deadline, faults=bool(key))
        if admitted is None:
            return
        fault, req, _ = admitted
        if name not in SOURCES:
            self.world.api.settle(req, "not_found")
            self._reply(404, {"error": f"no source {name!r}", "sources": list(SOURCES)})
            return
        self.world.api.settle(req, "applied")
        self._after(fault, 200, {"source": name, "records": records(name),
                                 "served_ms": now_ms()})

    def notify(self, query: dict[str, str]) -> None:
        key, deadline = self._effect_headers(required=True)
        body = self._json()
        if not isinstance(body.get("recipient"), str) or not body["recipient"]:
            raise BadRequest("'recipient' (a string) is required")
        # The notification API settles a late request itself (refused_deadline, below).
        admitted = self._admit("notify", key, deadline, refuse_late=False)
        if admitted is None:
            return
        fault, req, received = admitted
        disposition, result = self.world.api.apply(key, body, received, deadline)
        dropped = fault is not None and fault.kind == "drop" and result is not None
        self.world.api.settle(req, disposition + ("+dropped" if dropped else ""))
        if disposition == "refused_deadline":
            self._reply(408, {"error": "past the deadline", "applied": False})
        elif disposition == "refused_aborted":
            self._reply(409, {"error": f"key {key} was aborted", "applied": False})
        else:
            self._after(fault, 200, {"applied": True, "result": result},
                        {REPLAYED_HEADER: "true"} if disposition == "replayed" else None)

    def chat_completions(self, query: dict[str, str]) -> None:
        """The model (``examples.world.model``): every request is recorded under its
        ``Idempotency-Key`` whatever becomes of it, so a test can count how many times a
        call was sent. Faults: ``fail`` (503), ``slow`` (before answering, or before the
        reply), ``drop`` (answer, then close the connection; a stream is cut halfway)."""
        key, deadline = self._effect_headers(required=False)
        body = self._json()
        reply = model.completion(body)  # a malformed request is a 400, and not counted
        admitted = self._admit("model", key, deadline)
        if admitted is None:
            return
        fault, req, _ = admitted
        dropped = fault is not None and fault.kind == "drop"
        self.world.api.settle(req, "answered" + ("+dropped" if dropped else ""))
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(fault, model.chunks(reply, usage))
        else:
            self._after(fault, 200, reply)

    def _stream(self, fault: Fault | None, chunks: list[dict[str, Any]]) -> None:
        """Server-sent events, ``data: [DONE]`` last; a ``drop`` fault cuts the stream
        halfway (no ``[DONE]``), a ``slow`` reply fault holds it before the first event."""
        if fault is not None and fault.kind == "slow" and fault.phase == "reply":
            time.sleep(fault.slow_s)
        dropped = fault is not None and fault.kind == "drop"
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for chunk in chunks[:len(chunks) // 2] if dropped else chunks:
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            if not dropped:
                self.wfile.write(b"data: [DONE]\n\n")
        except ConnectionError:
            pass
        self.close_connection = True

    def models(self, query: dict[str, str]) -> None:
        self._reply(200, {"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "durable-world"}
            for name in model.MODELS]})

    def _admit(self, system: str, key: str, deadline: int, *, faults: bool = True,
               refuse_late: bool = True) -> tuple[Fault | None, int, int] | None:
        """Record a request to ``system`` (whatever becomes of it), strike it with the faults
        that come first, and refuse it past its deadline. Returns (fault, request, received)
        to go on with, or None when it was answered already."""
        received = now_ms()
        fault = self.world.faults.take(system, key) if faults else None
        req = self.world.api.request(system, key, received, fault.label() if fault else "")
        if self._before(fault, req):
            return None
        if refuse_late and now_ms() > deadline:
            self.world.api.settle(req, "refused_deadline")
            self._reply(408, {"error": "past the deadline", "applied": False})
            return None
        return fault, req, received

    def _before(self, fault: Fault | None, req: int) -> bool:
        """Faults that strike before the effect; True when the request is answered."""
        if fault is not None and fault.kind == "fail":
            self.world.api.settle(req, "failed_503")
            self._reply(503, {"error": "injected failure", "applied": False},
                        {"Retry-After": "0"})
            return True
        delay = self.world.faults.latency()
        if fault is not None and fault.kind == "slow" and fault.phase == "apply":
            delay += fault.slow_s
        if delay:
            time.sleep(delay)
        return False

    def _after(self, fault: Fault | None, status: int, body: Any,
               headers: dict[str, str] | None = None) -> None:
        """Faults that strike after the effect, then the reply (if any)."""
        if fault is not None and fault.kind == "slow" and fault.phase == "reply":
            time.sleep(fault.slow_s)
        if fault is not None and fault.kind == "drop":
            self._drop()
            return
        self._reply(status, body, headers)

    # Lookups and reports ------------------------------------------------------------

    def lookup(self, key: str, query: dict[str, str]) -> None:
        self._reply(200, self.world.api.lookup(key))

    def abort(self, key: str, query: dict[str, str]) -> None:
        raw = self.headers.get(DEADLINE_HEADER, "")
        if not raw.isdigit():
            raise BadRequest(f"{DEADLINE_HEADER} (the abandoned attempt's deadline) is required")
        self._reply(200, self.world.api.abort(key, int(raw)))

    def applications(self, query: dict[str, str]) -> None:
        prefix = query.get("prefix")
        api, reads = self.world.api.counts(prefix)
        self._reply(200, {"api": api, "db": self.world.db.counts(prefix), "reads": reads,
                          "model": self.world.api.model_requests(prefix),
                          "dedupe": self.world.dedupe})

    def application_rows(self, query: dict[str, str]) -> None:
        prefix = query.get("prefix")
        rows = self.world.api.rows(prefix) + self.world.db.rows(prefix)
        self._reply(200, {"rows": sorted(rows, key=lambda r: r["applied_ms"])})

    def requests(self, query: dict[str, str]) -> None:
        if not query.get("key"):
            raise BadRequest("?key= is required")
        self._reply(200, {"requests": self.world.api.requests(query["key"])})

    def info(self, query: dict[str, str]) -> None:
        self._reply(200, self.world.info())

    def health(self, query: dict[str, str]) -> None:
        self._reply(200, {"ok": True})

    def index(self, query: dict[str, str]) -> None:
        self._reply(200, {**self.world.info(), "routes": [f"{v} {p}" for v, p, _ in ROUTES]})

    # Control ------------------------------------------------------------------------

    def get_faults(self, query: dict[str, str]) -> None:
        self._reply(200, self.world.faults.snapshot())

    def set_faults(self, query: dict[str, str]) -> None:
        body = self._json()
        self.world.faults.configure(body)
        if body.get("db_lock_s"):
            self.world.hold_db_lock(float(body["db_lock_s"]))
        self._reply(200, self.world.faults.snapshot())

    def reset(self, query: dict[str, str]) -> None:
        self.world.faults.reset()
        self._reply(200, self.world.faults.snapshot())


ROUTES: list[tuple[str, str, str]] = [
    ("GET", r"/", "index"),
    ("GET", r"/health", "health"),
    ("GET", r"/info", "info"),
    ("GET", r"/source/([^/]+)", "source"),
    ("POST", r"/notify", "notify"),
    ("GET", r"/notify/([^/]+)", "lookup"),
    ("POST", r"/notify/([^/]+)/abort", "abort"),
    ("POST", r"/v1/chat/completions", "chat_completions"),
    ("GET", r"/v1/models", "models"),
    ("GET", r"/applications", "applications"),
    ("GET", r"/applications/rows", "application_rows"),
    ("GET", r"/requests", "requests"),
    ("GET", r"/control/faults", "get_faults"),
    ("POST", r"/control/faults", "set_faults"),
    ("POST", r"/control/reset", "reset"),
]


def _reset(data_dir: Path) -> None:
    for name in ("api.sqlite", "example.sqlite"):
        for suffix in ("", "-wal", "-shm", "-journal"):
            (data_dir / (name + suffix)).unlink(missing_ok=True)


def serve(host: str, port: int, data_dir: Path, *, dedupe: bool = True,
          ready_file: Path | None = None, reset: bool = False, verbose: bool = False,
          announce: bool = True) -> int:
    """Run the world in the foreground until SIGTERM or Ctrl-C."""
    if reset:
        _reset(data_dir)
    try:
        world = World(data_dir, dedupe)
    except ModeMismatch as exc:
        print(f"world: {exc}", file=sys.stderr)
        return 2
    httpd = WorldServer((host, port), world, verbose)
    world.url = f"http://{host}:{httpd.server_address[1]}"
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(world.info()))
        tmp.replace(ready_file)
    if announce:
        print(f"world on {world.url} (deduplication {'on' if dedupe else 'OFF'})\n"
              f"  database the example writes to: {world.db.path.resolve()}\n"
              f"  tools find it with: export DURABLE_WORLD_URL={world.url}", flush=True)

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        httpd.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        world.api.close()
    return 0
