"""Who a request is from (its share of the fair queue), and whether it may call the API.

:class:`ClientIdentity`: with API keys configured a ``/v1/`` request needs ``Authorization: Bearer
<key>`` and the client *is* its key; otherwise the client is the peer address, read from
``X-Forwarded-For`` / ``Forwarded`` only past proxies listed in ``trusted_proxies``, or the value of
``client_id_header`` when one is named (``docs/reliability.md``, "Who a client is").
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from dynlogits.serve.http.bearer_auth import BearerKeys, bearer_token

__all__ = ["ClientIdentity", "ForwardedHeader", "TrustedProxies"]

ForwardedHeader = Literal["x-forwarded-for", "forwarded"]
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address from a forwarding header's hop (``1.2.3.4``, ``1.2.3.4:80``, ``[::1]:80``, ``"[::1]"``)."""
    hop = text.strip().strip('"')
    if hop.startswith("["):
        hop = hop[1:hop.find("]")] if "]" in hop else hop[1:]
    elif hop.count(":") == 1:
        hop = hop.split(":", 1)[0]
    try:
        return ipaddress.ip_address(hop)
    except ValueError:
        return None


@dataclass(frozen=True)
class TrustedProxies:
    """The proxies whose forwarding header is believed; empty: none."""

    networks: tuple[_Network, ...] = ()
    header: ForwardedHeader = "x-forwarded-for"

    @classmethod
    def parse(cls, text: str, header: str = "x-forwarded-for") -> TrustedProxies:
        """``"127.0.0.1, 10.0.0.0/8"`` (addresses or networks, comma-separated); ``ValueError`` naming
        the first bad item."""
        networks = []
        for item in (i.strip() for i in text.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network") from None
        name = header.strip().lower()
        if name not in ("x-forwarded-for", "forwarded"):
            raise ValueError(f"the forwarding header must be 'x-forwarded-for' or 'forwarded', got {header[:40]!r}")
        return cls(tuple(networks), cast(ForwardedHeader, name))  # one of the two, checked above

    def trusts(self, address: str) -> bool:
        parsed = _address(address)
        return parsed is not None and any(parsed in n for n in self.networks)

    def _hops(self, headers: Sequence[tuple[bytes, bytes]]) -> list[str]:
        """The forwarding chain, left (client side) to right (the last proxy's peer)."""
        wanted = self.header.encode()
        values = [v.decode("latin-1") for n, v in headers if n == wanted]
        if self.header == "x-forwarded-for":
            return [h for v in values for h in v.split(",")]
        hops = []
        for element in (e for v in values for e in v.split(",")):
            for pair in element.split(";"):
                name, _, value = pair.partition("=")
                if name.strip().lower() == "for":
                    hops.append(value)
        return hops

    def client_address(self, scope: Mapping[str, Any]) -> str:
        """The client's address: the peer's, or the first hop right of which every hop is a listed proxy."""
        peer = scope.get("client")
        address = peer[0] if peer else "unknown"
        if not self.networks or not self.trusts(address):
            return address
        for hop in reversed(self._hops(scope.get("headers", ()))):
            parsed = _address(hop)
            if parsed is None:  # not an address: nothing left of it can be believed
                return address
            address = str(parsed)
            if not any(parsed in n for n in self.networks):
                return address
        return address


@dataclass(frozen=True)
class ClientIdentity:
    """Resolves a request's client (see the module docstring)."""

    api_keys: BearerKeys = field(default_factory=lambda: BearerKeys(()))
    proxies: TrustedProxies = field(default_factory=TrustedProxies)
    client_id_header: str = ""

    @property
    def keys_required(self) -> bool:
        return bool(self.api_keys)

    def key_of(self, scope: Mapping[str, Any]) -> int | None:
        """The position of the request's API key among the configured ones, else ``None``."""
        return self.api_keys.match(bearer_token(scope))

    def client(self, scope: Mapping[str, Any]) -> str:
        """``key:<n>`` when keys are configured (the caller has already refused a request without a
        valid one), else ``header:<value>`` or ``peer:<address>``."""
        if self.api_keys:
            return f"key:{self.key_of(scope)}"
        if self.client_id_header:
            wanted = self.client_id_header.lower().encode()
            for name, value in scope.get("headers", ()):
                if name == wanted and value:
                    return f"header:{hashlib.sha256(value).hexdigest()[:32]}"
        return f"peer:{self.proxies.client_address(scope)}"
