"""The front of an HA sandbox cluster: one address, several kube-apiservers behind it.

``coordinator sandbox up --apiservers 2`` runs, per cluster, two kube-apiservers on one
etcd and this proxy on the cluster's single address. It is a separate, long-running
process (``main()`` of this module, given ``--proxy-config=FILE``), started and
stopped by the sandbox like its servers.

Spreading requests
    A backend is chosen **per request**, not per connection. Clients keep one
    connection open for a long time (coordinator's client holds one keep-alive
    connection per cluster; kubectl and client-go one HTTP/2 connection), so
    per-connection round robin would send nearly everything from one client to one
    server and the other one would never be seen. The proxy terminates TLS and speaks
    HTTP/1.1 to clients (it offers no ``h2`` in ALPN, so Go clients fall back to
    HTTP/1.1), which lets it pick a backend for every request. The pick is random
    (uniform), not strict alternation: clients send requests in fixed patterns (kubectl:
    discovery, then the call; a contender: read, then write), and strict alternation
    locks onto them — every write of a client may land on the same server. A backend
    that refuses the connection is skipped for that request (nothing was sent yet), as
    a load balancer with health checks would; a paused one (SIGSTOP) is not noticed,
    and the requests sent to it hang until the client gives up.
    A watch is one request: it stays on the backend it started on.

Authentication
    TLS ends here, so a client certificate cannot reach the servers. The proxy checks
    it against the sandbox CA and passes the user on the way Kubernetes front proxies
    do: ``X-Remote-User`` (the certificate's common name) and ``X-Remote-Group`` (its
    organizations), sent over a connection authenticated by the proxy's own client
    certificate, signed by a separate front-proxy CA that the servers trust for
    exactly that (``--requestheader-*``). Requests without a client certificate
    (bearer tokens) go over a connection without one, their ``Authorization`` intact.
    ``X-Remote-*`` headers from clients are always dropped.

A skewed server
    One backend (``skewed``, 1-based) may have its answers shifted by ``offset``
    seconds, as if its clock were that far off. The servers' own clocks cannot be set,
    so the proxy shifts what that server says:

    * its ``Date`` header;
    * the time stamps it writes: when a write (POST, PUT, PATCH) is answered by the
      skewed server, the ``managedFields`` entries stamped by that write, and the
      ``metadata.creationTimestamp`` of an object it created, are remembered (object
      uid, manager, operation, subresource, true time) and shown shifted in every
      later answer of **either** server — in objects, lists, tables and watch events —
      because a real skewed server would have stored the skewed time in etcd for
      everyone to read. Stamps written by the other server stay true, even when read
      through the skewed one.

    Limits: only JSON answers are rewritten (while stamps are shifted, ``Accept`` asking
    for protobuf as well as JSON is narrowed to JSON and ``Accept-Encoding`` is dropped;
    protobuf-only requests pass unchanged). Which entries a write stamped is inferred: the entries of the request's
    ``fieldManager`` (or, without one, every entry) stamped shortly before the
    server's answer (:data:`STAMP_WINDOW_S`). A later write of the same entry by the other server within the
    same second is shown shifted too. A shifted stamp sent back by a client in an
    update is stored as sent (the server keeps managedFields a client sets), which is
    the value every reader saw anyway. Other server clocks (token expiry, events,
    ``deletionTimestamp``) are not shifted. Upgrades (exec, port-forward) are not
    supported.

With ``shift_stamps`` off only the ``Date`` header is shifted: a proxy or load balancer
that stamps its own ``Date`` from a wrong clock, in front of servers that agree.

The configuration is a JSON file; SIGHUP reads it again, so the offset can change while
the cluster runs (stamps already written keep the shift they were written with).
``GET /sandbox-proxy/stats`` answers the requests each backend served.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import signal
import ssl
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from email.utils import format_datetime, parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

STATS_PATH = "/sandbox-proxy/stats"
FRONT_PROXY_USER = "sandbox-front-proxy"
USER_HEADER = "X-Remote-User"
GROUP_HEADER = "X-Remote-Group"
EXTRA_PREFIX = "X-Remote-Extra-"

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",
        "host",
    }
)
_WRITES = frozenset({"POST", "PUT", "PATCH"})
_LEDGER_LIMIT = 200_000
# How long before a write's answer a stamp may have been taken by that write.
STAMP_WINDOW_S = 3


# --------------------------------------------------------------------------- config


@dataclass
class ProxyConfig:
    """What ``proxy.json`` says (written by the sandbox, read again on SIGHUP)."""

    listen_port: int
    backends: list[int]
    ca_file: str
    serving_cert: str
    serving_key: str
    front_proxy_cert: str
    front_proxy_key: str
    skewed: int = 0  # 1-based backend whose answers are shifted; 0: none
    offset_s: float = 0.0
    shift_stamps: bool = True  # False: only the Date header is shifted

    @classmethod
    def load(cls, path: Path | str) -> ProxyConfig:
        raw = json.loads(Path(path).read_text())
        return cls(
            listen_port=int(raw["listen_port"]),
            backends=[int(p) for p in raw["backends"]],
            ca_file=str(raw["ca_file"]),
            serving_cert=str(raw["serving_cert"]),
            serving_key=str(raw["serving_key"]),
            front_proxy_cert=str(raw["front_proxy_cert"]),
            front_proxy_key=str(raw["front_proxy_key"]),
            skewed=int(raw.get("skewed") or 0),
            offset_s=float(raw.get("offset_s") or 0.0),
            shift_stamps=bool(raw.get("shift_stamps", True)),
        )

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2)


# --------------------------------------------------------------------------- time stamps


def parse_stamp(text: Any) -> dt.datetime | None:
    """An RFC 3339 time as Kubernetes writes it (``2026-12-01T06:35:18Z``)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def format_stamp(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def shift_stamp(text: str, offset_s: float) -> str:
    value = parse_stamp(text)
    if value is None:
        return text
    return format_stamp(value + dt.timedelta(seconds=round(offset_s)))


@dataclass
class StampLedger:
    """Stamps written by the skewed server: their true text → the text shown."""

    entries: OrderedDict[tuple[str, ...], str] = field(default_factory=OrderedDict)
    rewritten: int = 0

    def _put(self, key: tuple[str, ...], shown: str) -> None:
        self.entries[key] = shown
        self.entries.move_to_end(key)
        while len(self.entries) > _LEDGER_LIMIT:
            self.entries.popitem(last=False)

    @staticmethod
    def _entry_key(uid: str, entry: dict[str, Any]) -> tuple[str, ...]:
        return (
            "mf",
            uid,
            str(entry.get("manager") or ""),
            str(entry.get("operation") or ""),
            str(entry.get("subresource") or ""),
            str(entry.get("time") or ""),
        )

    def record_write(
        self,
        obj: dict[str, Any],
        *,
        offset_s: float,
        server_now: dt.datetime | None,
        manager: str | None,
        created: bool,
    ) -> int:
        """Remember what a write answered by the skewed server stamped; return how many."""
        meta = obj.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("uid"), str):
            return 0
        uid = meta["uid"]
        count = 0
        if created and isinstance(meta.get("creationTimestamp"), str):
            true = meta["creationTimestamp"]
            self._put(("created", uid, true), shift_stamp(true, offset_s))
            count += 1
        for entry in meta.get("managedFields") or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("time"), str):
                continue
            if manager and entry.get("manager") != manager:
                continue
            stamped = parse_stamp(entry["time"])
            if stamped is None:
                continue
            # Stamped by this write: a time close to the server's answer (stamps are
            # truncated to the second, and a loaded server may take a while to answer).
            if server_now is not None and stamped < server_now - dt.timedelta(seconds=STAMP_WINDOW_S):
                continue
            self._put(self._entry_key(uid, entry), shift_stamp(entry["time"], offset_s))
            count += 1
        return count

    def apply(self, doc: Any) -> Any:
        """Show every remembered stamp shifted, anywhere in ``doc`` (in place)."""
        if not self.entries:
            return doc
        stack = [doc]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(v for v in node if isinstance(v, (dict, list)))
                continue
            if not isinstance(node, dict):
                continue
            meta = node.get("metadata")
            if isinstance(meta, dict) and isinstance(meta.get("uid"), str):
                self._apply_meta(meta)
            stack.extend(v for k, v in node.items() if k != "metadata" and isinstance(v, (dict, list)))
        return doc

    def _apply_meta(self, meta: dict[str, Any]) -> None:
        uid = meta["uid"]
        created = meta.get("creationTimestamp")
        if isinstance(created, str):
            shown = self.entries.get(("created", uid, created))
            if shown is not None:
                meta["creationTimestamp"] = shown
                self.rewritten += 1
        for entry in meta.get("managedFields") or []:
            if isinstance(entry, dict) and isinstance(entry.get("time"), str):
                shown = self.entries.get(self._entry_key(uid, entry))
                if shown is not None:
                    entry["time"] = shown
                    self.rewritten += 1


