"""Can a server listen on a TCP port, and which process holds it if not.

A multi-worker task starts TensorFlow's gRPC server on the port of its own
TF_CONFIG address. That server listens on every interface (`0.0.0.0:PORT`,
which gRPC opens as a dual-stack `[::]` socket where the machine has IPv6,
else IPv4 only) with SO_REUSEADDR and without SO_REUSEPORT. When another
process holds the port, the server cannot start, and TensorFlow says so
only at the end of a long wait for peers. `check_port_free` tries the same
bind first, in a fraction of a second, and names the process that holds the
port (from `/proc/net/tcp{,6}` and `/proc/PID/fd`; "another process" where
that cannot be read). No TensorFlow import.

Example:

    check_port_free(2222, who="worker 0 at 10.0.0.1:2222")
"""

import errno
import os
import socket

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN = "0A"      # socket states in /proc/net/tcp (include/net/tcp_states.h)
TCP_TIME_WAIT = "06"


class PortInUseError(RuntimeError):
    """A server cannot listen on a port; the message names it and who holds it.

    Example:

        try:
            check_port_free(12345, who="worker 0")
        except PortInUseError as error:
            print(error)  # names the port and the process that holds it
    """


def bind_error(port):
    """Returns why a server could not listen on `port` on every interface now, or None.

    Binds (and closes at once) a socket the way TensorFlow's gRPC server
    does: a dual-stack IPv6 wildcard with SO_REUSEADDR, then, if that fails
    or IPv6 is missing, an IPv4 wildcard; the port counts as free when
    either works (gRPC then serves on that one).

    Args:
        port: a TCP port number, 1..65535.

    Returns:
        None when free, else the `OSError` of the last bind tried.

    Example:

    >>> bind_error(2222) is None   # nothing listens on 2222
    True
    """
    error = None
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as failure:  # no IPv6 on this machine
            error = error or failure
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((host, port))
            return None
        except OSError as failure:
            error = failure
        finally:
            sock.close()
    return error


def port_holders(port):
    """Returns the processes holding TCP `port`, as `[(pid, command line)]`.

    Listening sockets come first. Reads `/proc/net/tcp`, `/proc/net/tcp6` and
    every `/proc/PID/fd`; processes whose descriptors cannot be read (another
    user's, without root) are left out, so the list can be empty even when
    the port is taken.

    Args:
        port: a TCP port number.

    Example:

    >>> port_holders(2222)
    [(4242, 'python -m http.server 2222')]
    """
    inodes = _socket_inodes(port)
    if not inodes:
        return []
    wanted = {f"socket:[{inode}]": rank for rank, inode in enumerate(inodes)}
    found = {}
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            descriptors = os.listdir(fd_dir)
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                target = os.readlink(f"{fd_dir}/{descriptor}")
            except OSError:
                continue
            if target in wanted:
                rank = wanted[target]
                found[int(pid)] = min(rank, found.get(int(pid), rank))
    return [(pid, _command_line(pid)) for pid in sorted(found, key=lambda p: (found[p], p))]


def describe_holders(port, holders=None):
    """Names who holds `port`: "pid 42 (python -m http.server)", or "another process".

    Args:
        port: a TCP port number.
        holders: `port_holders(port)` when already known, else None.

    Example:

    >>> describe_holders(2222)
    'pid 4242 (python -m http.server 2222)'
    """
    holders = port_holders(port) if holders is None else holders
    if not holders:
        return "another process (its owner could not be read from /proc)"
    return ", ".join(f"pid {pid} ({command})" for pid, command in holders[:3]) + (
        f" and {len(holders) - 3} more" if len(holders) > 3 else "")


def check_port_free(port, who="this process"):
    """Refuses a port a server of this process could not listen on.

    A port held only by this very process passes: it may be a TensorFlow
    server this process started itself.

    Args:
        port: the TCP port the server will listen on (every interface).
        who: the task, for the message, e.g. "worker 0 at 10.0.0.1:2222".

    Raises:
        PortInUseError: the port is taken (or not allowed); the message
            names the port, the process holding it where it can be found,
            and the way out.

    Example:

    >>> check_port_free(2222, who="worker 0 at 10.0.0.1:2222")
    """
    error = bind_error(port)
    if error is None:
        return
    holders = port_holders(port)
    if holders and {pid for pid, _ in holders} == {os.getpid()}:
        return
    if error.errno == errno.EADDRINUSE:
        reason = f"port {port} is already in use by {describe_holders(port, holders)}"
    else:
        reason = f"binding port {port} failed: {error.strerror or error}"
    raise PortInUseError(
        f"{who} cannot start its server: {reason}. TensorFlow's server listens on port {port} "
        "on every interface, so no other process may hold it. Stop that process, or give this "
        "task a free port in its address (`python -m tfdist.launch` picks free ports itself).")


def _socket_inodes(port):
    """Inodes of the TCP sockets bound to local `port`, listening ones first."""
    listening, other = [], []
    for table in TCP_TABLES:
        try:
            with open(table) as stream:
                lines = stream.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, state, inode = fields[1], fields[3], fields[9]
            try:
                local_port = int(local.rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            if local_port != port or inode == "0" or state == TCP_TIME_WAIT:
                continue
            (listening if state == TCP_LISTEN else other).append(inode)
    return list(dict.fromkeys(listening + other))


def _command_line(pid, limit=80):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            words = [word.decode(errors="replace") for word in stream.read().split(b"\0") if word]
    except OSError:
        words = []
    if words:
        words[0] = os.path.basename(words[0])
        text = " ".join(" ".join(words).split())  # one line, whatever the arguments hold
    else:
        try:
            with open(f"/proc/{pid}/comm") as stream:
                text = stream.read().strip()
        except OSError:
            text = "unknown"
    return text if len(text) <= limit else text[:limit - 3] + "..."
