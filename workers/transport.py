"""The httpx transport of a worker: httpx's transport interface over one aiohttp session, cut to what
a forward needs (benchmarks/http_paths.py measures it against the alternatives).

A forward is a small POST whose whole answer is read at once, to one server, thousands of times a
second. So the aiohttp URL of each path, the timeout object and the session are made once; the
answer is read whole instead of streamed in chunks; no cookie jar is consulted; nothing of httpx's
client layer (cookies, auth, redirects, base-URL merging, event hooks) runs per request.
"""

from __future__ import annotations

import aiohttp
import httpx
from yarl import URL


class SlimTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_connections: int, timeout_s: float, connect_s: float = 10.0) -> None:
        self.max_connections = max_connections
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=timeout_s)
        self._timeouts: dict[tuple[float | None, float | None], aiohttp.ClientTimeout] = {}
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        self._headers: dict[tuple[tuple[bytes, bytes], ...], dict[str, str]] = {}

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections)
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("User-Agent",)
            )
        return self._session

    def _url(self, url: httpx.URL) -> URL:
        key = str(url)
        got = self._urls.get(key)
        if got is None:
            got = self._urls[key] = URL(key, encoded=True)
        return got

    def _headers_of(self, request: httpx.Request) -> dict[str, str]:
        """aiohttp's form of a request's headers, made once per distinct set (aiohttp sets the length)."""
        key = tuple(kv for kv in request.headers.raw if kv[0] != b"content-length")
        got = self._headers.get(key)
        if got is None:
            got = self._headers[key] = {k.decode("latin-1"): v.decode("latin-1") for k, v in key}
        return got

    def _timeout(self, request: httpx.Request) -> aiohttp.ClientTimeout:
        """A request's own timeouts (a health probe's few seconds), else the transport's (a forward)."""
        t = request.extensions.get("timeout")
        if not t:
            return self.timeout
        key = (t.get("connect"), t.get("read"))
        got = self._timeouts.get(key)
        if got is None:
            got = self._timeouts[key] = aiohttp.ClientTimeout(total=None, sock_connect=key[0], sock_read=key[1])
        return got

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._open()
        data = request.content or None
        timeout = self._timeout(request)
        try:
            async with session.request(
                request.method,
                self._url(request.url),
                headers=self._headers_of(request),
                data=data,
                timeout=timeout,
                allow_redirects=False,
                auto_decompress=False,
            ) as r:
                content = await r.read()
                status, headers = r.status, r.raw_headers
        except TimeoutError as e:
            raise httpx.ReadTimeout(f"no answer within {timeout.sock_read} s", request=request) from e
        except aiohttp.ServerDisconnectedError as e:  # it accepted the connection, then closed it: as httpx says
            raise httpx.RemoteProtocolError(str(e) or "server disconnected without a response", request=request) from e
        except aiohttp.ClientConnectionError as e:
            raise httpx.ConnectError(str(e) or type(e).__name__, request=request) from e
        except aiohttp.ClientError as e:
            raise httpx.TransportError(str(e) or type(e).__name__, request=request) from e
        return httpx.Response(status, headers=headers, content=content, request=request)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
