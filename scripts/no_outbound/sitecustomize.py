"""Loaded at interpreter start when this folder is on PYTHONPATH (scripts/liveserver.py does that
for `no_outbound=True`): every socket connection or name lookup that is not for a loopback
address is refused, and reported on stderr so a test can assert there was no attempt at all
(an app that caught the error would otherwise hide it)."""

import ipaddress
import socket
import sys
import traceback

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _is_local(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).strip("[]").lower()
    if host in _LOOPBACK_NAMES or host == "":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _address_is_local(sock, address) -> bool:
    if sock.family == getattr(socket, "AF_UNIX", None):
        return True  # a local file, never the network
    if isinstance(address, tuple) and address:
        return _is_local(address[0])
    return False


def _refuse(what, target):
    print(f"OUTBOUND-BLOCKED {what} {target!r}", file=sys.stderr, flush=True)
    traceback.print_stack(limit=8, file=sys.stderr)
    raise ConnectionRefusedError(f"outbound network disabled in this process ({what} {target!r})")


_connect, _connect_ex, _sendto = socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto
_getaddrinfo = socket.getaddrinfo


def connect(self, address):
    if not _address_is_local(self, address):
        _refuse("connect", address)
    return _connect(self, address)


def connect_ex(self, address):
    if not _address_is_local(self, address):
        _refuse("connect_ex", address)
    return _connect_ex(self, address)


def sendto(self, data, *args):
    address = args[-1]
    if not _address_is_local(self, address):
        _refuse("sendto", address)
    return _sendto(self, data, *args)


def getaddrinfo(host, *args, **kwargs):
    if not _is_local(host):
        _refuse("getaddrinfo", host)
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto = connect, connect_ex, sendto
socket.getaddrinfo = getaddrinfo
print("outbound guard active", file=sys.stderr, flush=True)
