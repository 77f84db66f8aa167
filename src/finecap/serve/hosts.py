"""Which ``Host`` headers a local server answers (DNS rebinding): one policy for finecap's two servers, the reward
server (:mod:`finecap.serve.app`) and the bag review (:mod:`finecap.app.review`).

A web page can make a browser send requests to ``127.0.0.1`` under a name of the page's own domain that its DNS
server first resolved elsewhere and then to this machine ("DNS rebinding"); the browser then reads the answers as the
page's own. Such a request carries the page's name in ``Host``, so a server answers only a ``Host`` naming the
address it is bound to or a loopback name (``localhost``, ``127.0.0.1``, ``::1``); bound to a wildcard address
(``0.0.0.0``, ``::``), also the machine's own names and any IP literal; and the names the server is told clients use
(``finecap serve-reward --allow-host reward``: a docker-compose service, a Kubernetes Service's DNS name).

Example::

    >>> policy = HostPolicy("127.0.0.1")
    >>> policy.accepts("127.0.0.1:8000"), policy.accepts("localhost"), policy.accepts("evil.example:8000")
    (True, True, False)
    >>> HostPolicy("0.0.0.0", allowed=["reward"]).accepts("reward:8000"), HostPolicy("0.0.0.0").accepts("reward:8000")
    (True, False)
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def hostname(host: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8765`` -> ``::1``, ``localhost:8765`` -> ``localhost``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_ip(name: str) -> bool:
    """Whether ``name`` is an IP literal."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostPolicy:
    """The ``Host`` headers a server bound to ``bound`` answers (module docstring)."""

    def __init__(self, bound: str, allowed: Iterable[str] = ()) -> None:
        name = hostname(bound)
        self.hosts = set(LOOPBACK_NAMES) | {name} | {hostname(a) for a in allowed}
        self.wildcard = name in WILDCARD_HOSTS
        if self.wildcard:
            self.hosts |= {socket.gethostname().lower(), socket.getfqdn().lower()}

    def accepts(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header is answered (``None``, a request without one: refused)."""
        if not host:
            return False
        name = hostname(host)
        return name in self.hosts or (self.wildcard and is_ip(name))
