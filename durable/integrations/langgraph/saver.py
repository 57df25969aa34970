"""LangGraph's checkpointer, kept in the run's log: ``LogSaver`` is a ``BaseCheckpointSaver``
whose every change (a checkpoint put, a task's writes, a thread deleted) is an entry of its
``Journal``, and whose reads answer from what it holds in memory: what this execution of the
run's function put, on top of what the log recorded (``load``, entry by entry, when the
function is executed again). LangGraph's own conformance suite for savers passes against it
(``tests/test_langgraph_saver.py``).

The journal of a durable run (``durable.integrations.langgraph.binding``) records entries as
the results of the effect-free step ``<name>.checkpoint``. ``aput_writes`` returns once its
writes are recorded: a task that returned is never run again. ``aput`` returns at once: its
checkpoint is recorded with the next entry that must be, and before any step a task of the
next superstep takes (its task ids derive from the checkpoint's id). A crash before that loses
nothing LangGraph cannot make again: the previous checkpoint and every task's writes are
recorded, and LangGraph, resuming from them, applies the writes without running a task.

Storage is ``InMemorySaver``'s (checkpoints by thread, namespace and id; channel values by
version, stored only when their version is new; writes by checkpoint, task and index), with a
list value stored as what changed since its previous version (``records.list_delta``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Protocol

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.base import SerializerProtocol

from durable.integrations.langgraph import records as rec
from durable.integrations.langgraph.records import Blob, Latest, ListBlob, Typed

__all__ = ["Entries", "Journal", "LogSaver"]


class Journal(Protocol):
    """Where a saver's entries go: ``add`` takes one (in order); ``flush`` returns once
    every entry added so far is recorded."""

    def add(self, entry: dict[str, Any]) -> None: ...

    async def flush(self) -> None: ...


class Entries:
    """A journal that keeps its entries in a list (a saver outside a durable run)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def add(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)

    async def flush(self) -> None:
        return None


Key = tuple[str, str]  # thread, namespace


def _where(config: RunnableConfig) -> Key:
    conf = config["configurable"]
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns", "") or "")


def _config(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                             "checkpoint_id": checkpoint_id}}


