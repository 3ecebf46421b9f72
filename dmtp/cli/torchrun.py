"""torchrun (torch's `torch.distributed.run`, the same arguments), with an interruption told in one line: on Ctrl-C
or SIGTERM, exit 130 / 143 instead of torch's traceback.

    python -m dmtp.cli.torchrun --nproc_per_node=2 -m dmtp.cli train --profile smoke --target T --data D --out O
    dmtp-torchrun --nproc_per_node=8 -m dmtp.cli reproduce ...        # the same, as the installed command

torch's agent passes the signal on to every rank; each stops (`args.guard`: exit 130, rank 0 prints the line), then
the launcher exits without a line of its own. A rank that fails any other way keeps torch's report.
"""
from __future__ import annotations

import logging
import signal
import sys

# torch's agent logs the signal, each rank it passes it to and each that ended interrupted: the ranks' line says it
_AGENT_LOGS = ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api")
_SIGNAL_WORDS = ("death signal", "closing signal", "via signal", "(exitcode: 130)", "(exitcode: -2)", "(exitcode: -15)")


def _quiet_signal_logs() -> None:
    for name in _AGENT_LOGS:
        logging.getLogger(name).addFilter(lambda r: not any(w in r.getMessage() for w in _SIGNAL_WORDS))


def interrupted_status(codes) -> int | None:
    """The exit status of a launch whose ranks ended with `codes` (minus a signal's number) by an interruption: 130
    where one was interrupted and the others too or by torch's agent's SIGTERM; 143 where SIGTERM stopped them all;
    None otherwise."""
    codes, term = set(codes), {143, -signal.SIGTERM}
    if codes & {130, -signal.SIGINT} and codes <= {130, -signal.SIGINT} | term:
        return 130
    return 143 if codes and codes <= term else None


def main(argv=None):
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    _quiet_signal_logs()
    try:
        torchrun(argv)
    except SignalException as e:  # the launcher itself was signalled; its ranks have stopped
        sys.exit(128 + int(e.sigval))
    except ChildFailedError as e:  # the ranks were interrupted on their own (a scheduler signalling every process)
        status = interrupted_status(f.exitcode for f in e.failures.values())
        if status is None:
            raise
        sys.exit(status)


if __name__ == "__main__":
    main()
