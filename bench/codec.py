"""Item 1: the event codec. MessagePack (what the log stores) against JSON, both with
msgspec typed encoders/decoders over the real ``AnyEvent`` union, on realistic events; and
Redis bytes per event of real runs' log streams.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict

import msgspec

from bench.common import event_type
from durable.log import events as ev
from durable.log.state import Action, RunState

RUN = "r-7f3a9c2e41d05b68"
ACTOR = "worker-host:48213:a91f0c"
TS = 1_767_000_000_000


class _Envelope(TypedDict):
    """The fields every sample shares."""

    v: int
    run: str
    ts: int
    actor: str


def sample_events() -> dict[str, ev.Event]:
    """One realistic event of each type (sizes as the count agent and the driver write)."""
    base: _Envelope = {"v": ev.SCHEMA_VERSION, "run": RUN, "ts": TS, "actor": ACTOR}
    key = f"{RUN}:7"
    args = {"n": 7, "sleep_s": 0.0}
    state = RunState(
        run_id=RUN, agent="count", agent_version="1", input={"steps": 1000, "sleep_s": 0.0},
        tools=["noop"], state="pending", version=600, step=200, settled=200,
        created=TS - 5000, updated=TS,
        actions={s: Action(step=s, tool="noop", args={"n": s, "sleep_s": 0.0},
                           key=f"{RUN}:{s}", status="succeeded", attempts=1,
                           deadline=TS + 10_000, result={"n": s})
                 for s in range(169, 201)},
    )
    samples: list[ev.Event] = [
        ev.RunStarted(**base, seq=1, agent="count", agent_version="1",
                      input={"steps": 4, "sleep_s": 0.0}, tools=["noop"]),
        ev.LeaseAcquired(**base, seq=2, owner="worker-host:48213:a91f0c", epoch=3),
        ev.StepDecided(**base, seq=21, step=7, tool="noop", args=args, key=key),
        ev.ActionDispatched(**base, seq=22, step=7, key=key, deadline=TS + 10_000),
        ev.ActionSucceeded(**base, seq=23, step=7, key=key, result={"n": 7}),
        ev.ActionFailed(**base, seq=23, step=7, key=key, error="HTTP 503 from payments",
                        error_type="HTTPStatusError", retryable=True),
        ev.ActionTimedOut(**base, seq=23, step=7, key=key),
        ev.ActionInterrupted(**base, seq=23, step=7, key=key, reason="canceled mid-flight"),
        ev.ActionReconciled(**base, seq=24, step=7, key=key, resolution="applied",
                            result={"n": 7}),
        ev.CallCanceled(**base, seq=24, step=7, key=key, reason="user asked"),
        ev.CancelRequested(**base, seq=24, reason="user asked", scope="run",
                           requested_ts=TS, by="operator"),
        ev.Canceled(**base, seq=25, reason="user asked", latency_ms=4),
        ev.WaitEntered(**base, seq=24, kind="input", reason="need a shipping address",
                       until=TS + 3_600_000, request=f"{RUN}:w24", data={"field": "address"}),
        ev.WaitResolved(**base, seq=25, kind="input", request=f"{RUN}:w24",
                        response={"address": "1 Main St"}, by="operator"),
        ev.WaitExpiry(**base, seq=25, kind="input", request=f"{RUN}:w24"),
        ev.ApprovalRequested(**base, seq=24, request=f"{RUN}:a7", step=7,
                             digest="9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                             role="finance", evidence=[f"{RUN}:5"], expires=TS + 86_400_000),
        ev.ApprovalDecided(**base, seq=25, request=f"{RUN}:a7", decision="approve",
                           approver="alice", note="ok"),
        ev.RetiredLeaseLost(**base, seq=26, owner="worker-host:48213:a91f0c", epoch=3),
        ev.Checkpoint(**base, seq=601, state=state),
        ev.Completed(**base, seq=27, result={"steps": 4}),
        ev.Failed(**base, seq=27, error="agent gave up"),
        ev.Expired(**base, seq=27, reason="input wait expired"),
        ev.Quarantined(**base, seq=27, reason="unreadable log entry 1-0"),
        ev.Released(**base, seq=28, by="operator"),
    ]
    # Types added to the schema later: sampled when present.
    if hasattr(ev, "RevalidationFailed"):
        samples.append(ev.RevalidationFailed(**base, seq=24, reason="price changed since approval",
                                             then="reapprove"))
    if hasattr(ev, "AgentUpgraded"):
        samples.append(ev.AgentUpgraded(**base, seq=24, from_version="1", to_version="2",
                                        tools=["noop"]))
    return {event_type(e): e for e in samples}


def unsampled() -> list[str]:
    """Event types in the schema that have no sample here (reported, not fatal)."""
    return sorted(set(ev.EVENT_TYPES) - set(sample_events()))


#: The step triplet dominates every log: its mean is the headline number.
STEP_MIX = ("step_decided", "action_dispatched", "action_succeeded")
SHOWN = ("run_started", *STEP_MIX, "canceled", "checkpoint")


def _time_ns(fn: Any, arg: Any, n: int) -> float:
    t = time.perf_counter_ns()
    for _ in range(n):
        fn(arg)
    return (time.perf_counter_ns() - t) / n


class _Wire:
    """``events.encode``/``decode`` with an encoder's and a decoder's interface."""

    def encode(self, event: ev.Event) -> bytes:
        return ev.encode(event, same_actor=True)

    def decode(self, data: bytes) -> ev.Event:
        return ev.decode(data, f"{TS}-0", RUN, ACTOR)


def run(servers: Any = None, quick: bool = False) -> dict[str, Any]:
    events = sample_events()
    codecs: dict[str, tuple[Any, Any]] = {
        "msgpack": (msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(ev.AnyEvent)),
        "json": (msgspec.json.Encoder(), msgspec.json.Decoder(ev.AnyEvent)),
        # What the log holds since v4 (``events.encode``): positional, the envelope left to
        # the entry's place (here an entry after one by the same actor).
        "wire": (_Wire(), _Wire()),
    }
    reps = 3 if quick else 7
    n = 500 if quick else 3000
    res: dict[str, dict[str, dict[str, list[float]]]] = {
        c: {t: {"enc": [], "dec": []} for t in events} for c in codecs}
    sizes = {c: {t: len(enc.encode(e)) for t, e in events.items()}
             for c, (enc, _) in codecs.items()}
    for enc, dec in codecs.values():  # round-trip check
        for e in events.values():
            assert dec.decode(enc.encode(e)) == e
    for _ in range(reps):  # interleaved: each rep times every (codec, type)
        for t, e in events.items():
            for c, (enc, dec) in codecs.items():
                blob = enc.encode(e)
                k = max(50, n // 20) if t == "checkpoint" else n
                res[c][t]["enc"].append(_time_ns(enc.encode, e, k))
                res[c][t]["dec"].append(_time_ns(dec.decode, blob, k))
    from bench.common import median

    table: dict[str, dict[str, dict[str, float]]] = {}
    for c in codecs:
        table[c] = {}
        for t in events:
            table[c][t] = {"enc_ns": median(res[c][t]["enc"]), "dec_ns": median(res[c][t]["dec"]),
                           "bytes": sizes[c][t]}
        for name, group in (("step mix (mean of 3)", STEP_MIX),
                            ("all types except checkpoint (mean)",
                             tuple(t for t in events if t != "checkpoint"))):
            table[c][name] = {k: sum(table[c][t][k] for t in group) / len(group)
                              for k in ("enc_ns", "dec_ns", "bytes")}
    # The real decode path (events.decode, with the version check) for the step mix:
    real = [median([_time_ns(ev.decode, ev.encode(events[t]), n) for _ in range(reps)])
            for t in STEP_MIX]
    out = {"per_type": table, "shown": [*SHOWN, "step mix (mean of 3)",
                                        "all types except checkpoint (mean)"],
           "events_decode_step_mix_ns": sum(real) / len(real), "unsampled": unsampled()}
    if servers is not None:
        out["redis"] = real_runs(servers, 200 if quick else 1000)
    return out


def real_runs(servers: Any, long_steps: int) -> dict[str, Any]:
    """Drive a 4-step and a long ``count`` run with the real driver (in this process), then
    measure their logs' bytes per entry in Redis."""
    from bench.common import fresh, settings_for
    from durable.agents import registry
    from durable.client import Client
    from durable.workers.loop import StepLoop

    srv = servers.get("everysec")
    r = srv.client()
    fresh(r)
    settings = settings_for(srv.url)
    client = Client(settings, r)
    driver = StepLoop(settings, r, registry, "bench-codec:1:000000")
    out = {}
    for label, steps in (("4-step run", 4), (f"{long_steps}-step run", long_steps)):
        rid = f"codec{steps}"
        client.start("count", {"steps": steps}, run_id=rid, enqueue=False)
        while driver.advance(rid).get("more"):
            pass
        r.delete(f"dx:{{{rid}}}:queued")
        out[label] = redis_bytes(r, rid)
    r.close()
    return out


def redis_bytes(r: Any, run_id: str) -> dict[str, float]:
    """Bytes per entry of a real run's log, as stored (msgpack), and the same entries
    re-encoded as JSON in a scratch stream (same ids, so the same stream layout)."""
    from durable.log import keys

    log_key = keys.UNSHARDED.log(run_id)
    n = r.xlen(log_key)
    mp = r.memory_usage(log_key, samples=0)
    scratch = f"bench:{{{run_id}}}:json"
    r.delete(scratch)
    jenc = msgspec.json.Encoder()
    pipe = r.pipeline(transaction=False)
    for eid, fields in r.xrange(log_key):
        pipe.xadd(scratch, {"e": jenc.encode(ev.decode(fields[b"e"]))}, id=eid)
    pipe.execute()
    js = r.memory_usage(scratch, samples=0)
    r.delete(scratch)
    return {"entries": n, "msgpack_bytes_per_entry": mp / n, "json_bytes_per_entry": js / n}
