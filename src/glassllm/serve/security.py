"""Who may talk to the server: the session token, the Host header and the Origin.

As Jupyter's server does (and for the same reasons):

- a random session token (`new_token`, 192 bits) is printed in the URL; every request carries
  it, in the header `Authorization: Bearer TOKEN` (what the page sends) or as `?token=TOKEN`
  (what the printed URL holds): compared in constant time;
- the Host header must name this server -- a loopback name or the address it was told to
  bind -- with its port: a web page of another site whose name an attacker re-points at
  127.0.0.1 (DNS rebinding) sends its own name as Host and is refused;
- an Origin header, when a browser sends one, must be this server's own; so must the fetch
  metadata (`Sec-Fetch-Site`: same-origin, or none for a URL typed or opened by the user): a
  page of another site cannot make the user's browser call the API (no cross-site calls).

Each check is a pure function of the request's headers (`refusal`), unit-tested apart from the
server; any refusal is a 403 with a one-line reason. A request aiohttp cannot even parse is
answered 400 by aiohttp, and said in one line on the terminal (`MalformedRequests`).
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import secrets
import sys
import time
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def new_token() -> str:
    """A fresh session token: 32 URL-safe characters (192 random bits)."""
    return secrets.token_urlsafe(24)


def is_loopback(host: str) -> bool:
    """True for localhost and the loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None] | None:
    """"name:port" / "[v6]:port" / "name" -> (name lowercased, port or None); None if
    malformed."""
    try:
        parts = urlsplit("//" + value)
        return (parts.hostname or "").lower(), parts.port
    except ValueError:  # a port out of range or not a number
        return None


class Gate:
    """The checks of one running server: its token, its port and the host names it answers to.

    bind: the address given with --host. Loopback names are always accepted; a non-loopback
    bind address adds itself; a wildcard bind (0.0.0.0, ::) adds any IP address literal (never
    a name: a name is what DNS rebinding controls).
    """

    def __init__(self, token: str, port: int, bind: str = "127.0.0.1"):
        self.token, self.port, self.bind = token, port, bind.lower().strip("[]")
        self.wildcard = self.bind in ("0.0.0.0", "::", "")

    def host_ok(self, name: str) -> bool:
        if name in LOOPBACK_NAMES or name == self.bind:
            return True
        if self.wildcard:
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                return False
        return False

    def origin_ok(self, origin: str) -> bool:
        try:
            parts = urlsplit(origin)
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        except ValueError:
            return False
        return parts.scheme == "http" and port == self.port and \
            self.host_ok((parts.hostname or "").lower())

    def token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"),
                                                         self.token.encode("utf-8"))

    def refusal(self, headers, query_token: str | None) -> str | None:
        """None if the request may proceed, else the one-line reason for its 403.

        headers: a case-insensitive mapping (aiohttp's request.headers);
        query_token: the ?token= parameter or None."""
        host = split_host(headers.get("Host", ""))
        if host is None or not host[0] or not self.host_ok(host[0]) or \
                (host[1] or 80) != self.port:
            return (f"Host {headers.get('Host', '')[:80]!r} is not this server (DNS "
                    f"rebinding?): use http://127.0.0.1:{self.port}/")
        origin = headers.get("Origin")
        if origin is not None and not self.origin_ok(origin):
            return f"cross-site request from Origin {origin[:80]!r} refused"
        site = headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            return f"cross-site request (Sec-Fetch-Site: {site[:30]}) refused"
        auth = headers.get("Authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else query_token
        if not self.token_ok(given):
            return ("missing or wrong session token: open the URL that `glassllm serve` "
                    "printed (it ends with ?token=...), or send 'Authorization: Bearer TOKEN'")
        return None


class MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (a malformed request line or header, one over
    8190 bytes, a bad Content-Length) as "Error handling request" with a traceback, on the
    server's terminal: the client's error, answered 400 already. One line instead, at most
    every 10 s (a client sending many says so once); other records pass as they are."""

    def __init__(self):
        super().__init__()
        self.said = -math.inf

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError
        e = record.exc_info[1] if record.exc_info else None
        if not isinstance(e, HttpProcessingError):
            return True
        if time.monotonic() - self.said >= 10:
            self.said = time.monotonic()
            why = " ".join(str(e.message).split())[:120]
            print(f"glassllm serve: refused a malformed HTTP request ({e.code}: {why})",
                  file=sys.stderr, flush=True)
        return False
