"""The httpx transport of a worker: httpx's transport interface over one aiohttp session, cut to what
a forward needs (benchmarks/http_paths.py measures it against the alternatives).

A forward is a small POST whose whole answer is read at once, to one server, thousands of times a
second. So the aiohttp URL of each path, the timeout object and the session are made once; the
answer is read whole instead of streamed in chunks; nothing of httpx's client layer (cookies, auth,
redirects, base-URL merging, event hooks) runs per request.
"""

from __future__ import annotations

import aiohttp
import httpx
from yarl import URL


class SlimTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_connections: int, timeout_s: float, connect_s: float = 10.0) -> None:
        self.max_connections = max_connections
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections)
            self._session = aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",))
        return self._session

    def _url(self, url: httpx.URL) -> URL:
        key = str(url)
        got = self._urls.get(key)
        if got is None:
            got = self._urls[key] = URL(key, encoded=True)
        return got

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._open()
        data = request.content or None
        try:
            async with session.request(
                request.method,
                self._url(request.url),
                headers=request.headers.multi_items(),
                data=data,
                timeout=self.timeout,
                allow_redirects=False,
                auto_decompress=False,
            ) as r:
                content = await r.read()
                status, headers = r.status, r.raw_headers
        except TimeoutError as e:
            raise httpx.ReadTimeout(f"no answer within {self.timeout.sock_read} s", request=request) from e
        except aiohttp.ClientConnectionError as e:
            raise httpx.ConnectError(str(e) or type(e).__name__, request=request) from e
        except aiohttp.ClientError as e:
            raise httpx.TransportError(str(e) or type(e).__name__, request=request) from e
        return httpx.Response(status, headers=headers, content=content, request=request)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
