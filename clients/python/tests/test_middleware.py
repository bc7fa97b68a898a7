"""The middleware alone, against Scrapy's own Request, Response, HttpProxyMiddleware and stats:
what proxy URL and Proxy-Authorization each request gets, which answers are bans, and what a
ban's retry carries. Run with `python -m unittest discover -s clients/python/tests`."""

import base64
import os
import tempfile
import unittest
from urllib.parse import unquote

from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse, Request, Response
from scrapy.utils.test import get_crawler

from egress_proxies_scrapy import EgressProxiesMiddleware, valid_value
from egress_proxies_scrapy.middleware import META_BAN_RETRIES, META_REPORT

TOKEN = "tok/en+0123456789=="


def crawler(**settings):
    base = {
        "EGRESS_PROXIES_GATEWAY": "http://gw.example:8443",
        "EGRESS_PROXIES_TOKEN": TOKEN,
    }
    base.update(settings)
    return get_crawler(settings_dict=base)


def middleware(**settings):
    return EgressProxiesMiddleware.from_crawler(crawler(**settings))


def credential(mw, request):
    """What the gateway receives: the Basic pair HttpProxyMiddleware makes of meta["proxy"]."""
    mw.process_request(request)
    HttpProxyMiddleware().process_request(request)
    value = request.headers.get(b"Proxy-Authorization")
    assert value.startswith(b"Basic "), value
    user, _, password = base64.b64decode(value[6:]).decode("latin-1").partition(":")
    return user, password


class ProxyUrl(unittest.TestCase):
    def test_the_token_is_the_password_and_the_session_the_username(self):
        mw = middleware(EGRESS_PROXIES_POOL="crawlers.web")
        user, password = credential(mw, Request("http://a.example/", meta={"cookiejar": 1}))
        self.assertEqual(password, TOKEN)
        pool, key, session = user.split("-")
        self.assertEqual((pool, key), ("crawlers.web", "session"))
        self.assertTrue(session.startswith(mw.prefix))
        self.assertTrue(valid_value(session))

    def test_without_options_the_token_is_the_username(self):
        mw = middleware(EGRESS_PROXIES_SESSIONS="meta")
        self.assertEqual(credential(mw, Request("http://a.example/")), (TOKEN, ""))

    def test_one_session_per_cookie_jar(self):
        mw = middleware()
        s = lambda jar: credential(mw, Request("http://a.example/", meta={"cookiejar": jar}))[0]
        self.assertEqual(s(1), s(1))
        self.assertNotEqual(s(1), s(2))
        self.assertNotEqual(s(1), s("1"))
        self.assertEqual(s(None), credential(mw, Request("http://b.example/"))[0])
        # Another run draws another prefix: its jar 1 is another session.
        self.assertNotEqual(s(1), credential(middleware(), Request("http://a.example/", meta={"cookiejar": 1}))[0])

    def test_meta_sessions_are_used_as_given_or_by_digest(self):
        mw = middleware(EGRESS_PROXIES_SESSIONS="meta")
        user = lambda v: credential(mw, Request("http://a.example/", meta={"egress_session": v}))[0]
        self.assertEqual(user("cart42"), "session-cart42")
        # A value the gateway would split at a key, or could not take, is replaced whole.
        for bad in ("a-session-b", "has space", "x" * 200, "move"):
            u = user(bad)
            self.assertRegex(u, r"^session-m[0-9a-f]{20}$")
            self.assertEqual(u, user(bad))

    def test_request_sessions_are_fresh_each_request(self):
        mw = middleware(EGRESS_PROXIES_SESSIONS="request")
        a = credential(mw, Request("http://a.example/", meta={"cookiejar": 1}))[0]
        b = credential(mw, Request("http://a.example/", meta={"cookiejar": 1}))[0]
        self.assertNotEqual(a, b)

    def test_the_token_file_is_read_again_when_it_changes(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "token")
            with open(path, "w") as f:
                f.write("first-token\n")
            mw = middleware(EGRESS_PROXIES_TOKEN=None, EGRESS_PROXIES_TOKEN_FILE=path)
            self.assertEqual(credential(mw, Request("http://a.example/"))[1], "first-token")
            with open(path + ".new", "w") as f:
                f.write("second-token-longer\n")
            os.replace(path + ".new", path)
            self.assertEqual(credential(mw, Request("http://a.example/"))[1], "second-token-longer")

    def test_a_spiders_own_proxy_and_opt_out_are_kept(self):
        mw = middleware()
        r = Request("http://a.example/", meta={"proxy": "http://other:3128"})
        mw.process_request(r)
        self.assertEqual(r.meta["proxy"], "http://other:3128")
        r = Request("http://a.example/", meta={"proxy": None})
        mw.process_request(r)
        self.assertIsNone(r.meta["proxy"])
        r = Request("http://a.example/", meta={"egress_proxies": False})
        mw.process_request(r)
        self.assertNotIn("proxy", r.meta)

    def test_settings_are_checked(self):
        with self.assertRaises(NotConfigured):
            middleware(EGRESS_PROXIES_GATEWAY=None)
        for bad in (
            {"EGRESS_PROXIES_TOKEN": None},
            {"EGRESS_PROXIES_GATEWAY": "gw:8443"},
            {"EGRESS_PROXIES_GATEWAY": "http://user:pw@gw:8443"},
            {"EGRESS_PROXIES_POOL": "web-session-2"},
            {"EGRESS_PROXIES_SESSIONS": "jar"},
        ):
            with self.assertRaises(ValueError, msg=bad):
                middleware(**bad)


