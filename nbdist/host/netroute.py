"""Which local address routes to another host: the one home of the route lookups nbdist needs.

A UDP socket's `connect` asks the kernel's routing table for the local address it would
use; it sends nothing. Loopback stays loopback.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from urllib.parse import urlparse

from ..errors import ClusterError

OVERRIDE = "NBDIST_RENDEZVOUS_ADDR"  # the address engines should use to reach the kernel, when the lookup is wrong


def local_ip_towards(address: str, port: int = 9) -> str:
    """This host's IP address on the interface that routes to `address`."""
    if address.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, port))
        return probe.getsockname()[0]


def interface_towards(address: str, port: int = 9) -> str:
    """The name of this host's network interface that carries traffic to `address`."""
    import psutil

    local_ip = local_ip_towards(address, port)
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local_ip for a in addresses):
            return name
    if local_ip.startswith("127."):
        return "lo"
    raise ClusterError(f"no network interface holds {local_ip}, the address this engine uses to reach {address}")


def address_towards_cluster(client, all_local: bool) -> str:
    """The address engines use to reach this kernel: loopback for a local cluster, else the kernel's
    address on the network it shares with the controller ($NBDIST_RENDEZVOUS_ADDR overrides)."""
    if os.environ.get(OVERRIDE):
        return os.environ[OVERRIDE]
    if all_local:
        return "127.0.0.1"
    config = getattr(client, "_config", None) or {}  # ipyparallel keeps the connection info here, privately
    controller = urlparse(config.get("registration", "") or "").hostname or ""
    try:
        if controller and not ipaddress.ip_address(controller).is_loopback:
            return local_ip_towards(controller)
    except (OSError, ValueError):
        pass
    return socket.gethostbyname(socket.gethostname())
