"""Which boxes the ranks run on: address validation, MPI hostfiles.

A box is a `Host(name, slots)`: an address mpirun can reach and the number of ranks it runs.
Boxes come from `MULTI_HLS_IPS=ip1,ip2,...` (every box runs the same number of ranks) or from an
Open MPI hostfile such as the one the Kubeflow mpi-operator writes into an MPIJob launcher pod.
Rank order is host-major: ranks 0..slots-1 on the first host, and so on, which is how Open MPI
fills a hostfile whose lines all carry `slots=`.
"""

import dataclasses
import ipaddress
import re

from efficientdet_hpu.core.errors import UserError

# RFC 1123 label: letters, digits and hyphens, 1-63 characters, no hyphen at either end.
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_SLOTS = re.compile(r"^slots=([0-9]+)$")


class ClusterConfigError(UserError, ValueError):
    """A user-supplied host list, hostfile or HCL setting is malformed; the text says the fix."""


@dataclasses.dataclass(frozen=True)
class Host:
    """One box: `name` is an IPv4/IPv6 address or RFC 1123 host name, `slots` its rank count
    (None only for a hostfile line without `slots=`)."""
    name: str
    slots: int


def is_valid_address(text):
    """True for an IPv4 or IPv6 address or an RFC 1123 host name (dotted labels, <= 253 chars)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    labels = text.split(".")
    if not text or len(text) > 253 or not all(_LABEL.match(label) for label in labels):
        return False
    # "10.0.0.256" matches the label rule but is a mistyped IPv4 address, not a name.
    return not all(label.isdigit() for label in labels)


def hosts_from_ip_list(ip_list, slots_per_host, source="MULTI_HLS_IPS"):
    """Hosts for a comma-separated address list, each running `slots_per_host` ranks."""
    names = [entry.strip() for entry in ip_list.split(",")]
    for position, name in enumerate(names, start=1):
        if not is_valid_address(name):
            raise ClusterConfigError(
                f"{source}={ip_list!r}: entry {position} ({name!r}) is not an IPv4/IPv6 address "
                f"or host name; write it as a comma-separated list such as 10.0.0.1,10.0.0.2")
    hosts = [Host(name, slots_per_host) for name in names]
    _reject_duplicates(hosts, source)
    return hosts


def read_hostfile(path, fix):
    """The text of the hostfile at `path`; `fix` says what to do when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as stream:
            return stream.read()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise ClusterConfigError(f"hostfile {path!r} cannot be read ({reason}); {fix}") from None


def parse_hostfile(text, source):
    """Hosts listed in an Open MPI hostfile, in file order.

    Accepted lines: `host slots=N`, `host` alone (slots None: the caller decides), blank lines and
    `#` comments (whole-line or trailing). Other words such as `max_slots=` are rejected rather
    than guessed at, since they change where Open MPI places ranks.
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if words:
            hosts.append(_parse_hostfile_line(words, f"hostfile {source} line {number} "
                                                     f"({raw.strip()!r})"))
    if not hosts:
        raise ClusterConfigError(
            f"hostfile {source} lists no hosts; it needs lines like 'worker-0 slots=8'")
    _reject_duplicates(hosts, f"hostfile {source}")
    return hosts


def _parse_hostfile_line(words, where):
    name = words[0]
    if not is_valid_address(name):
        raise ClusterConfigError(f"{where}: {name!r} is not an IPv4/IPv6 address or host name")
    if len(words) > 2 or (len(words) == 2 and not _SLOTS.match(words[1])):
        raise ClusterConfigError(f"{where}: expected 'HOST' or 'HOST slots=N'")
    if len(words) == 1:
        return Host(name, None)
    slots = int(_SLOTS.match(words[1]).group(1))
    if slots < 1:
        raise ClusterConfigError(f"{where}: slots must be at least 1")
    return Host(name, slots)


def _reject_duplicates(hosts, source):
    seen = set()
    for host in hosts:
        if host.name in seen:
            raise ClusterConfigError(
                f"{source}: host {host.name!r} is listed twice; list each box once")
        seen.add(host.name)


def format_hostfile(hosts):
    """Open MPI hostfile text, one `host slots=N` line per box."""
    return "".join(f"{host.name} slots={host.slots}\n" for host in hosts)


def rank_hosts(hosts):
    """The host of every rank in rank order: each host repeated once per slot."""
    return [host.name for host in hosts for _ in range(host.slots)]


def parse_port(text, source):
    """A TCP port number from user text such as an environment variable's value."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or not 1 <= int(text) <= 65535:
        raise ClusterConfigError(f"{source}={text!r} is not a TCP port; use a number 1-65535")
    return int(text)
