"""The command line of the launcher: `python -m tfdist.launch ... -- command`."""

import argparse
import sys

from tfdist.runtime.argtypes import int_at_least, seconds
from tfdist.launch.network import PrivateNetworkError, enter_private_network, interfaces
from tfdist.launch.supervisor import DEFAULT_GRACE_PERIOD, MESSAGE_PREFIX, launch

NETWORK_MODES = ("private", "shared")

USAGE_EXAMPLE = "python -m tfdist.launch --workers 2 -- python train.py"

_positive_int = int_at_least(1)
_seconds = seconds(zero_means="disables it")


def build_parser():
    """Returns the `argparse.ArgumentParser` of `python -m tfdist.launch`.

    Example:

    >>> build_parser().parse_args(["--workers", "2"]).workers
    2
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.launch",
        description="Run a command as N TensorFlow workers on this machine, each "
                    "with its own TF_CONFIG, and stop them all when one fails.",
        epilog=f"Example: {USAGE_EXAMPLE}. On a real cluster TF_CONFIG comes from "
               "the cluster (Kubeflow TFJob, SLURM, ...) and no launcher is needed.")
    parser.add_argument("--workers", type=_positive_int, required=True,
                        help="number of worker processes (>= 1)")
    parser.add_argument("--ps", type=int_at_least(0), default=0,
                        help="number of parameter-server tasks (default 0). With M >= 1 the "
                             "job is 1 chief + N workers + M ps tasks of the same command "
                             "(tf.distribute.ParameterServerStrategy): its exit status is the "
                             "chief's, a lost worker is not fatal, a lost ps task fails the "
                             "chief")
    parser.add_argument("--devices-per-worker", type=_positive_int, default=None,
                        help="exported to each worker (and the chief) as "
                             "TFDIST_DEVICES_PER_WORKER")
    parser.add_argument("--gpus-per-worker", type=_positive_int, default=None,
                        help="give each worker K GPUs of its own (CUDA_VISIBLE_DEVICES: "
                             "worker i gets the i-th K of the launcher's GPUs; with --ps the "
                             "chief gets the first K, ps tasks none); default: every worker "
                             "sees every GPU")
    parser.add_argument("--startup-timeout", type=_seconds, default=300.0,
                        help="seconds for every worker to create its TFDIST_READY_FILE "
                             "or exit 0 (default 300; 0 disables); exit 125 otherwise")
    parser.add_argument("--timeout", type=_seconds, default=None,
                        help="job deadline in seconds (default none; 0 disables it too); exit 124 "
                             "when passed")
    parser.add_argument("--grace-period", type=_seconds, default=DEFAULT_GRACE_PERIOD,
                        help="seconds between SIGTERM and SIGKILL when stopping workers: the "
                             "time they have to save a backup at the same step and exit "
                             f"(default {DEFAULT_GRACE_PERIOD:g})")
    parser.add_argument("--max-restarts", type=int_at_least(0), default=0,
                        help="start the whole job again, up to N times, after a worker fails "
                             "or is preempted (exit 143) or misses the start-up deadline; it "
                             "resumes from its backups (default 0: no restart)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address in the workers' TF_CONFIG (default 127.0.0.1). TensorFlow's "
                             "servers listen on every interface whatever it is: see --network")
    parser.add_argument("--network", choices=NETWORK_MODES, default="private",
                        help="private (default): run the job in a network namespace of its own, "
                             "where the workers reach each other and nothing else, and nothing "
                             "outside reaches their unauthenticated gRPC servers (no internet or "
                             "remote storage either). shared: the machine's network; the servers "
                             "listen on every interface (0.0.0.0), a warning says so")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the worker command, after --")
    return parser


def parse_args(argv):
    """Parses launcher arguments; exits 2 with a message on bad input.

    Args:
        argv: the arguments after the program name.

    Example:

    >>> parse_args(["--workers", "2", "--", "python", "train.py"]).command
    ['python', 'train.py']
    """
    parser = build_parser()
    if "--" in argv:
        split = argv.index("--")
        args = parser.parse_args(argv[:split])
        if args.command:
            parser.error(f"unexpected argument(s) before --: {' '.join(args.command)!r}")
        args.command = argv[split + 1:]
    else:
        args = parser.parse_args(argv)
    if not args.command:
        parser.error(f"missing the worker command after --; for example: {USAGE_EXAMPLE}")
    return args


def main(argv=None):
    """Runs the launcher command line and returns its exit status.

    Args:
        argv: the arguments after the program name (default `sys.argv[1:]`).

    Example:

    >>> main(["--workers", "2", "--", "python", "-c", "print('hi')"])  # doctest: +SKIP
    0
    """
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.network == "private":
        try:
            enter_private_network()  # still one thread: the workers inherit the namespace
        except PrivateNetworkError as error:
            print(f"{MESSAGE_PREFIX}error: {error.strerror}", file=sys.stderr)
            return 2
        print(f"{MESSAGE_PREFIX}private network: the workers see only {', '.join(interfaces())} "
              "(no outside network; --network shared to use the machine's).", file=sys.stderr)
    else:
        print(f"{MESSAGE_PREFIX}warning: --network shared: TensorFlow's gRPC servers listen on "
              "every interface of this machine (0.0.0.0:PORT), not only on --host, and accept "
              "unauthenticated requests; keep the machine behind a firewall.", file=sys.stderr)
    try:
        return launch(args.command, args.workers, ps=args.ps,
                      devices_per_worker=args.devices_per_worker,
                      gpus_per_worker=args.gpus_per_worker,
                      startup_timeout=args.startup_timeout, timeout=args.timeout,
                      host=args.host, grace_period=args.grace_period,
                      max_restarts=args.max_restarts)
    except ValueError as error:
        build_parser().error(str(error))
