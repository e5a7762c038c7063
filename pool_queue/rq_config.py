"""Settings for RQ's own command line, so that `rq info -c pool_queue.rq_config` reaches the Redis that every
pool-* command reaches: REDIS_URL and REDIS_PASSWORD as they resolve (the environment, else the `.env`
file), the password never on a command line. The node image sets RQ_CONFIG to this module, so a bare
`rq info` works inside the stack (`docker compose exec node rq info`). A Redis that does not answer is
one line naming it and where its URL came from (a `.env` left by a stopped demo, say), not RQ's bare
"Connection refused"."""

from __future__ import annotations

import argparse
from urllib.parse import quote, urlsplit, urlunsplit

import redis

from .cli import fail
from .cli import settings as cli_settings
from .settings import Settings


def _url(settings: Settings) -> str:
    pw = settings.redis_kwargs().get("password")
    u = urlsplit(settings.redis_url)
    if not pw or "@" in u.netloc:  # a password in the URL itself wins, as for pool-*
        return settings.redis_url
    return urlunsplit(u._replace(netloc=f":{quote(pw, safe='')}@{u.netloc}"))


def _answers(settings: Settings) -> None:
    """Exit 2 with one line when no Redis answers at the URL in force."""
    try:
        redis.Redis.from_url(
            settings.redis_url, socket_connect_timeout=3, socket_timeout=3, **settings.redis_kwargs()
        ).ping()
    except redis.AuthenticationError:
        return  # RQ says so itself; the password is the user's to fix, not the address
    except redis.RedisError as e:
        src = settings.origin("redis_url")
        where = str(src) if src else "the default (no REDIS_URL in the environment or a .env file)"
        fail(settings.demo_gone() or f"no Redis answers at {settings.redis_where()} ({e}); its URL is {where}: "
             "start that Redis, or point REDIS_URL at a running one")  # fmt: skip


# bad: one line
_settings = cli_settings(argparse.Namespace(root=None, results=None, redis_url=None, protocol_file=None))
_answers(_settings)
REDIS_URL = _url(_settings)
