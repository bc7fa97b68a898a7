"""Scrapy through the egress-proxies gateway: sessions per cookie jar, bans reported."""

from .middleware import EgressProxiesMiddleware, TokenSource, valid_value

__all__ = ["EgressProxiesMiddleware", "TokenSource", "valid_value"]
__version__ = "0.1.0"
