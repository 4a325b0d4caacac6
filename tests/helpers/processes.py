"""Waiting for a test's child process and ending it: its output, and never a
process left behind.

    from helpers.processes import finish, wait_for_backup

    wait_for_backup(process, model_dir)   # training is past its first steps
    process.send_signal(signal.SIGTERM)
    code, out = finish(process, timeout=60)
"""

import re
import time


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


def newest_backup(model_dir):
    """The number of the newest committed backup in `model_dir/backup`: the
    highest `ckpt-N` its index (`backup/checkpoint`, replaced whole on each
    commit) lists, 0 if none. A backup whose files exist but that the index
    does not list yet is still being written, and a kill then resumes from
    the one before it.

    Example: `newest_backup(tmp_path / "run")`
    """
    try:
        index = (model_dir / "backup" / "checkpoint").read_text()
    except FileNotFoundError:
        return 0
    return max((int(n) for n in re.findall(r'"ckpt-(\d+)"', index)), default=0)


def wait_for_backup(process, model_dir, after=0, deadline=240):
    """Waits until a backup newer than number `after` is committed (training
    is past its first steps); returns its number. Fails the test if `process`
    exits first or after `deadline` seconds.

    Example: `wait_for_backup(process, tmp_path / "run", after=1)`
    """
    until = time.monotonic() + deadline
    while newest_backup(model_dir) <= after:
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < until, "no backup was written in time"
        time.sleep(0.1)
    return newest_backup(model_dir)
