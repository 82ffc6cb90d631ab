"""llama.cpp RPC endpoints for the target: parsing, the address policy, and a handshake with a deadline.

A ``ggml-rpc-server`` on another host exposes its devices (GPUs, or its CPU) to llama.cpp over TCP; the target's
offloaded layers are split over them and the local GPUs (``pydflash.native.rpc``). The drafter stays local, next to
the target features it reads.

The protocol has no authentication and no encryption: whoever reaches the port can read and write the server's
memory buffers and run graphs on it. So an endpoint must be a private address (loopback, RFC 1918, link-local,
carrier-grade NAT 100.64/10, as used by tailnets), and ``0.0.0.0`` (where a server *listens* on every interface,
never a host to connect to) and public addresses are refused unless the caller passes ``allow_public``.

llama.cpp's client aborts the whole process when a server is unreachable or speaks another protocol version, and
its ``connect`` and first reply have no deadline (a silent host blocks for minutes). So ``resolve_all`` resolves
each endpoint and applies the policy to the address it resolves to, and ``probe`` (called by
``pydflash.native.rpc`` before llama.cpp connects) runs the client's own HELLO and DEVICE_COUNT exchange
(ggml-rpc.cpp ``negotiate_hello``, ``ggml_backend_rpc_get_device_count``) with a timeout.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from typing import Iterable, NamedTuple, Optional, Union

from .errors import InvalidRequest, ModelLoadError

DEFAULT_PORT_HINT = 50052  # ggml-rpc-server's default port (tools/rpc/rpc-server.cpp), for messages only
MAX_SERVERS = 16  # GGML_RPC_MAX_SERVERS (ggml-rpc.h)
CONNECT_TIMEOUT_S = 5.0  # connect, then each reply of the handshake
FORCE = "--rpc-allow-public, or rpc_allow_public = true,"  # the CLI flag, the models.toml / EngineConfig field

# ggml-rpc.h / ggml-rpc.cpp (the vendored build's values; tests/native/test_rpc.py checks them against the header)
RPC_PROTO_MAJOR_VERSION = 7
RPC_PROTO_MINOR_VERSION = 0
RPC_CMD_HELLO = 14
RPC_CMD_DEVICE_COUNT = 15
RPC_CONN_CAPS_SIZE = 24  # transport.h: all zero = plain TCP, no RDMA upgrade

PRIVATE_NETS = tuple(ipaddress.IPv4Network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10"))
WILDCARD_NET = ipaddress.IPv4Network("0.0.0.0/8")
NOT_UNICAST_NETS = tuple(ipaddress.IPv4Network(n) for n in ("224.0.0.0/4", "240.0.0.0/4"))  # multicast, reserved
_HOSTNAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


class RpcEndpointError(InvalidRequest):
    """An RPC endpoint that is malformed, or refused by the address policy."""


class RpcUnreachable(ModelLoadError):
    """An RPC endpoint that did not answer the handshake (down, busy with another client, or another protocol)."""


class Endpoint(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """``host:port`` with an IPv4 address or a host name (llama.cpp's client speaks IPv4 only)."""
    if not isinstance(text, str):
        raise RpcEndpointError(f"RPC endpoint {text!r} must be a string 'host:port'")
    s = text.strip()
    if not s:
        raise RpcEndpointError("empty RPC endpoint (a stray comma?): write host:port[,host:port...]")
    if s.count(":") > 1 or s.startswith("["):
        raise RpcEndpointError(f"RPC endpoint {text!r}: IPv6 is not supported by llama.cpp's RPC client; "
                               "give an IPv4 address or a host name")
    host, sep, port = s.partition(":")
    if not sep:
        raise RpcEndpointError(
            f"RPC endpoint {text!r} has no port: write host:port (e.g. 10.0.0.2:{DEFAULT_PORT_HINT})")
    if not host or not _HOSTNAME.fullmatch(host):
        raise RpcEndpointError(f"RPC endpoint {text!r}: {host!r} is not an IPv4 address or host name")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise RpcEndpointError(f"RPC endpoint {text!r}: port {port!r} must be a number in 1..65535")
    _check_literal(Endpoint(host, int(port)), allow_public=True)  # a literal that is no host at all fails always
    return Endpoint(host, int(port))


def parse_endpoints(value: Union[str, Iterable[str]], allow_public: bool = False) -> tuple[Endpoint, ...]:
    """A comma-separated string or a list of ``host:port``; numeric hosts are checked against the policy here,
    host names when ``resolve_all`` resolves them."""
    if isinstance(value, str) and not value.strip():
        raise RpcEndpointError("no RPC endpoint given (write host:port[,host:port...])")
    items = value.split(",") if isinstance(value, str) else list(value)
    eps = tuple(parse_endpoint(x) for x in items)
    if len(eps) > MAX_SERVERS:
        raise RpcEndpointError(f"{len(eps)} RPC endpoints: llama.cpp takes at most {MAX_SERVERS}")
    dup = next((e for i, e in enumerate(eps) if e in eps[:i]), None)
    if dup is not None:
        raise RpcEndpointError(f"RPC endpoint {dup} is given twice")
    for ep in eps:
        _check_literal(ep, allow_public)
    return eps


def _numeric(host: str):
    """The IPv4 address of a numeric host as the C resolver reads it (``inet_aton``: "0", "127.1" included)."""
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _check_literal(ep: Endpoint, allow_public: bool) -> None:
    addr = _numeric(ep.host)
    if addr is not None:
        check_address(addr, ep, allow_public)


def check_address(addr: ipaddress.IPv4Address, ep: Endpoint, allow_public: bool) -> None:
    shown = str(ep) if ep.host == str(addr) else f"{ep} ({addr})"
    if any(addr in n for n in NOT_UNICAST_NETS) or addr == ipaddress.IPv4Address("255.255.255.255"):
        raise RpcEndpointError(f"RPC endpoint {shown}: not a unicast host address")
    if allow_public:
        return
    if addr in WILDCARD_NET:
        raise RpcEndpointError(
            f"RPC endpoint {shown}: {addr} is the wildcard a server listens on, not a host to connect to; give the "
            f"server's private address ({FORCE} forces it)")
    if not any(addr in n for n in PRIVATE_NETS):
        raise RpcEndpointError(
            f"RPC endpoint {shown} is a public address: llama.cpp RPC is unauthenticated and unencrypted, keep it on "
            f"a private network or an SSH tunnel ({FORCE} forces it)")


def resolve(ep: Endpoint, allow_public: bool = False) -> Endpoint:
    """The endpoint with its host resolved to the IPv4 address llama.cpp would connect to (``gethostbyname``),
    checked against the policy; llama.cpp is then given the address, so it cannot resolve to another."""
    try:
        addr = ipaddress.IPv4Address(socket.gethostbyname(ep.host))
    except (OSError, UnicodeError) as exc:
        raise RpcUnreachable(f"RPC endpoint {ep}: cannot resolve {ep.host!r} to an IPv4 address ({exc})") from None
    check_address(addr, ep, allow_public)
    return Endpoint(str(addr), ep.port)


def probe(ep: Endpoint, timeout_s: Optional[float] = None) -> int:
    """HELLO then DEVICE_COUNT, as llama.cpp's client opens a connection; returns the server's device count.

    Wire format (ggml-rpc.cpp ``send_rpc_cmd``): request = cmd (u8) | size (u64) | data, reply = size (u64) | data,
    little-endian. HELLO carries the client's 24 transport-capability bytes (zero: plain TCP) and answers
    major, minor, patch, padding (u8 each) and the server's capabilities. timeout_s: default CONNECT_TIMEOUT_S.
    """
    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        sock = socket.create_connection((ep.host, ep.port), timeout=timeout_s)
    except ConnectionRefusedError:
        raise RpcUnreachable(f"RPC server {ep}: connection refused (is ggml-rpc-server running there, "
                             "listening on that address and port?)") from None
    except socket.timeout:
        raise RpcUnreachable(f"RPC server {ep}: no answer within {timeout_s:g} s (host down, or the port "
                             "filtered)") from None
    except OSError as exc:
        raise RpcUnreachable(f"RPC server {ep}: cannot connect: {exc.strerror or exc}") from None
    with sock:
        try:
            sock.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            major, minor, patch = _reply(sock, 4 + RPC_CONN_CAPS_SIZE, ep)[:3]
            if major != RPC_PROTO_MAJOR_VERSION or minor > RPC_PROTO_MINOR_VERSION:
                raise RpcUnreachable(
                    f"RPC server {ep} speaks protocol {major}.{minor}.{patch}, this build "
                    f"{RPC_PROTO_MAJOR_VERSION}.{RPC_PROTO_MINOR_VERSION}.x: run the ggml-rpc-server of the same "
                    "llama.cpp version")
            sock.sendall(struct.pack("<BQ", RPC_CMD_DEVICE_COUNT, 0))
            (n_devices,) = struct.unpack("<I", _reply(sock, 4, ep))
        except socket.timeout:
            raise RpcUnreachable(
                f"RPC server {ep}: connected, but no handshake within {timeout_s:g} s: it is serving another client "
                "(ggml-rpc-server takes one at a time) or is not a ggml-rpc-server") from None
        except OSError as exc:
            raise RpcUnreachable(
                f"RPC server {ep}: connection lost during the handshake: {exc.strerror or exc}") from None
    if n_devices == 0:
        raise RpcUnreachable(f"RPC server {ep} exposes no devices")
    return n_devices


def _reply(sock: socket.socket, size: int, ep: Endpoint) -> bytes:
    head = _recv_exact(sock, 8, ep)
    (got,) = struct.unpack("<Q", head)
    if got != size:
        raise RpcUnreachable(f"RPC server {ep}: unexpected reply ({got} bytes, expected {size}): not a "
                             "ggml-rpc-server of this protocol version")
    return _recv_exact(sock, size, ep)


def _recv_exact(sock: socket.socket, n: int, ep: Endpoint) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise RpcUnreachable(f"RPC server {ep} closed the connection during the handshake (another protocol "
                                 "version, or not a ggml-rpc-server)")
        buf += chunk
    return buf


def resolve_all(endpoints: Iterable[Union[str, Endpoint]], allow_public: bool = False) -> tuple[str, ...]:
    """Parse, resolve and apply the policy to every endpoint: the ``ip:port`` strings to give llama.cpp.

    Two names for one server are refused: llama.cpp would open a second connection, which a ggml-rpc-server does
    not accept while the first is open. Raises RpcEndpointError or RpcUnreachable (a name that does not resolve)."""
    out: list[str] = []
    for ep in parse_endpoints([str(e) for e in endpoints], allow_public):
        addr = str(resolve(ep, allow_public))
        if addr in out:
            raise RpcEndpointError(f"RPC endpoint {ep} is {addr}, which is given twice")
        out.append(addr)
    return tuple(out)
