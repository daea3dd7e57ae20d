"""Browser-facing protections: Host and Origin checks, and the security headers of every response.

A server without keys (the default, a local single-user server) is still reachable from the user's browser,
and so from any page the browser has open. Two attacks follow, and this module blocks both:

- DNS rebinding: a page on `attacker.example` makes its name resolve to 127.0.0.1 and then reads the API as
  "same origin". The request still says `Host: attacker.example`, so the server answers only Hosts it knows:
  the address it binds (with `localhost`, `127.0.0.1` and `[::1]` for a loopback address) and the names of
  `--allowed-host`. A server bound to every address (0.0.0.0, ::) cannot know its names; without
  `--allowed-host` it accepts any Host and `HostPolicy.warning` says so at startup.
- Cross-site request forgery: a form or `fetch` from another origin (another local port included) posts to
  the API. Browsers name the page that sent a request in `Origin` and, lately, `Sec-Fetch-Site`; a
  state-changing request is refused when either says it came from elsewhere. Non-browser clients send
  neither and are not affected. JSON bodies must also say `Content-Type: application/json`
  (`errors.parse_body`), which a cross-origin form cannot send and a cross-origin `fetch` cannot send
  without a CORS preflight, which this server never grants.

Both are pure ASGI middleware rather than `BaseHTTPMiddleware`: they only look at headers, and streamed
answers (SSE) pass through them untouched.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from turborag.serve.errors import APIError

ANY = "*"
WILDCARD_BINDS = ("0.0.0.0", "::", "")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HOST_EXEMPT = frozenset({"/health"})  # probes (a load balancer's, a kubelet's) use whatever address they have

# The page (page_routes.py, static/) loads its one script and one stylesheet from this server, and talks
# only to it; nothing may frame it (clickjacking) and no form on it posts elsewhere.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", CSP.encode()),
)


def split_authority(value: str) -> tuple[str, int | None] | None:
    """(host name, port or None) of a Host header or an Origin's authority, the name lowercased and an IPv6
    address kept in brackets; None if it is malformed."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6] or [v6]:port
        end = value.find("]")
        name, rest = value[: end + 1], value[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    else:
        name, sep, port = value.partition(":")
        port = port if sep else None
    if not name or (port is not None and not (port.isdigit() and 0 < int(port) < 65536)):
        return None
    return name, int(port) if port is not None else None


def _bracketed(host: str) -> str:
    host = host.strip().lower()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class HostPolicy:
    """The Host headers a server answers. `names` are allowed with no port or the bound `port`; `extra`
    holds the `--allowed-host` values as (name, port), port None meaning any port; `any_host` turns the
    check off (`--allowed-host '*'`, or a wildcard bind without `--allowed-host`)."""

    names: frozenset[str]
    port: int | None
    extra: frozenset[tuple[str, int | None]] = frozenset()
    any_host: bool = False
    unchecked_bind: str | None = None  # the wildcard address whose Host checks are off, for the warning

    @classmethod
    def for_bind(cls, host: str, port: int, allowed: Iterable[str] = ()) -> HostPolicy:
        """The policy of a server bound to host:port with these `--allowed-host` values; ValueError for a
        value that is not a host name, `name:port` or `*`."""
        allowed = list(allowed)
        extra = set()
        for value in allowed:
            if value.strip() == ANY:
                continue
            parsed = split_authority(value)
            if parsed is None or "/" in value:
                raise ValueError(f"{value!r} is not a host name (NAME or NAME:PORT, no scheme or path)")
            extra.add(parsed)
        wildcard = host.strip() in WILDCARD_BINDS
        names = {_bracketed(host)} if not wildcard else set()
        if wildcard or _is_loopback(host):
            names.update(LOOPBACK_NAMES)  # a wildcard bind includes loopback, where local clients connect
        any_host = any(v.strip() == ANY for v in allowed) or (wildcard and not allowed)
        unchecked = (host or "0.0.0.0") if wildcard and not allowed else None
        return cls(frozenset(names), port, frozenset(extra), any_host, unchecked)

    def allows(self, authority: str) -> bool:
        """Whether a request whose Host header is `authority` is for this server."""
        if self.any_host:
            return True
        parsed = split_authority(authority)
        if parsed is None:
            return False
        name, port = parsed
        if name in self.names and port in (None, self.port):
            return True
        return (name, None) in self.extra or (name, port) in self.extra

    def serves_origin(self, authority: str) -> bool:
        """Whether a page at `authority` (an Origin's host[:port]) is this server: a bound name at the bound
        port, or an allowed name as given (without a port: the scheme's default, as a proxy serves it).
        Stricter than `allows`: a page on another port of the same name is another origin."""
        parsed = split_authority(authority)
        if self.any_host or parsed is None:
            return False
        name, port = parsed
        return (name in self.names and port == self.port) or parsed in self.extra

    def warning(self) -> str | None:
        """What to log at startup when Host checks are off because of the bind address alone."""
        if self.unchecked_bind is None:
            return None
        return (
            f"bound to {self.unchecked_bind} without --allowed-host: Host header checks are off, so a web "
            "page using DNS rebinding can reach this server through the user's browser; pass "
            "--allowed-host NAME for each name clients use (or --allowed-host '*' behind a proxy that "
            "checks it)"
        )


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def host_error(scope: dict, hosts: HostPolicy | None) -> APIError | None:
    """421 for a Host this server does not answer to (DNS rebinding); a request without Host (HTTP/1.0)
    is not a browser's and passes."""
    host = _header(scope, b"host")
    if hosts is None or host is None or scope.get("path") in HOST_EXEMPT or hosts.allows(host):
        return None
    return APIError(
        421,
        f"this server does not answer to Host {host[:100]!r}; start it with --allowed-host NAME to allow "
        "a name",
        code="misdirected_request",
    )


def origin_error(scope: dict, hosts: HostPolicy | None) -> APIError | None:
    """403 for a state-changing request that a browser says came from another site or origin."""
    if scope.get("method") not in STATE_CHANGING:
        return None
    if (_header(scope, b"sec-fetch-site") or "").strip().lower() == "cross-site":
        return _cross_origin("Sec-Fetch-Site says cross-site")
    origin = _header(scope, b"origin")
    if origin is None or is_own_origin(origin, _header(scope, b"host") or "", hosts):
        return None
    return _cross_origin(f"Origin {origin[:100]!r} is not this server")


def is_own_origin(origin: str, host: str, hosts: HostPolicy | None) -> bool:
    """Whether an Origin names this server: the request's own Host (the usual case), or an allowed name (a
    proxy that rewrites Host); `null` (a sandboxed frame, a file) never does. The scheme is not compared:
    behind a TLS proxy the page is https and the request reaching this server http."""
    parts = urlsplit(origin.strip())
    authority = parts.netloc.lower()
    if parts.scheme not in ("http", "https") or not authority:
        return False
    if authority == host.strip().lower():
        return True
    return hosts is not None and hosts.serves_origin(authority)


def _cross_origin(why: str) -> APIError:
    return APIError(
        403,
        f"cross-origin request refused ({why}): this API takes state-changing requests only from its own "
        "page or from non-browser clients",
        "permission_error",
        "cross_origin",
    )


class OriginChecks:
    """ASGI middleware: `host_error`, then `origin_error`, answered in OpenAI's error shape."""

    def __init__(self, app: Any, hosts: HostPolicy | None = None) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            error = host_error(scope, self.hosts) or origin_error(scope, self.hosts)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class SecurityHeaders:
    """ASGI middleware: `SECURITY_HEADERS` on every response (errors included) that does not set its own.
    The CSP is the page's; on JSON it is inert, and one policy everywhere leaves no route without it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
