"""Settings for RQ's own command line, so that `rq info -c pool_queue.rq_config` reaches the Redis that every
pool-* command reaches: REDIS_URL and REDIS_PASSWORD as they resolve (the environment, else the `.env`
file), the password never on a command line. The node image sets RQ_CONFIG to this module, so a bare
`rq info` works inside the stack (`docker compose exec node rq info`)."""

from __future__ import annotations

import argparse
from urllib.parse import quote, urlsplit, urlunsplit

from .cli import settings


def _url() -> str:
    s = settings(argparse.Namespace(root=None, results=None, redis_url=None, protocol_file=None))  # bad: one line
    pw = s.redis_kwargs().get("password")
    u = urlsplit(s.redis_url)
    if not pw or "@" in u.netloc:  # a password in the URL itself wins, as for pool-*
        return s.redis_url
    return urlunsplit(u._replace(netloc=f":{quote(pw, safe='')}@{u.netloc}"))


REDIS_URL = _url()
