"""Ending a test's child process: its output, and never a process left behind.

    from helpers.processes import finish

    process.send_signal(signal.SIGTERM)
    code, out = finish(process, timeout=60)
"""


def finish(process, timeout):
    """Waits up to `timeout` s for `process` to exit; kills it if it is still running then.

    Returns:
        `(returncode, stdout)`; the return code is the kill's (-9) when the
        wait ran out (the `TimeoutExpired` is raised after the kill).

    Example: `code, out = finish(subprocess.Popen(cmd, stdout=PIPE, text=True), 60)`
    """
    try:
        out, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, out
