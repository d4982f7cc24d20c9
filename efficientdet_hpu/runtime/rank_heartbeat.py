"""A rank's heartbeat for the launcher's stall watch (launch/heartbeat.py says why: a rank
stopped as a whole is invisible to Horovod's own stall check).

Started by distributed.init() when demo_efficientdet.py's mpirun of two or more ranks set
EFFICIENTDET_HEARTBEAT_DIR; stopped (and `done` written) when the process ends.
"""
import atexit
import os
import socket
import threading

# Shared with the launcher's stall watch (launch/heartbeat.py imports them).
HEARTBEAT_DIR_ENV = 'EFFICIENTDET_HEARTBEAT_DIR'
HEARTBEAT_SECONDS = 2.0
DONE = 'done'  # What a rank that ended normally writes: not a stall.


def start_if_asked():
    """Starts this rank's heartbeat (once) when the launcher asked for one."""
    directory = os.environ.get(HEARTBEAT_DIR_ENV)
    rank_text = os.environ.get('OMPI_COMM_WORLD_RANK', '')
    if directory and rank_text.isdigit() and Heartbeat.current is None:
        Heartbeat.current = Heartbeat(os.path.join(directory, 'rank.' + rank_text))
        atexit.register(Heartbeat.current.stop)


class Heartbeat:
    """A daemon thread rewriting `path` with 'COUNT PID HOST' every HEARTBEAT_SECONDS until
    stop(), which writes 'done' (a normal end is not a stall). Write errors are ignored: a
    missing heartbeat only makes the launcher's stall check blind, never wrong."""
    current = None

    def __init__(self, path):
        self.path = path
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name='efficientdet:heartbeat', daemon=True)
        self._thread.start()

    def _write(self, text):
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path + '.tmp', 'w', encoding='utf-8') as stream:
                stream.write(text)
            os.replace(self.path + '.tmp', self.path)
        except OSError:
            pass

    def _beat(self):
        count = 0
        while not self._stopped.is_set():
            count += 1
            self._write('%d %d %s\n' % (count, os.getpid(), socket.gethostname()))
            self._stopped.wait(HEARTBEAT_SECONDS)

    def stop(self):
        self._stopped.set()
        self._thread.join(timeout=HEARTBEAT_SECONDS + 5)
        self._write('%s %d\n' % (DONE, os.getpid()))
