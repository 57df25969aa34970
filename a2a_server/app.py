"""The Starlette application of ``durable a2a``.

- ``GET /agents``: the published agents, each with the address of its card.
- ``GET /agents/<name>/.well-known/agent-card.json``: the agent's card (``cards``), public,
  in the shape of the protocol version asked for (``discovery``).
- ``GET /.well-known/agent-card.json``: the host's card: the one published agent's, or the
  one ``DURABLE_A2A_AGENT`` names (``discovery``).
- ``POST /agents/<name>/``: the agent's JSON-RPC endpoint: the SDK's ``JsonRpcDispatcher``
  (v1.0's methods and, with the v0.3 compatibility it offers, ``message/send``,
  ``message/stream``, ``tasks/get``, ``tasks/cancel``, ``tasks/resubscribe``) over
  ``handler.DurableRequestHandler``. A request needs a bearer token or a console user's
  credentials (``tokens.Access``) unless the process serves in development mode; a body
  larger than ``body_limit`` is refused before it is read whole, one of another
  Content-Type than application/json with -32005, enum names the SDK would read as unset
  with -32602 (``params``). Every refusal is a JSON-RPC error object.
- ``GET /runs/<id>/events``: a run's log entries and partial output as server-sent events,
  resumable by ``Last-Event-ID`` (``durable.streams.sse``), for a caller of its tenant.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import AsyncIterator
from typing import Any

import redis
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import build_error_response
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InternalError,
    InvalidRequestError,
)
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from durable import catalog
from durable.client import Client
from durable.errors import UsageError
from durable.security.callers import Access, Caller, NotAllowed
from durable.streams import sse
from durable.streams.streaming import async_twin

from . import discovery, params
from .cards import card
from .handler import DurableRequestHandler

CARD_PATH = ".well-known/agent-card.json"


class _Context(DefaultServerCallContextBuilder):
    """The SDK's call context, with who calls and which agent's endpoint it called."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["caller"] = request.scope["durable.caller"]
        context.state["agent"] = request.scope["durable.agent"]
        return context


def _error(status: int, error: A2AError, headers: dict[str, str] | None = None,
           request_id: str | int | None = None) -> Response:
    return JSONResponse(build_error_response(request_id, error), status_code=status,
                        headers=headers)


def _request_id(body: object) -> str | int | None:
    rid = body.get("id") if isinstance(body, dict) else None
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None