class LogSaver(BaseCheckpointSaver[str]):
    """A checkpointer whose changes are entries of ``journal`` (see the module's doc)."""

    def __init__(self, journal: Journal, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self.journal = journal
        #: (thread, ns) -> checkpoint id -> (the checkpoint without its values, metadata,
        #: parent id).
        self.checkpoints: dict[Key, dict[str, tuple[Typed, Typed, str | None]]] = {}
        #: (thread, ns, channel, version) -> the channel's value at that version.
        self.blobs: dict[tuple[str, str, str, Any], Blob | ListBlob] = {}
        #: (thread, ns, checkpoint id) -> (task id, index) -> (task id, channel, value, path).
        self.writes: dict[tuple[str, str, str], dict[tuple[str, int],
                                                      tuple[str, str, Typed, str]]] = {}
        #: (thread, ns, channel) -> its newest list value, what the next version is told from.
        self.latest: dict[tuple[str, str, str], Latest] = {}
        #: Entries taken (put and load) and the bytes of values they held.
        self.entries = 0
        self.value_bytes = 0

    # Writing ----------------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint,
            metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        thread, ns = _where(config)
        values = checkpoint["channel_values"]
        blobs: dict[str, tuple[Any, Blob | ListBlob]] = {}
        for channel, version in new_versions.items():
            blob = self._blob(thread, ns, channel, version, values)
            blobs[channel] = (version, blob)
        skeleton = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        meta = get_checkpoint_metadata(config, metadata)
        parent = config["configurable"].get("checkpoint_id")
        entry = {"thread": thread, "ns": ns, "id": checkpoint["id"], "parent": parent,
                 "step": meta.get("step"), "source": meta.get("source"),
                 "checkpoint": rec.to_json(rec.dump(self.serde, skeleton)),
                 "metadata": rec.to_json(rec.dump(self.serde, meta)),
                 "blobs": rec.blobs_json(blobs)}
        self._take_put(entry, blobs)
        self.journal.add({"put": entry})
        return _config(thread, ns, checkpoint["id"])

    def _blob(self, thread: str, ns: str, channel: str, version: Any,
              values: dict[str, Any]) -> Blob | ListBlob:
        at = (thread, ns, channel)
        if channel not in values:
            self.latest.pop(at, None)
            return Blob(None)
        value = values[channel]
        if type(value) is list:
            blob, typed = rec.list_delta(self.serde, value, self.latest.get(at))
            self.latest[at] = Latest(version, list(value), typed)
            return blob
        self.latest.pop(at, None)
        return Blob(rec.dump(self.serde, value))

    def _take_put(self, entry: dict[str, Any],
                  blobs: dict[str, tuple[Any, Blob | ListBlob]]) -> None:
        thread, ns = entry["thread"], entry["ns"]
        for channel, (version, blob) in blobs.items():
            self.blobs[(thread, ns, channel, version)] = blob
            self.value_bytes += rec.shown_blob(blob)
        self.checkpoints.setdefault((thread, ns), {})[entry["id"]] = (
            rec.from_json(entry["checkpoint"]), rec.from_json(entry["metadata"]),
            entry.get("parent"))
        self.entries += 1

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        thread, ns = _where(config)
        checkpoint_id = str(config["configurable"]["checkpoint_id"])
        stored = self.writes.get((thread, ns, checkpoint_id), {})
        items: list[tuple[int, str, Typed]] = []
        for idx, (channel, value) in enumerate(writes):
            at = WRITES_IDX_MAP.get(channel, idx)
            if at >= 0 and (task_id, at) in stored:
                continue  # a regular write is kept as first put; a special one replaced
            items.append((at, channel, rec.dump(self.serde, value)))
        if not items:
            return
        entry = {"thread": thread, "ns": ns, "checkpoint": checkpoint_id, "task": task_id,
                 "path": task_path, "w": rec.writes_json(items)}
        self._take_writes(entry, items)
        self.journal.add({"writes": entry})

    def _take_writes(self, entry: dict[str, Any], items: list[tuple[int, str, Typed]]) -> None:
        stored = self.writes.setdefault((entry["thread"], entry["ns"], entry["checkpoint"]), {})
        task, path = str(entry["task"]), str(entry.get("path") or "")
        for at, channel, typed in items:
            stored[(task, at)] = (task, channel, typed, path)
            self.value_bytes += len(typed[1])
        self.entries += 1

    def delete_thread(self, thread_id: str) -> None:
        self._forget(str(thread_id))
        self.journal.add({"delete": str(thread_id)})

    def _forget(self, thread: str) -> None:
        stores: tuple[dict[Any, Any], ...] = (self.checkpoints, self.blobs, self.writes,
                                              self.latest)
        for store in stores:
            for key in [k for k in store if k[0] == thread]:
                del store[key]

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        self.put_writes(config, writes, task_id, task_path)
        await self.journal.flush()

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)
        await self.journal.flush()

    def get_next_version(self, current: str | None, channel: None) -> str:
        return InMemorySaver.get_next_version(self, current, channel)  # type: ignore[arg-type]

    # What the log recorded -----------------------------------------------------------------

    def load(self, entry: Any) -> None:
        """Take one entry the log recorded, as it was taken when it was put (nothing is
        journaled again). Raises ``ValueError`` for an entry it cannot read."""
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ValueError(f"not a checkpointer entry: {str(entry)[:100]!r}")
        if "put" in entry:
            put = entry["put"]
            blobs = {channel: (data.get("v"), rec.load_blob(data))
                     for channel, data in (put.get("blobs") or {}).items()}
            self._take_put(put, blobs)
            for channel, (version, blob) in blobs.items():
                self._loaded_latest(put["thread"], put["ns"], channel, version, blob)
        elif "writes" in entry:
            self._take_writes(entry["writes"], rec.writes_from_json(entry["writes"]["w"]))
        elif "delete" in entry:
            self._forget(str(entry["delete"]))
        else:
            raise ValueError(f"not a checkpointer entry: {sorted(entry)}")

    def _loaded_latest(self, thread: str, ns: str, channel: str, version: Any,
                       blob: Blob | ListBlob) -> None:
        at = (thread, ns, channel)
        if not isinstance(blob, ListBlob):
            self.latest.pop(at, None)
            return
        known = self.latest.get(at)
        if known is not None and blob.base == known.version:
            typed = [*known.typed[:blob.keep], *blob.tail]
        else:
            typed = self._typed_items(thread, ns, channel, version)
        self.latest[at] = Latest(version, [_UNSEEN] * len(typed), typed)

    # Reading ------------------------------------------------------------------------------

    def _typed_items(self, thread: str, ns: str, channel: str, version: Any) -> list[Typed]:
        """The serialized items of a list channel's value at ``version``, from its chain of
        versions (each keeps some items of the one before)."""
        chain: list[ListBlob] = []
        at: Any = version
        while at is not None:
            blob = self.blobs.get((thread, ns, channel, at))
            if not isinstance(blob, ListBlob):
                raise ValueError(f"checkpoint channel {channel!r} version {at!r} of thread "
                                 f"{thread!r} is not in the log")
            chain.append(blob)
            at = blob.base if blob.keep else None
        items: list[Typed] = []
        for blob in reversed(chain):
            del items[blob.keep:]
            items.extend(blob.tail)
        return items

    def _values(self, thread: str, ns: str, versions: ChannelVersions) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for channel, version in versions.items():
            blob = self.blobs.get((thread, ns, channel, version))
            if blob is None or (isinstance(blob, Blob) and blob.typed is None):
                continue
            if isinstance(blob, Blob):
                assert blob.typed is not None
                values[channel] = rec.load(self.serde, blob.typed)
            else:
                values[channel] = [rec.load(self.serde, t)
                                   for t in self._typed_items(thread, ns, channel, version)]
        return values

    def _tuple(self, thread: str, ns: str, checkpoint_id: str) -> CheckpointTuple | None:
        saved = self.checkpoints.get((thread, ns), {}).get(checkpoint_id)
        if saved is None:
            return None
        skeleton, metadata, parent = saved
        checkpoint: Checkpoint = rec.load(self.serde, skeleton)
        stored = self.writes.get((thread, ns, checkpoint_id), {})
        ordered = sorted(stored.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))
        return CheckpointTuple(
            config=_config(thread, ns, checkpoint_id),
            checkpoint={**checkpoint, "channel_values": self._values(
                thread, ns, checkpoint["channel_versions"])},
            metadata=rec.load(self.serde, metadata),
            parent_config=_config(thread, ns, parent) if parent else None,
            pending_writes=[(task, channel, rec.load(self.serde, typed))
                            for task, channel, typed, _ in (w for _, w in ordered)])

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread, ns = _where(config)
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            known = self.checkpoints.get((thread, ns))
            if not known:
                return None
            checkpoint_id = max(known)
        return self._tuple(thread, ns, checkpoint_id)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        conf = (config or {}).get("configurable") or {}
        thread_id, ns_wanted = conf.get("thread_id"), conf.get("checkpoint_ns")
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        for (thread, ns), known in list(self.checkpoints.items()):
            if (thread_id is not None and thread != str(thread_id)) or \
                    (ns_wanted is not None and ns != ns_wanted):
                continue
            for checkpoint_id in sorted(known, reverse=True):
                if (wanted_id and checkpoint_id != wanted_id) or \
                        (before_id and checkpoint_id >= before_id):
                    continue
                if filter:
                    metadata = rec.load(self.serde, known[checkpoint_id][1])
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                if left is not None and left <= 0:
                    return
                if left is not None:
                    left -= 1
                found = self._tuple(thread, ns, checkpoint_id)
                if found is not None:
                    yield found

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None, before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        for found in self.list(config, filter=filter, before=before, limit=limit):
            yield found


class _Unseen:
    """An item of a list loaded from the log and not yet read: never the same object as a
    channel's item, so the next version compares it by its bytes."""


_UNSEEN = _Unseen()
