"""A job of two or more ranks whose rank stops answering ends with a line naming that rank, not
a hang.

Horovod's stall inspector (HOROVOD_STALL_CHECK_TIME_SECONDS, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)
ends a job whose ranks are alive but did not all submit the same tensor. It cannot see a rank
that stopped as a whole (SIGSTOP, a frozen box, a box cut off from the network): its check runs
in Horovod's background loop, between the MPI collectives of the loop, and rank 0's loop then
waits inside such a collective for good (measured here: no warning, no shutdown, after minutes).

So under the launcher's mpirun of two or more ranks every rank also beats: a thread of the rank
(runtime/rank_heartbeat.py) rewrites `<dir>/rank.<r>` every HEARTBEAT_SECONDS with a counter, its
pid and its host; `done` when the rank ends normally. The launcher watches those files (in
model_dir, on storage every box shares, for many boxes; in the temporary folder for one) and, when one has not changed for the stall
shutdown time, prints the rank, its box and pid, and ends the job. Changes are timed on the
launcher's own clock, so the boxes' clocks need not agree.
"""

import dataclasses
import os
import re
import time

from efficientdet_hpu.launch.hosts import ClusterConfigError
from efficientdet_hpu.runtime.rank_heartbeat import DONE, HEARTBEAT_DIR_ENV  # noqa: F401

STALL_CHECK_ENV = "HOROVOD_STALL_CHECK_TIME_SECONDS"
STALL_SHUTDOWN_ENV = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
HOROVOD_STALL_CHECK_DEFAULT = 60     # Horovod's own default
DEFAULT_STALL_SHUTDOWN = 300         # the launcher's default for multi-box jobs
_RANK_FILE = re.compile(r"rank\.([0-9]+)")


@dataclasses.dataclass(frozen=True)
class Stall:
    rank: int
    host: str
    pid: str
    seconds: float


def _seconds(environ, name, default):
    text = environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit():
        raise ClusterConfigError(f"{name}={text!r} is not a number of seconds; use a whole "
                                 f"number such as 300, or 0 to turn the stall shutdown off")
    return int(text)


def stall_settings(environ):
    """(environment additions, stall shutdown seconds) for a multi-box job: Horovod's stall
    shutdown on by default (DEFAULT_STALL_SHUTDOWN, never below the check time, under which
    Horovod would ignore it); a value the user set is kept, 0 turns both checks off."""
    check = _seconds(environ, STALL_CHECK_ENV, HOROVOD_STALL_CHECK_DEFAULT)
    shutdown = _seconds(environ, STALL_SHUTDOWN_ENV, max(DEFAULT_STALL_SHUTDOWN, check))
    additions = {} if STALL_SHUTDOWN_ENV in environ else {STALL_SHUTDOWN_ENV: str(shutdown)}
    return additions, shutdown


class StallWatch:
    """Reads the heartbeat files of `directory`; `rank_hosts` is every rank's box in rank order.
    `check()` returns the first rank whose file has not changed for `stall_seconds`, else None.
    A rank that has not beaten yet, or said `done`, is not judged."""

    def __init__(self, directory, rank_hosts, stall_seconds, clock=time.monotonic):
        self.directory = directory
        self.rank_hosts = list(rank_hosts)
        self.stall_seconds = stall_seconds
        self._clock = clock
        self._seen = {}  # rank -> (file text, when it last changed)

    def check(self):
        now = self._clock()
        for rank, text in sorted(self._beats().items()):
            if text.startswith(DONE):
                self._seen.pop(rank, None)
                continue
            previous = self._seen.get(rank)
            if previous is None or previous[0] != text:
                self._seen[rank] = (text, now)
            elif now - previous[1] >= self.stall_seconds:
                words = text.split()
                host = (self.rank_hosts[rank] if rank < len(self.rank_hosts)
                        else (words[2] if len(words) > 2 else "?"))
                return Stall(rank, host, words[1] if len(words) > 1 else "?",
                             now - previous[1])
        return None

    def _beats(self):
        beats = {}
        try:
            names = os.listdir(self.directory)
        except OSError:
            return beats
        for name in names:
            match = _RANK_FILE.fullmatch(name)
            if not match:
                continue
            try:
                with open(os.path.join(self.directory, name), encoding="utf-8") as stream:
                    beats[int(match.group(1))] = stream.read()
            except OSError:
                continue
        return beats


def stall_line(stall, size):
    """The one line the launcher prints before ending a job on a stalled rank."""
    return (f"rank {stall.rank} of {size} (on {stall.host}, pid {stall.pid}) has not answered "
            f"for {stall.seconds:.0f} s (stopped, frozen or cut off from the other ranks): "
            f"ending the job ({STALL_SHUTDOWN_ENV} sets the time); the last checkpoint is kept "
            f"and the same command resumes from it")
