"""torchrun, with an interruption told in one line: the same arguments as `torchrun` (it runs torch's own launcher,
`torch.distributed.run`), and on Ctrl-C (SIGINT) or SIGTERM the exit status a shell gives a killed command, 130 /
143, instead of torch's traceback.

    python -m dmtp.cli.torchrun --nproc_per_node=2 -m dmtp.cli train --profile smoke --target T --data D --out O
    dmtp-torchrun --nproc_per_node=8 -m dmtp.cli reproduce ...        # the same, as the installed command

torchrun starts each rank in a session of its own, so a terminal's Ctrl-C reaches the launcher alone; torch's agent
passes the signal on to every rank and waits for them. Each rank stops where it is (`args.guard`: exit 130; rank 0
prints the one line, `interrupted; the same command resumes from what was saved`), then the launcher exits 130 without
adding a line of its own. A rank that fails any other way keeps torch's report of it.
"""
from __future__ import annotations

import logging
import signal
import sys

# torch's agent logs the signal it got, each rank it passes it to and each rank that ended interrupted: the ranks'
# one line says it
_AGENT_LOGS = ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api")
_SIGNAL_WORDS = ("death signal", "closing signal", "via signal", "(exitcode: 130)", "(exitcode: -2)", "(exitcode: -15)")


def _quiet_signal_logs() -> None:
    for name in _AGENT_LOGS:
        logging.getLogger(name).addFilter(lambda r: not any(w in r.getMessage() for w in _SIGNAL_WORDS))


def interrupted_status(codes) -> int | None:
    """The exit status of a launch whose ranks ended with exit `codes` (a rank killed by a signal: minus its number),
    when they ended by an interruption: 130 where one was interrupted (SIGINT; `args.guard`'s exit), the others
    interrupted too or stopped by torch's agent (its SIGTERM to the ranks left once one has ended); 143 where SIGTERM
    stopped them all; None otherwise."""
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
