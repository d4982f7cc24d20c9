"""Where a training run's wall time went: start-up, training steps, evaluations, checkpoints
and the rest, from the process's start to the end of the mode; one line printed by rank 0 at
the end of train and train_and_eval, and a `wall_time` record in the JSON log.

The phases split the time exactly (their sum is the total): at any moment the run is in one of
them, the innermost one entered. Start-up is everything up to the end of the first training
step (imports, set-up, building the graphs, creating the session, restoring, the first step,
which also optimises the graph); a training step is one session.run of the training graph with
its hooks' fetches; an evaluation is one evaluation of a checkpoint on all ranks (rank 0's
time includes waiting for the others); a checkpoint is one save (rank 0 only); other is the
rest (the hooks' own work between steps, the log and summaries, the end of the run).
"""
import resource
import time

import tensorflow as tf

from efficientdet_hpu.engine import train_log

tf1 = tf.compat.v1

STARTUP, STEPS, EVALUATIONS, CHECKPOINTS, OTHER = (
    'start-up', 'training steps', 'evaluations', 'checkpoints', 'other')
PHASES = (STARTUP, STEPS, EVALUATIONS, CHECKPOINTS, OTHER)
_RECORD_KEYS = {STARTUP: 'startup', STEPS: 'steps', EVALUATIONS: 'evaluations',
                CHECKPOINTS: 'checkpoints', OTHER: 'other'}


def process_cpu_sec():
    """User + system CPU seconds of this process so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class WallTime:
    """The run's clock: seconds and counts per phase since the process started, on the
    monotonic clock (a step of the system clock, e.g. when a VM resumes, moves none of them)."""

    def __init__(self):
        age = train_log.process_age_sec()
        self._since = time.monotonic()
        self._started = self._since - (age or 0.0)
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.seconds[STARTUP] = self._since - self._started
        self.counts = dict.fromkeys(PHASES, 0)
        self._stack = [STARTUP]  # The base phase, then the phases entered.

    def _switch(self):
        now = time.monotonic()
        self.seconds[self._stack[-1]] += now - self._since
        self._since = now

    def enter(self, phase):
        """Counts one `phase` and charges the time from now on to it, until leave()."""
        self._switch()
        self._stack.append(phase)
        self.counts[phase] += 1

    def leave(self, phase):
        """Back to the phase before enter(phase); a phase never entered (its step raised
        before) is ignored."""
        if phase in self._stack[1:]:
            self._switch()
            del self._stack[len(self._stack) - 1 - self._stack[::-1].index(phase):]

    def started_training(self):
        """The first step ended: start-up is over, the time between phases is `other`."""
        if self._stack[0] == STARTUP:
            self._switch()
            self._stack[0] = OTHER

    @property
    def training_started(self):
        return self._stack[0] != STARTUP

    def totals(self):
        """{phase: seconds} up to now; their sum is the wall time since the process started."""
        self._switch()
        return dict(self.seconds)

    def record(self, mode, step):
        """The JSON log's `wall_time` record."""
        seconds = self.totals()
        record = {'event': 'wall_time', 'mode': mode, 'step': int(step),
                  'wall_sec': sum(seconds.values()), 'cpu_sec': process_cpu_sec(),
                  'training_steps': self.counts[STEPS] + (1 if self.training_started else 0),
                  'evaluations': self.counts[EVALUATIONS],
                  'checkpoints': self.counts[CHECKPOINTS],
                  'peak_host_memory_mb': train_log.host_memory_mb()[1]}
        for phase, key in _RECORD_KEYS.items():
            record[key + '_sec'] = seconds[phase]
        return record


class _Phase:
    def __init__(self, clock, phase):
        self._clock, self._phase = clock, phase

    def __enter__(self):
        if self._clock is not None:
            self._clock.enter(self._phase)
        return self

    def __exit__(self, *exc_info):
        if self._clock is not None:
            self._clock.leave(self._phase)
        return False


def phase(clock, name):
    """`with wall_time.phase(clock, EVALUATIONS):` the block charged to that phase of `clock`
    (a WallTime; None measures nothing)."""
    return _Phase(clock, name)


def summary_line(record):
    """'wall time 75.3 s: start-up 20.1 s (27%), training steps ...' of a `record`."""
    total = max(record['wall_sec'], 1e-9)
    counted = {STEPS: ('training_steps', 'steps'), EVALUATIONS: ('evaluations', ''),
               CHECKPOINTS: ('checkpoints', '')}
    parts = []
    for phase_name, key in _RECORD_KEYS.items():
        seconds = record[key + '_sec']
        share = '%.0f%%' % (100.0 * seconds / total)
        if phase_name in counted:
            count_key, unit = counted[phase_name]
            share += ', %d%s' % (record[count_key], ' ' + unit if unit else '')
        parts.append('%s %.1f s (%s)' % (phase_name, seconds, share))
    return 'wall time %.1f s: %s; process CPU %.1f s' % (record['wall_sec'], ', '.join(parts),
                                                         record['cpu_sec'])


class StepTimeHook(tf1.train.SessionRunHook):
    """Charges each training step (its before_run to its after_run: put it first among the
    hooks, so the others' before_run and the session.run fall inside) to the clock: the first
    step of the run to start-up, the others to training steps."""

    def __init__(self, clock):
        self._clock = clock
        self._phase = None

    def before_run(self, run_context):
        self._phase = STARTUP if not self._clock.training_started else STEPS
        if self._phase == STEPS:
            self._clock.enter(STEPS)

    def after_run(self, run_context, run_values):
        if self._phase == STEPS:
            self._clock.leave(STEPS)
        else:
            self._clock.started_training()
        self._phase = None