class Bans(unittest.TestCase):
    def setUp(self):
        self.crawler = crawler(EGRESS_PROXIES_BAN_BODY=r"captcha|access denied")
        self.mw = EgressProxiesMiddleware.from_crawler(self.crawler)

    def stat(self, key):
        return self.crawler.stats.get_value(f"egress_proxies/{key}", 0)

    def sent(self, url="http://a.example/p", **meta):
        r = Request(url, meta={"cookiejar": 7, **meta})
        credential(self.mw, r)
        return r

    def test_a_ban_is_retried_with_the_report_and_the_next_request_goes_without(self):
        first = self.sent()
        plain_user = unquote(first.meta["egress_proxies_session"])
        retry = self.mw.process_response(first, Response(first.url, status=403))
        self.assertIsInstance(retry, Request)
        self.assertTrue(retry.dont_filter)
        user, password = credential(self.mw, retry)
        self.assertEqual(user, f"session-{plain_user}-report-banned-move-yes")
        self.assertEqual(password, TOKEN)
        # The retry served: it is the spider's answer, and the next request of the session
        # goes without the report.
        ok = HtmlResponse(retry.url, status=200, body=b"<p>fine</p>")
        self.assertIs(self.mw.process_response(retry, ok), ok)
        self.assertEqual(credential(self.mw, self.sent())[0], f"session-{plain_user}")
        self.assertEqual((self.stat("bans"), self.stat("retries"), self.stat("gave_up")), (1, 1, 0))
        self.assertEqual(self.stat("bans/status/403"), 1)

    def test_statuses_and_body_are_bans(self):
        for status in (403, 429, 503):
            r = self.sent()
            self.assertIsInstance(self.mw.process_response(r, Response(r.url, status=status)), Request)
        r = self.sent()
        captcha = HtmlResponse(r.url, status=200, body=b"<h1>Please solve this CAPTCHA... captcha</h1>")
        self.assertIsInstance(self.mw.process_response(r, captcha), Request)
        self.assertEqual(self.stat("bans/body"), 1)
        for status in (200, 404, 500):
            r = self.sent()
            resp = Response(r.url, status=status)
            self.assertIs(self.mw.process_response(r, resp), resp)

    def test_the_gateways_own_refusals_are_no_ban(self):
        for status in (403, 503, 429):
            r = self.sent()
            refusal = Response(
                r.url,
                status=status,
                headers={"Proxy-Status": 'egress-gateway; error=destination_unavailable; details="no member"'},
            )
            self.assertIs(self.mw.process_response(r, refusal), refusal)
        self.assertEqual(self.stat("bans"), 0)

    def test_it_gives_up_after_the_retries(self):
        r = self.sent()
        for _ in range(3):
            r = self.mw.process_response(r, Response(r.url, status=403))
            self.assertIsInstance(r, Request)
            credential(self.mw, r)
        last = Response(r.url, status=403)
        self.assertIs(self.mw.process_response(r, last), last)
        self.assertEqual(r.meta[META_BAN_RETRIES], 3)
        self.assertEqual((self.stat("bans"), self.stat("retries"), self.stat("gave_up")), (4, 3, 1))

    def test_a_download_error_after_a_report_does_not_report_again(self):
        r = self.sent()
        retry = self.mw.process_response(r, Response(r.url, status=403))
        credential(self.mw, retry)
        self.assertTrue(retry.meta[META_REPORT])
        self.assertIsNone(self.mw.process_exception(retry, ConnectionRefusedError()))
        again = retry.copy()
        self.assertNotIn("report", credential(self.mw, again)[0])

    def test_without_a_session_the_retry_reports_nothing(self):
        crawler_ = crawler(EGRESS_PROXIES_SESSIONS="meta")
        mw = EgressProxiesMiddleware.from_crawler(crawler_)
        r = Request("http://a.example/")
        credential(mw, r)
        retry = mw.process_response(r, Response(r.url, status=429))
        self.assertEqual(credential(mw, retry), (TOKEN, ""))

    def test_a_session_the_gateway_cannot_keep_moves_without_a_report(self):
        first = self.sent()
        session = first.meta["egress_proxies_session"]
        quarantined = Response(
            first.url,
            status=503,
            headers={
                "Proxy-Status": 'egress-gateway; error=proxy_internal_response; next-hop="ns/web-1"; '
                'details="session \\"x\\": its member ns/web-1 is quarantined for a.example until '
                '2026-12-07T13:00:00Z; ask with option move-yes to be moved to another egress address"',
                "Retry-After": "300",
            },
        )
        retry = self.mw.process_response(first, quarantined)
        self.assertIsInstance(retry, Request)
        self.assertEqual(credential(self.mw, retry)[0], f"session-{session}-move-yes")
        ok = HtmlResponse(retry.url, status=200, body=b"fine")
        self.assertIs(self.mw.process_response(retry, ok), ok)
        self.assertEqual(credential(self.mw, self.sent())[0], f"session-{session}")
        self.assertEqual((self.stat("moves"), self.stat("moves/http"), self.stat("bans")), (1, 1, 0))

    def test_a_refused_connect_moves_the_session_and_other_errors_do_not(self):
        from scrapy.core.downloader.handlers.http11 import TunnelError

        r = self.sent("https://a.example/p")
        session = r.meta["egress_proxies_session"]
        refused = TunnelError(
            "Could not open CONNECT tunnel with proxy gw.example:8443 [{'status': 503, 'reason': 'Service Unavailable'}]"
        )
        retry = self.mw.process_exception(r, refused)
        self.assertEqual(credential(self.mw, retry)[0], f"session-{session}-move-yes")
        # A move that meets the refusal again goes on moving within the budget, then is left
        # to RetryMiddleware.
        for _ in range(2):
            retry = self.mw.process_exception(retry, refused)
            self.assertIsInstance(retry, Request)
        self.assertIsNone(self.mw.process_exception(retry, refused))
        forbidden = TunnelError(
            "Could not open CONNECT tunnel with proxy gw.example:8443 [{'status': 407, 'reason': 'Proxy Authentication Required'}]"
        )
        self.assertIsNone(self.mw.process_exception(self.sent("https://a.example/q"), forbidden))
        self.assertIsNone(self.mw.process_exception(self.sent("https://a.example/q"), ConnectionRefusedError()))
        self.assertEqual((self.stat("moves"), self.stat("moves/connect"), self.stat("bans")), (3, 3, 0))

    def test_moves_can_be_left_to_the_spider(self):
        mw = middleware(EGRESS_PROXIES_MOVE_SESSIONS=False)
        r = Request("http://a.example/", meta={"cookiejar": 1})
        credential(mw, r)
        refusal = Response(r.url, status=503, headers={"Proxy-Status": 'egress-gateway; details="ask with option move-yes"'})
        self.assertIs(mw.process_response(r, refusal), refusal)

    def test_requests_not_sent_through_the_gateway_are_left_alone(self):
        r = Request("http://a.example/", meta={"proxy": "http://other:3128"})
        self.mw.process_request(r)
        resp = Response(r.url, status=403)
        self.assertIs(self.mw.process_response(r, resp), resp)


if __name__ == "__main__":
    unittest.main()
