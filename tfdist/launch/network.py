"""A private network for the launcher's workers.

TensorFlow's gRPC server listens on every interface (it binds `0.0.0.0:PORT`
whatever host TF_CONFIG names; there is no option to bind one address), and
its worker service is unauthenticated: any machine that reaches the port can
run operations in the worker. The launcher therefore cannot make the
servers listen on 127.0.0.1 only. What it can do on Linux is run the whole
job in a network namespace of its own, where the only interface is a
loopback: the workers reach each other and nothing else, and nothing
outside reaches them.

Example:

    enter_private_network()   # before any thread starts; the workers inherit it
"""

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


class PrivateNetworkError(OSError):
    """The private network namespace could not be made here; the message says why.

    Example:

        try:
            enter_private_network()
        except PrivateNetworkError as error:
            print(error)  # for example: no user namespaces on this machine
    """


def enter_private_network():
    """Moves this process into a new network namespace with only a loopback (up).

    As root, a new network namespace; otherwise a new user namespace (this
    user mapped to root inside it) and a network namespace. Must be called
    while the process has a single thread. Children started afterwards
    share the namespace.

    Raises:
        PrivateNetworkError: the kernel refused (e.g. unprivileged user
            namespaces are disabled, or inside a restricted container); the
            message names the error and the ways out.

    Example:

    >>> enter_private_network()
    >>> socket.gethostbyname("localhost")
    '127.0.0.1'
    """
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise PrivateNetworkError(
            errno, f"cannot create a private network namespace ({os.strerror(errno)}; "
                   "unprivileged user namespaces may be disabled, e.g. "
                   "kernel.unprivileged_userns_clone=0, or a container forbids unshare). "
                   "Run with --network shared (the workers' servers then listen on every "
                   "interface: keep the machine behind a firewall), or allow user namespaces.")
    if flags & CLONE_NEWUSER:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    _bring_loopback_up()


def _write(path, text):
    with open(path, "w") as stream:
        stream.write(text)


def _bring_loopback_up():
    """`ip link set lo up`, without needing the ip command."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        current = struct.unpack("16sH14s", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", current | _IFF_UP, b""))


def interfaces():
    """The network interfaces this process sees (`lo` alone in a private network).

    Example:

    >>> interfaces()
    ['lo']
    """
    return sorted(name for _, name in socket.if_nameindex())
