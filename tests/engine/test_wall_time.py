"""engine/wall_time.py: the phases split the wall time exactly (the innermost phase entered
is charged), the first step ends the start-up, the record and its one line."""
import time

import pytest

from efficientdet_hpu.engine import wall_time


def _sleep_in(clock, phase, seconds):
    with wall_time.phase(clock, phase):
        time.sleep(seconds)


def test_phases_add_up_to_the_wall_time_and_nest():
    clock = wall_time.WallTime()
    started = time.time()
    startup_before = clock.seconds[wall_time.STARTUP]
    assert startup_before > 0  # The process started before the clock.
    _sleep_in(clock, wall_time.CHECKPOINTS, 0.05)  # A save during start-up.
    clock.started_training()
    with wall_time.phase(clock, wall_time.EVALUATIONS):
        time.sleep(0.05)
        _sleep_in(clock, wall_time.CHECKPOINTS, 0.05)  # Innermost wins.
        time.sleep(0.05)
    clock.enter(wall_time.STEPS)
    time.sleep(0.05)
    clock.leave(wall_time.STEPS)
    clock.leave(wall_time.STEPS)  # Not entered any more: ignored.
    time.sleep(0.02)
    totals = clock.totals()
    elapsed = time.time() - started
    # Sleeps overrun on a loaded machine: each phase at least its sleeps, and not much more.
    assert sum(totals.values()) == pytest.approx(startup_before + elapsed, abs=0.05)
    for phase, slept in ((wall_time.CHECKPOINTS, 0.10), (wall_time.EVALUATIONS, 0.10),
                         (wall_time.STEPS, 0.05), (wall_time.OTHER, 0.02)):
        assert slept - 0.005 <= totals[phase] < slept + 0.5, phase
    assert clock.counts == {wall_time.STARTUP: 0, wall_time.STEPS: 1, wall_time.EVALUATIONS: 1,
                            wall_time.CHECKPOINTS: 2, wall_time.OTHER: 0}
    with wall_time.phase(None, wall_time.EVALUATIONS):  # No clock: nothing measured.
        pass


def test_record_and_line():
    record = {'event': 'wall_time', 'mode': 'train_and_eval', 'step': 200, 'wall_sec': 200.0,
              'cpu_sec': 350.25, 'training_steps': 200, 'evaluations': 4, 'checkpoints': 5,
              'startup_sec': 40.0, 'steps_sec': 120.0, 'evaluations_sec': 30.0,
              'checkpoints_sec': 6.0, 'other_sec': 4.0, 'peak_host_memory_mb': 2000.0}
    assert wall_time.summary_line(record) == (
        'wall time 200.0 s: start-up 40.0 s (20%), training steps 120.0 s (60%, 200 steps), '
        'evaluations 30.0 s (15%, 4), checkpoints 6.0 s (3%, 5), other 4.0 s (2%); process '
        'CPU 350.2 s')
    clock = wall_time.WallTime()
    made = clock.record('train', 7)
    assert set(made) == set(record)
    assert (made['event'], made['mode'], made['step'], made['training_steps']) == (
        'wall_time', 'train', 7, 0)
