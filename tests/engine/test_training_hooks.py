"""The training log hook on a tiny graph: which steps it logs and what the JSON log holds."""
import tensorflow as tf

from efficientdet_hpu.training import det_model_fn
from efficientdet_hpu.engine import hooks
from efficientdet_hpu.engine import train_log

tf1 = tf.compat.v1


def _train_with_log_hook(model_dir, steps, every_n, stop_step):
    """Runs `steps` steps of a graph that only counts, under a TrainLogHook.

    The hook reads the global step as the Estimator's hooks do, before the step's update: the
    run the hook sees fetches only, and the update follows on the raw session."""
    with tf.Graph().as_default():
        global_step = tf1.train.get_or_create_global_step()
        tf1.get_variable('w', initializer=1.0)  # The hook's end-of-run weights checksum.
        for index, _ in enumerate(det_model_fn.TRAIN_LOG_KEYS):
            tf1.add_to_collection(det_model_fn.TRAIN_LOG_COLLECTION,
                                  tf.cast(global_step, tf.float32) + index)
        increment, nothing = tf1.assign_add(global_step, 1), tf.no_op()
        hook = hooks.TrainLogHook(str(model_dir), global_batch=4, total_steps=stop_step,
                                  every_n_steps=every_n, write_files=True, stop_step=stop_step)

        def step(step_context):
            step_context.run_with_hooks(nothing)
            step_context.session.run(increment)
        with tf1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(steps):
                session.run_step_fn(step)


def test_last_step_is_logged_when_not_a_multiple_of_the_interval(tmp_path):
    # 7 steps logged every 3: steps 3 and 6 by the interval, 7 because the call stops there.
    _train_with_log_hook(tmp_path, steps=7, every_n=3, stop_step=7)
    records = [r for r in train_log.read_json_log(str(tmp_path)) if r['event'] == 'train']
    assert [r['step'] for r in records] == [3, 6, 7]
    # Each record carries the scalars fetched before that step's update (step - 1 + index).
    assert records[-1]['loss'] == 6.0 and records[-1]['cls_loss'] == 7.0
    assert records[-1]['images_per_sec'] > 0 and records[-1]['eta_sec'] == 0


def test_interval_steps_only_when_the_call_stops_later(tmp_path):
    _train_with_log_hook(tmp_path, steps=5, every_n=2, stop_step=100)
    steps = [r['step'] for r in train_log.read_json_log(str(tmp_path))]
    assert steps == [2, 4]


def test_summary_hook_fetches_the_same_every_step_and_writes_every_n(tmp_path):
    """SummaryHook asks for the same fetches at every step (one graph optimisation in the
    session, where Estimator's SummarySaverHook alternated two) and writes the summaries at
    the first step and every n steps after, with a SessionLog START first."""
    with tf.Graph().as_default():
        global_step = tf1.train.get_or_create_global_step()
        tf1.summary.scalar('train/value', tf.cast(global_step, tf.float32) * 2.0)
        increment, nothing = tf1.assign_add(global_step, 1), tf.no_op()
        hook = hooks.SummaryHook(str(tmp_path), every_n_steps=3)
        fetches = []

        def step(step_context):
            step_context.run_with_hooks(nothing)
            fetches.append(hook.before_run(None).fetches)
            step_context.session.run(increment)
        with tf1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(8):
                session.run_step_fn(step)
    assert all(f == fetches[0] for f in fetches) and set(fetches[0]) == {'step', 'summary'}
    (events_file,) = tmp_path.glob('events.out.tfevents.*')
    events = list(tf1.train.summary_iterator(str(events_file)))
    assert [e.session_log.status for e in events if e.HasField('session_log')] == [
        tf1.SessionLog.START]
    written = [(e.step, v.simple_value) for e in events if e.HasField('summary')
               for v in e.summary.value if v.tag == 'train/value']
    assert written == [(0, 0.0), (3, 6.0), (6, 12.0)]
