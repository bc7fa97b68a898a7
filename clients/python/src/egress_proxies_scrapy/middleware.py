"""A Scrapy downloader middleware that sends every request through the egress-proxies gateway.

The gateway is a forward proxy: the token is the proxy password and the options (pool,
session, report, move) are the proxy username, because Scrapy puts only the proxy URL's
userinfo into the CONNECT of an https request; any other header travels inside the tunnel,
where the gateway never sees it.

A session keeps one egress address for a cookie jar (or a meta value, or one request). When a
target bans that address, the retry carries the session with ``report-banned-move-yes``: the
gateway quarantines the member for that target and re-binds the session to another member, so
the session's later requests (without the report) keep the new address. When the gateway
refuses a session because its member is quarantined for the target or gone (a 503 that asks
for ``move-yes``), the retry asks ``move-yes`` alone: nothing is reported.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
from typing import TYPE_CHECKING, Any, Iterable, Optional
from urllib.parse import quote, urlsplit

from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from re import Pattern

    from scrapy.crawler import Crawler
    from scrapy.http import Request, Response

logger = logging.getLogger(__name__)

#: The option keys the gateway reads in a username. A value holding one of these as a
#: dash-separated segment would be read as that key, so no value made here contains one.
OPTION_KEYS = frozenset({"pool", "session", "zone", "lease", "move", "report"})

#: request.meta keys. The public ones a spider may set; the others are this middleware's own.
META_SESSION = "egress_session"
META_DISABLE = "egress_proxies"
META_ROUTED_SESSION = "egress_proxies_session"
META_REPORT = "egress_proxies_report"
META_MOVE = "egress_proxies_move"
META_BAN_RETRIES = "egress_proxies_ban_retries"
META_MOVES = "egress_proxies_moves"
META_GATEWAY = "egress_proxies_gateway"

SESSION_MODES = ("cookiejar", "meta", "request")
DEFAULT_BAN_STATUSES = (403, 429, 503)
DEFAULT_BAN_RETRIES = 3
# The gateway's own answers (no member free, a credential refused, a member failing) carry
# RFC 9209 Proxy-Status naming it; they say nothing about the target's view of an address.
GATEWAY_PROXY_STATUS = b"egress-gateway"

_VALUE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
# Scrapy's TunnelError carries the status of a refused CONNECT in its message, not its headers.
_TUNNEL_STATUS = re.compile(r"'status': (\d{3})")


def valid_value(value: str) -> bool:
    """Whether the gateway reads ``value`` back as one option value, whole."""
    return bool(_VALUE.match(value)) and not any(
        segment in OPTION_KEYS for segment in value.split("-")
    )


def _digest(text: str, n: int = 16) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


class TokenSource:
    """The token, given or read from a file. A projected token is rotated by the kubelet, so
    the file is read again whenever it changed."""

    def __init__(self, token: Optional[str] = None, path: Optional[str] = None):
        if not token and not path:
            raise ValueError(
                "EgressProxiesMiddleware needs EGRESS_PROXIES_TOKEN or EGRESS_PROXIES_TOKEN_FILE"
            )
        self._token = token.strip() if token else None
        self._path = path
        self._stamp: Optional[tuple] = None
        if self._path:
            self.get()

    def get(self) -> str:
        if not self._path:
            assert self._token is not None
            return self._token
        st = os.stat(self._path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            with open(self._path, encoding="utf-8") as f:
                token = f.read().strip()
            if not token:
                raise ValueError(f"{self._path} holds no token")
            self._token, self._stamp = token, stamp
        assert self._token is not None
        return self._token


class EgressProxiesMiddleware:
    """Routes requests through the gateway, one session per cookie jar by default, and
    retries a banned request on another member, reporting the ban.

    Place it between RetryMiddleware (550) and HttpProxyMiddleware (750), at 740: its
    process_request must set ``meta["proxy"]`` before HttpProxyMiddleware turns it into
    Proxy-Authorization, and its process_response must see a 429 or 503 before
    RetryMiddleware retries it on the same address.
    """

    def __init__(
        self,
        gateway: str,
        token: TokenSource,
        *,
        pool: Optional[str] = None,
        sessions: str = "cookiejar",
        ban_statuses: Iterable[int] = DEFAULT_BAN_STATUSES,
        ban_body: Optional[str] = None,
        ban_retries: int = DEFAULT_BAN_RETRIES,
        move_sessions: bool = True,
        stats: Any = None,
        prefix: Optional[str] = None,
    ):
        if "://" not in gateway:
            raise ValueError(
                f"EGRESS_PROXIES_GATEWAY is a URL (http://HOST:PORT or https://HOST:PORT), not {gateway!r}"
            )
        parts = urlsplit(gateway)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"EGRESS_PROXIES_GATEWAY is http://HOST:PORT or https://HOST:PORT, not {gateway!r}"
            )
        if parts.username or parts.password:
            raise ValueError(
                "EGRESS_PROXIES_GATEWAY carries no credential: the token is EGRESS_PROXIES_TOKEN"
                " or EGRESS_PROXIES_TOKEN_FILE"
            )
        self.scheme = parts.scheme
        self.hostport = parts.netloc
        self.token = token
        if pool is not None and not valid_value(pool):
            # A pool whose name holds a key's segment can only be named by the Egress-Pool
            # header, which the gateway never sees inside an https tunnel.
            raise ValueError(
                f"EGRESS_PROXIES_POOL {pool!r} cannot be named in a proxy username"
                " (letters, digits, '_', '.', '-', and no segment that is an option key)"
            )
        self.pool = pool
        if sessions not in SESSION_MODES:
            raise ValueError(
                f"EGRESS_PROXIES_SESSIONS is one of {', '.join(SESSION_MODES)}, not {sessions!r}"
            )
        self.sessions = sessions
        self.ban_statuses = frozenset(int(s) for s in ban_statuses)
        self.ban_body: Optional[Pattern[bytes]] = (
            re.compile(ban_body.encode("utf-8")) if ban_body else None
        )
        self.ban_retries = int(ban_retries)
        self.move_sessions = bool(move_sessions)
        self.stats = stats
        # Per run: sessions of two runs (or two processes) never share a member by accident.
        self.prefix = prefix if prefix is not None else secrets.token_hex(4)
        self._requests = 0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> EgressProxiesMiddleware:
        s = crawler.settings
        gateway = s.get("EGRESS_PROXIES_GATEWAY")
        if not gateway:
            raise NotConfigured("EGRESS_PROXIES_GATEWAY is not set")
        statuses = s.getlist("EGRESS_PROXIES_BAN_STATUSES") or list(DEFAULT_BAN_STATUSES)
        return cls(
            gateway,
            TokenSource(s.get("EGRESS_PROXIES_TOKEN"), s.get("EGRESS_PROXIES_TOKEN_FILE")),
            pool=s.get("EGRESS_PROXIES_POOL") or None,
            sessions=s.get("EGRESS_PROXIES_SESSIONS") or "cookiejar",
            ban_statuses=[int(x) for x in statuses],
            ban_body=s.get("EGRESS_PROXIES_BAN_BODY") or None,
            ban_retries=s.getint("EGRESS_PROXIES_BAN_RETRIES", DEFAULT_BAN_RETRIES),
            move_sessions=s.getbool("EGRESS_PROXIES_MOVE_SESSIONS", True),
            stats=crawler.stats,
        )

    # -- sessions and the proxy URL -------------------------------------------------------

    def session_for(self, request: Request) -> Optional[str]:
        """The session a new request (not a retry) belongs to, or None for any member."""
        if self.sessions == "request":
            self._requests += 1
            return f"{self.prefix}r{self._requests}"
        if self.sessions == "meta":
            value = request.meta.get(META_SESSION)
            if value is None:
                return None
            value = str(value)
            # A value the gateway would read otherwise is replaced by its digest, which
            # keeps it stable across runs as the value itself would be.
            return value if valid_value(value) else "m" + _digest(value, 20)
        jar = request.meta.get("cookiejar")
        return f"{self.prefix}j{_digest(type(jar).__name__ + ':' + repr(jar))}"

    def username(self, session: Optional[str], report: bool, move: bool = False) -> str:
        parts = []
        if self.pool:
            parts.append(self.pool)
        if session:
            parts += ["session", session]
            if report:
                parts += ["report", "banned"]
            if report or move:
                parts += ["move", "yes"]
        return "-".join(parts)

    def proxy_url(self, session: Optional[str], report: bool, move: bool = False) -> str:
        user = self.username(session, report, move)
        token = quote(self.token.get(), safe="")
        # Scrapy builds Basic only from a URL with a username: with no options the token is
        # the username and the password is empty, which the gateway takes as the token.
        userinfo = f"{quote(user, safe='')}:{token}" if user else f"{token}:"
        return f"{self.scheme}://{userinfo}@{self.hostport}"

    def _routed_here(self, request: Request) -> bool:
        """Whether this request is (to be) sent through the gateway by this middleware: not
        opted out, and not given another proxy by the spider."""
        if request.meta.get(META_DISABLE) is False:
            return False
        proxy = request.meta.get("proxy")
        if proxy is None:
            return "proxy" not in request.meta
        # HttpProxyMiddleware rewrites meta["proxy"] without its userinfo, so a retry of
        # ours comes back with the gateway's host and port alone.
        return META_GATEWAY in request.meta and urlsplit(proxy).netloc.rsplit("@", 1)[-1] == (
            self.hostport
        )

    def process_request(self, request: Request, spider: Any = None) -> None:
        if not self._routed_here(request):
            return None
        if META_ROUTED_SESSION not in request.meta:
            request.meta[META_ROUTED_SESSION] = self.session_for(request)
        session = request.meta[META_ROUTED_SESSION]
        request.meta["proxy"] = self.proxy_url(
            session, bool(request.meta.get(META_REPORT)), bool(request.meta.get(META_MOVE))
        )
        request.meta[META_GATEWAY] = self.hostport
        return None

    # -- bans -------------------------------------------------------------------------------

    def ban_reason(self, response: Response) -> Optional[str]:
        """Why `response` is the target banning the address it came from, or None."""
        status = response.headers.get(b"Proxy-Status")
        if status is not None and status.strip().lower().startswith(GATEWAY_PROXY_STATUS):
            return None
        if response.status in self.ban_statuses:
            return f"status/{response.status}"
        if self.ban_body is not None and self.ban_body.search(response.body):
            return "body"
        return None

    def _inc(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(f"egress_proxies/{key}")

    def _retry(self, request: Request, count_key: str, **meta: Any) -> Optional[Request]:
        """A copy of `request` to send again, or None once `count_key` reached the budget."""
        done = request.meta.get(count_key, 0)
        if done >= self.ban_retries:
            return None
        retry = request.copy()
        retry.meta[count_key] = done + 1
        retry.meta.update(meta)
        retry.dont_filter = True
        return retry

    def _move(self, request: Request, how: str) -> Optional[Request]:
        """The session's member cannot serve this target now: the same request again, asking
        the gateway to move the session (the gateway's answer said so)."""
        if not self.move_sessions or not request.meta.get(META_ROUTED_SESSION):
            return None
        retry = self._retry(request, META_MOVES, **{META_MOVE: True})
        if retry is not None:
            self._inc("moves")
            self._inc(f"moves/{how}")
            logger.debug(
                "%s: the gateway refused session %s (%s); moving it",
                request,
                request.meta[META_ROUTED_SESSION],
                how,
            )
        return retry

    def process_response(self, request: Request, response: Response, spider: Any = None):
        if META_GATEWAY not in request.meta:
            return response
        # The report reached the gateway with this request: whatever comes back, another
        # retry (RetryMiddleware's, after a 502) must not quarantine the new member.
        reported = request.meta.pop(META_REPORT, False)
        request.meta.pop(META_MOVE, None)
        status = response.headers.get(b"Proxy-Status")
        if status is not None and status.strip().lower().startswith(GATEWAY_PROXY_STATUS):
            # The gateway's own refusal. One that asks for move-yes names the session's member
            # as quarantined for this target or gone: moving is the way on; nothing is banned.
            if response.status == 503 and b"move-yes" in status:
                return self._move(request, "http") or response
            return response
        reason = self.ban_reason(response)
        if reason is None:
            return response
        self._inc("bans")
        self._inc(f"bans/{reason}")
        session = request.meta.get(META_ROUTED_SESSION)
        # Without a session the gateway has no member to blame: the retry goes to any member.
        retry = self._retry(request, META_BAN_RETRIES, **{META_REPORT: session is not None})
        if retry is None:
            self._inc("gave_up")
            logger.warning(
                "%s: banned (%s) %d times in session %s, giving up",
                request,
                reason,
                request.meta.get(META_BAN_RETRIES, 0) + 1,
                session,
            )
            return response
        self._inc("retries")
        logger.debug(
            "%s: banned (%s) in session %s%s, retrying with a report",
            request,
            reason,
            session,
            " (after a report)" if reported else "",
        )
        return retry

    def process_exception(self, request: Request, exception: BaseException, spider: Any = None):
        # A failed CONNECT (the gateway's refusal over https) or a broken connection is no
        # ban. A retry of it by RetryMiddleware must not report again: the gateway may
        # already have taken the report and re-bound the session.
        request.meta.pop(META_REPORT, None)
        request.meta.pop(META_MOVE, None)
        if META_GATEWAY not in request.meta:
            return None
        # Over https the gateway's refusal is a failed CONNECT whose headers Scrapy drops: a
        # 503 is the session's member quarantined for the target, gone, or no member free;
        # a move serves the first two, and the third fails again and is left to
        # RetryMiddleware.
        m = _TUNNEL_STATUS.search(str(exception))
        if type(exception).__name__ == "TunnelError" and m and m.group(1) == "503":
            return self._move(request, "connect")
        return None
