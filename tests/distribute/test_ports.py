"""tfdist.distribute.ports: can a server listen on a port, and which process holds it (no TensorFlow)."""

import os
import socket
import subprocess
import sys

import pytest

from tfdist.distribute.ports import PortInUseError, bind_error, check_port_free, port_holders

HOLDER = ("import socket, sys, time\n"
          "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
          "s.bind(('127.0.0.1', 0))\n"
          "s.listen()\n"
          "print(s.getsockname()[1], flush=True)\n"
          "sys.stdin.read()\n")


@pytest.fixture
def held_port():
    """A port a child process listens on (on 127.0.0.1 only) until the test ends: (port, pid)."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, "port-holder"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        yield port, child.pid
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_free_port_passes():
    port = free_port()
    assert bind_error(port) is None and port_holders(port) == []
    check_port_free(port)


def test_a_port_held_on_loopback_only_is_still_taken_for_a_server_on_every_interface(held_port):
    port, pid = held_port
    error = bind_error(port)
    assert isinstance(error, OSError) and "in use" in str(error)
    assert port_holders(port) == [(pid, f"python -c {HOLDER.replace(chr(10), ' ')} port-holder"[:77]
                                   + "...")]


def test_the_error_names_the_port_the_holder_and_the_way_out(held_port):
    port, pid = held_port
    with pytest.raises(PortInUseError) as caught:
        check_port_free(port, who=f"worker 1 at 127.0.0.1:{port} (TF_CONFIG)")
    message = str(caught.value)
    assert message.startswith(f"worker 1 at 127.0.0.1:{port} (TF_CONFIG) cannot start its server: "
                              f"port {port} is already in use by pid {pid} (python -c ")
    assert "Stop that process, or give this task a free port" in message
    assert isinstance(caught.value, RuntimeError)


def test_a_port_this_process_holds_passes(monkeypatch):
    # It may be a TensorFlow server this very process started.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_holders(port) == [(os.getpid(), port_holders(port)[0][1])]
        check_port_free(port)


def test_a_holder_that_cannot_be_read_is_another_process(held_port, monkeypatch):
    port, _ = held_port
    monkeypatch.setattr("tfdist.distribute.ports.TCP_TABLES", ())
    with pytest.raises(PortInUseError, match=f"port {port} is already in use by another process"):
        check_port_free(port)