# --------------------------------------------------------------------------- the proxy


def _peer_identity(transport: Any) -> tuple[str, list[str]] | None:
    """(common name, organizations) of a verified client certificate, if one was sent."""
    if transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    if not cert:
        return None
    user = ""
    groups: list[str] = []
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                user = value
            elif key == "organizationName":
                groups.append(value)
    return (user, groups) if user else None


def _is_json(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def _is_watch(path: str, query: dict[str, list[str]]) -> bool:
    value = (query.get("watch") or [""])[0].lower()
    return value in ("1", "true") or "/watch/" in path


def _narrow_accept(accept: str) -> str:
    """Drop protobuf from an Accept header that also takes JSON (JSON can be rewritten)."""
    parts = [p.strip() for p in accept.split(",") if p.strip()]
    json_ok = [p for p in parts if "protobuf" not in p]
    return ",".join(json_ok) if json_ok and len(json_ok) < len(parts) else accept


class FrontProxy:
    def __init__(self, config_path: Path) -> None:
        self.config_path = config_path
        self.config = ProxyConfig.load(config_path)
        self.ledger = StampLedger()
        self.served = [0] * len(self.config.backends)
        self.failovers = 0
        self._pick = random.Random()
        self._sessions: list[tuple[Any, Any]] = []

    def reload(self) -> None:
        try:
            fresh = ProxyConfig.load(self.config_path)
        except (OSError, ValueError, KeyError) as err:
            print(f"frontproxy: kept the old configuration, {self.config_path} is unreadable: {err}", flush=True)
            return
        if fresh.backends != self.config.backends:
            print("frontproxy: backends cannot change while running; only the shift was read", flush=True)
            fresh.backends = self.config.backends
        self.config = fresh
        what = "Date and stamps" if fresh.shift_stamps else "Date only"
        print(f"frontproxy: backend {fresh.skewed or '-'} shifted by {fresh.offset_s:+g}s ({what})", flush=True)

    # -- lifecycle

    async def serve(self) -> None:
        import aiohttp
        from aiohttp import web

        cfg = self.config
        for _ in cfg.backends:
            with_cert = ssl.create_default_context(cafile=cfg.ca_file)
            with_cert.load_cert_chain(cfg.front_proxy_cert, cfg.front_proxy_key)
            without = ssl.create_default_context(cafile=cfg.ca_file)
            self._sessions.append(
                (
                    aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(ssl=with_cert, limit=0), auto_decompress=False
                    ),
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=without, limit=0), auto_decompress=False),
                )
            )
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=cfg.ca_file)
        serving.load_cert_chain(cfg.serving_cert, cfg.serving_key)
        serving.verify_mode = ssl.CERT_OPTIONAL
        serving.set_alpn_protocols(["http/1.1"])
        site = web.TCPSite(runner, "127.0.0.1", cfg.listen_port, ssl_context=serving, backlog=512)
        await site.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        print(f"frontproxy: listening on 127.0.0.1:{cfg.listen_port}, backends {cfg.backends}", flush=True)
        await stop.wait()
        await runner.cleanup()
        for pair in self._sessions:
            for session in pair:
                await session.close()

    # -- one request

    def stats(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "backends": [
                {"index": i, "port": port, "requests": self.served[i - 1], "skewed": cfg.skewed == i}
                for i, port in enumerate(cfg.backends, 1)
            ],
            "offset_s": cfg.offset_s,
            "skewed": cfg.skewed,
            "shift_stamps": cfg.shift_stamps,
            "failovers": self.failovers,
            "ledger_entries": len(self.ledger.entries),
            "stamps_rewritten": self.ledger.rewritten,
        }

    async def handle(self, request: Any) -> Any:
        import aiohttp
        from aiohttp import web
        from multidict import CIMultiDict

        if request.path == STATS_PATH and request.method == "GET":
            return web.json_response(self.stats())
        cfg = self.config
        shifting = cfg.skewed > 0 and cfg.offset_s != 0
        headers: CIMultiDict[str] = CIMultiDict()
        for key, value in request.headers.items():
            lower = key.lower()
            if lower in _HOP_BY_HOP or lower in ("x-remote-user", "x-remote-group"):
                continue
            if lower.startswith(EXTRA_PREFIX.lower()):
                continue
            headers.add(key, value)
        if shifting or self.ledger.entries:
            # Answers must come back as plain JSON to be rewritten.
            if "Accept" in headers:
                headers["Accept"] = _narrow_accept(headers["Accept"])
            headers.popall("Accept-Encoding", None)
        identity = _peer_identity(request.transport)
        if identity is not None:
            user, groups = identity
            headers[USER_HEADER] = user
            for group in groups:
                headers.add(GROUP_HEADER, group)
        body = await request.read()
        n = len(cfg.backends)
        first = self._pick.randrange(n)
        upstream = None
        chosen = first
        for attempt in range(n):
            chosen = (first + attempt) % n
            session = self._sessions[chosen][0 if identity is not None else 1]
            url = f"https://127.0.0.1:{cfg.backends[chosen]}{request.rel_url.raw_path_qs}"
            try:
                upstream = await session.request(
                    request.method,
                    url,
                    headers=headers,
                    data=body if body else None,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                )
                break
            except aiohttp.ClientConnectorError:
                self.failovers += 1
                continue
        if upstream is None:
            return web.Response(status=503, text="no kube-apiserver of this cluster accepts connections\n")
        self.served[chosen] += 1
        skewed = shifting and cfg.skewed == chosen + 1
        try:
            return await self._relay(request, upstream, skewed=skewed, offset_s=cfg.offset_s)
        finally:
            upstream.release()

    async def _relay(self, request: Any, upstream: Any, *, skewed: bool, offset_s: float) -> Any:
        from aiohttp import web

        out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in _HOP_BY_HOP and key.lower() != "date":
                out.headers.add(key, value)
        server_now: dt.datetime | None = None
        raw_date = upstream.headers.get("Date")
        if raw_date:
            try:
                server_now = parsedate_to_datetime(raw_date)
            except (TypeError, ValueError):
                server_now = None
        if server_now is not None:
            shown = server_now + dt.timedelta(seconds=offset_s) if skewed else server_now
            out.headers["Date"] = format_datetime(shown.astimezone(dt.UTC), usegmt=True)
        encoded = upstream.headers.get("Content-Encoding")
        rewrite = _is_json(upstream.headers.get("Content-Type", "")) and not encoded
        if encoded:
            out.headers["Content-Encoding"] = encoded
        query = parse_qs(request.rel_url.query_string)
        if rewrite and _is_watch(request.path, query):
            out.enable_chunked_encoding()
            await out.prepare(request)
            buffer = b""
            async for chunk in upstream.content.iter_any():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    await out.write(self._rewrite_line(line) + b"\n")
            if buffer:
                await out.write(self._rewrite_line(buffer))
            await out.write_eof()
            return out
        if not rewrite:
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
        data = await upstream.read()
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if doc is not None:
            wrote = skewed and self.config.shift_stamps and request.method in _WRITES
            if wrote and 200 <= upstream.status < 300 and isinstance(doc, dict):
                self.ledger.record_write(
                    doc,
                    offset_s=offset_s,
                    server_now=server_now,
                    manager=(query.get("fieldManager") or [None])[0],
                    created=request.method == "POST" and upstream.status == 201,
                )
            if self.ledger.entries:
                data = json.dumps(self.ledger.apply(doc), separators=(",", ":")).encode()
        out.content_length = len(data)
        await out.prepare(request)
        await out.write(data)
        await out.write_eof()
        return out

    def _rewrite_line(self, line: bytes) -> bytes:
        if not self.ledger.entries or not line.strip():
            return line
        try:
            doc = json.loads(line)
        except ValueError:
            return line
        return json.dumps(self.ledger.apply(doc), separators=(",", ":")).encode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coordinator-sandbox-frontproxy")
    parser.add_argument("--proxy-config", required=True, help="the proxy.json the sandbox wrote")
    args = parser.parse_args(argv)
    proxy = FrontProxy(Path(args.proxy_config))
    try:
        asyncio.run(proxy.serve())
    except OSError as err:
        # "address already in use" is what the sandbox looks for to retry on another port.
        print(f"frontproxy: {err}", file=sys.stderr, flush=True)
        return 1
    return 0


def read_stats(port: int, ca_file: Path | str, timeout: float = 5.0) -> dict[str, Any]:
    """The proxy's per-backend counts (standard library only)."""
    import http.client

    context = ssl.create_default_context(cafile=str(ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    try:
        conn.request("GET", STATS_PATH)
        reply = conn.getresponse()
        payload = reply.read()
        if reply.status != 200:
            raise OSError(f"the proxy on port {port} answered {reply.status} for {STATS_PATH}")
        result: dict[str, Any] = json.loads(payload)
        return result
    finally:
        conn.close()


if __name__ == "__main__":
    raise SystemExit(main())