def build_app(client: Client, access: Access | None, *, dev_caller: Caller | None = None,
              public_url: str | None = None, body_limit: int | None = None,
              push_secret: bytes | None = None, push_private_urls: bool = False,
              host_agent: str | None = None) -> Starlette:
    """The application; ``access`` None: every request is ``dev_caller`` (development);
    ``push_secret``: push notifications on, signed with it (``push``); ``host_agent``: the
    agent whose card the host's well-known address serves (``discovery.host_card``)."""
    if access is None and dev_caller is None:
        raise ValueError("access or a development caller")
    handler = DurableRequestHandler(client, push_secret=push_secret,
                                    push_private_urls=push_private_urls)
    dispatcher = JsonRpcDispatcher(handler, context_builder=_Context(), enable_v0_3_compat=True)
    limit = body_limit or 2 * client.settings.payloads.max_payload_bytes + 65536

    def base(request: Request) -> str:
        return (public_url or str(request.base_url)).rstrip("/")

    async def agents(request: Request) -> Response:
        names = await run_in_threadpool(catalog.names, client.redis)
        return JSONResponse({"agents": [
            {"name": n, "card": card_url(request, n)} for n in names]})

    def card_url(request: Request, name: str) -> str:
        return f"{base(request)}/agents/{name}/{CARD_PATH}"

    async def serve_card(request: Request, name: str) -> Response:
        version = discovery.asked_version(request)
        item = await run_in_threadpool(catalog.published, client.redis, name)
        if item is None:
            raise discovery.NoCard(404, {"error": f"no agent {name!r} is published here"})
        built = card(item, f"{base(request)}/agents/{name}/", push=handler.pusher is not None,
                     bearer=access is None or access.tokens is not None,
                     basic=access is not None and access.users is not None)
        return discovery.card_response(request, discovery.shaped(built, version),
                                       item.published_at)

    async def agent_card(request: Request) -> Response:
        try:
            return await serve_card(request, request.path_params["agent"])
        except discovery.NoCard as exc:
            return discovery.refusal(exc)

    async def host_card(request: Request) -> Response:
        try:
            names = await run_in_threadpool(catalog.names, client.redis)
            name = discovery.host_card(names, host_agent, lambda n: card_url(request, n))
            return await serve_card(request, name)
        except discovery.NoCard as exc:
            return discovery.refusal(exc)

    async def rpc(request: Request) -> Response:
        try:
            return await answer(request)
        except redis.RedisError as exc:  # Redis away: said as the protocol says errors
            return _error(503, InternalError(message=f"Redis is unavailable: {exc}"))

    async def answer(request: Request) -> Response:
        try:
            caller = dev_caller if access is None else await run_in_threadpool(
                access.check, request.headers.get("authorization"))
        except NotAllowed as exc:
            return _error(403, InvalidRequestError(message=f"{exc}; nothing was started"))
        if caller is None:
            assert access is not None
            return _error(401, InvalidRequestError(message=f"{access.required} is required"),
                          {"WWW-Authenticate": access.challenge})
        name = request.path_params["agent"]
        if await run_in_threadpool(catalog.published, client.redis, name) is None:
            return _error(404, InvalidRequestError(
                message=f"no agent {name!r} is published here; nothing was started"))
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > limit:
            return _error(413, InvalidRequestError(
                message=f"a request of {size} bytes: the limit is {limit}; nothing was "
                "started"))
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return _error(413, InvalidRequestError(
                    message=f"a request over {limit} bytes; nothing was started"))
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind and kind != "application/json":
            return _error(415, ContentTypeNotSupportedError(
                message=f"a request of Content-Type {kind!r}: JSON-RPC requests are "
                "application/json; nothing was started"))
        request._body = bytes(body)  # what ``request.json()`` reads in the dispatcher
        try:
            parsed = json.loads(request._body)
        except ValueError:
            pass  # the dispatcher answers it (-32700)
        else:
            request._json = parsed  # parsed once: the dispatcher reads it from here
            refused = params.refusal(parsed)
            if refused is not None:
                return _error(200, refused, request_id=_request_id(parsed))
        request.scope["durable.caller"] = caller
        request.scope["durable.agent"] = name
        return await dispatcher.handle_requests(request)

    async def run_events(request: Request) -> Response:
        """``GET /runs/{id}/events``: the run's entries and partial output as server-sent
        events resumable by ``Last-Event-ID`` (``durable.streams.sse``), for the caller of
        the run's tenant; another tenant's run is the 404 of an unknown one."""
        try:
            caller = dev_caller if access is None else await run_in_threadpool(
                access.check, request.headers.get("authorization"))
        except NotAllowed as exc:
            return JSONResponse({"error": str(exc)}, status_code=403)
        if caller is None:
            assert access is not None
            return JSONResponse({"error": f"{access.required} is required"}, status_code=401,
                                headers={"WWW-Authenticate": access.challenge})
        run_id = request.path_params["run_id"]
        try:
            resume = sse.resume_from(request.headers.get("last-event-id")
                                     or request.query_params.get("from"))
        except UsageError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        proj = await run_in_threadpool(client.log.projection, run_id)
        if not proj or proj.get("tenant", "") != caller.tenant:
            return JSONResponse({"error": f"no run {run_id}"}, status_code=404)
        frames = sse.event_stream(app.state.aredis, client.log.keys, run_id, resume,
                                  reconnect_s=client.settings.redis.connect_timeout_s)
        return StreamingResponse(frames, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Loaded now rather than by the first start by name (a quarter second).
        await run_in_threadpool(importlib.import_module, "jsonschema")
        if handler.pusher is not None:
            await handler.pusher.resume()
        app.state.aredis = async_twin(client.redis)  # one pool for every event stream
        try:
            yield
        finally:
            await handler.aclose()
            await app.state.aredis.aclose()

    routes: list[Any] = [
        Route("/" + CARD_PATH, host_card, methods=["GET"]),
        Route("/agents", agents, methods=["GET"]),
        Route("/agents/{agent}/" + CARD_PATH, agent_card, methods=["GET"]),
        Route("/agents/{agent}/", rpc, methods=["POST"]),
        Route("/agents/{agent}", rpc, methods=["POST"]),
        Route("/runs/{run_id:str}/events", run_events, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    return app
