"""Which network the boxes of a multi-box job talk over: Open MPI's TCP interface selection.

MPI_TCP_INCLUDE (an interface name such as eth0, or a subnet such as 10.1.0.0/16) is used as
given. Without it the launcher deduces the subnet as Habana's launcher scripts do: the address
this box uses to reach the others, widened to a subnet every box of the job shares. Habana's
scripts ask for the route to an outside address (4.3.2.1) and assume a /24; this asks for the
route to the first other box of MULTI_HLS_IPS (the same answer when that box sits behind the
default route, the right one when the boxes share a private network besides it), and takes the
subnet of the interface holding that address, /24 only when it cannot be read. A subnet, unlike
an interface name, names the same network on boxes whose interfaces are named differently.
"""

import fcntl
import ipaddress
import socket
import struct

from efficientdet_hpu.launch.hosts import ClusterConfigError

# Habana's probe: a routable address no packet is sent to (connect() on UDP only routes).
DEFAULT_ROUTE_PROBE = "4.3.2.1"
FALLBACK_PREFIX = 24
_SIOCGIFADDR, _SIOCGIFNETMASK = 0x8915, 0x891B


def source_address(destination):
    """The local IPv4 address the kernel would use to reach `destination`; None if unreachable."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((destination, 9))
            return probe.getsockname()[0]
        except OSError:
            return None


def resolve(name):
    """The first IPv4 address of a host name or address; None when it does not resolve."""
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        return None


def _interface_ipv4(sock, name, request):
    packed = fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))
    return socket.inet_ntoa(packed[20:24])


def local_networks():
    """{address: (interface, subnet)} of this box's IPv4 interfaces, e.g.
    {"127.0.0.1": ("lo", "127.0.0.0/8")}. Linux only; interfaces without IPv4 are skipped."""
    networks = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                address = _interface_ipv4(sock, name, _SIOCGIFADDR)
                netmask = _interface_ipv4(sock, name, _SIOCGIFNETMASK)
            except OSError:
                continue
            subnet = ipaddress.ip_interface(f"{address}/{netmask}").network
            networks[address] = (name, str(subnet))
    return networks


def deduce_tcp_include(host_names, *, networks=None, route=source_address, lookup=resolve):
    """The subnet (CIDR text) this box reaches the other boxes of `host_names` on.

    Boxes that are this one (127.0.0.1, or an address of `networks`) are skipped; when no
    other box resolves, the default route decides, as in Habana's scripts.
    `networks`, `route` and `lookup` default to this machine's (tests pass their own).
    """
    networks = local_networks() if networks is None else networks
    for name in host_names:
        destination = lookup(name)
        if destination is None or destination in networks:
            continue
        # 127.0.0.1 is this box even where `networks` misses lo; another loopback address
        # (127.0.0.2, a test box's sshd) is a box Open MPI reaches over ssh, and lo's subnet.
        if destination in ("127.0.0.1", "::1"):
            continue
        address = route(destination)
        if address is not None:
            return _subnet_of(address, networks)
    address = route(DEFAULT_ROUTE_PROBE)
    if address is None:
        raise ClusterConfigError(
            f"cannot tell which network the boxes {', '.join(host_names)} share (no route to "
            f"them or to the outside); set MPI_TCP_INCLUDE to the interface (eth0) or subnet "
            f"(10.0.0.0/24) they reach each other on")
    return _subnet_of(address, networks)


def _subnet_of(address, networks):
    if address in networks:
        return networks[address][1]
    return str(ipaddress.ip_interface(f"{address}/{FALLBACK_PREFIX}").network)


def tcp_include_flags(environ, host_names, deduce=deduce_tcp_include):
    """Open MPI flags restricting MPI's and its runtime's TCP traffic to one network."""
    include = environ.get("MPI_TCP_INCLUDE", "").strip() or deduce(host_names)
    return ["--mca", "btl_tcp_if_include", include, "--mca", "oob_tcp_if_include", include]
