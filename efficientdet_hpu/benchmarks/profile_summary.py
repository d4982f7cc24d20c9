r"""Where a training step's time goes, from a TensorFlow profiler trace.

    python profile_summary.py --trace=MODEL_DIR [--steps=N] [--top=20] [--json=out.json]

--trace is a model_dir, its profile/ directory, or one *.xplane.pb; the newest trace under it
is read (`main.py --profile_steps=START,END` writes MODEL_DIR/profile/plugins/profile/<run>/
<host>.xplane.pb). Printed as markdown: time per step, op time by op type, op time by model
part (forward / backward per part, optimizer + EMA, input pipeline) and how many ops ran at
once. --json writes the same numbers.

What the trace holds (TF 2.15, graph mode): the host plane `/host:CPU` has one line per
thread. TF ops are events whose metadata name is "node/name:OpType" with display name
"OpType" (inter-op threads `tf_Compute/..`, tf.data threads `tf_data_..`). Each Session.run
is a `SessionRun` event on the Python thread; a training step is a SessionRun during which
gradient ops start. Threads that oneDNN / Eigen use inside one op are not traced: an op's time
is its wall time on the thread that ran it, however many cores it kept busy.
"""
import bisect
import collections
import glob
import json
import os

from absl import app, flags

from efficientdet_hpu.benchmarks import profile_parts
from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core.errors import UserError

FLAGS = flags.FLAGS
HOST_PLANE = '/host:CPU'
PS_PER_MS = 1e9


def define_flags():
    """Defined only when run as a program: the tests import this module."""
    flags.DEFINE_string('trace', None, 'model_dir, its profile/ directory, or a .xplane.pb.')
    flags.DEFINE_integer('steps', 0, 'Steps in the trace (default: count the training '
                         'steps marked in the trace).', lower_bound=0)
    flags.DEFINE_integer('top', 20, 'Op types listed before "all other".', lower_bound=1)
    flags.DEFINE_integer('cores', os.cpu_count(), 'Cores of the traced machine.',
                         lower_bound=1)
    flags.DEFINE_string('json', None, 'Also write the numbers to this JSON file.')


class ProfileError(UserError, ValueError):
    """No usable trace at the path given; the message says how to make one."""


HOW_TO_TRACE = ('make one with `python main.py --mode=train ... --profile_steps=START,END '
                '--model_dir=DIR` (the trace goes under DIR/profile)')

OpEvent = collections.namedtuple('OpEvent', 'name op_type thread start end')


def find_trace(path):
    """The newest non-empty *.xplane.pb at or under `path` (a file or a directory)."""
    if os.path.isfile(path):
        candidates = [path] if path.endswith('.xplane.pb') else []
    else:
        candidates = glob.glob(os.path.join(path, '**', '*.xplane.pb'), recursive=True)
    candidates = [c for c in candidates if os.path.getsize(c) > 0]
    if not candidates:
        raise ProfileError('no TensorFlow profiler trace (non-empty *.xplane.pb) at or under '
                           '--trace=%s; %s' % (path, HOW_TO_TRACE))
    return max(candidates, key=os.path.getmtime)


def load_host_plane(trace_path):
    """Parses an XSpace file; returns its host plane (tsl XPlane proto)."""
    # Imported here: TensorFlow takes seconds to import and --help should not wait for it.
    # pylint: disable=import-outside-toplevel
    from google.protobuf import message
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    with open(trace_path, 'rb') as f:
        try:
            space.ParseFromString(f.read())
        except message.DecodeError as error:
            raise ProfileError('%s is not a profiler trace (%s); %s'
                               % (trace_path, error, HOW_TO_TRACE))
    for plane in space.planes:
        if plane.name == HOST_PLANE:
            return plane
    raise ProfileError('%s has no %s plane (planes: %s); %s' % (
        trace_path, HOST_PLANE, [p.name for p in space.planes], HOW_TO_TRACE))


def read_events(plane):
    """(op events, SessionRun (start, end) pairs) of a host plane, times in picoseconds.

    An op event nested inside another op event of the same thread is dropped, so summed op
    times count each instant of a thread once."""
    ops, runs = [], []
    for line in plane.lines:
        base = line.timestamp_ns * 1000
        outer_end = None
        for event in sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps)):
            meta = plane.event_metadata[event.metadata_id]
            start = base + event.offset_ps
            end = start + event.duration_ps
            if meta.name == 'SessionRun':
                runs.append((start, end))
            elif meta.display_name and meta.name.endswith(':' + meta.display_name):
                if outer_end is not None and end <= outer_end:
                    continue
                ops.append(OpEvent(meta.name[:-len(meta.display_name) - 1],
                                   meta.display_name, line.name, start, end))
                outer_end = end
    return ops, sorted(runs)


def training_runs(ops, runs):
    """The SessionRun intervals in which a gradient op starts (all runs if none does)."""
    starts = sorted(op.start for op in ops
                    if profile_parts.classify(op.name, op.op_type, op.thread)[0] == 'backward')
    marked = [(s, e) for s, e in runs if bisect.bisect_left(starts, s) <
              bisect.bisect_right(starts, e)]
    return marked or runs


def clipped(ops, window):
    """Op events cut to the window (start, end); events outside it are dropped."""
    low, high = window
    return [op._replace(start=max(op.start, low), end=min(op.end, high))
            for op in ops if op.end > low and op.start < high]


def concurrency(ops, window):
    """{number of ops running at once: picoseconds} over the window."""
    edges = sorted([(op.start, 1) for op in ops] + [(op.end, -1) for op in ops])
    levels = collections.Counter()
    running, last = 0, window[0]
    for time, delta in edges:
        levels[running] += time - last
        running, last = running + delta, time
    levels[running] += window[1] - last
    return levels


def _window(ops, runs, steps):
    """(window, steps, how the steps were counted)."""
    marked = training_runs(ops, runs)
    if marked:
        window = (marked[0][0], marked[-1][1])
        return window, steps or len(marked), ('--steps' if steps else
                                              '%d SessionRun step markers' % len(marked))
    if not steps:
        raise ProfileError('the trace has no step markers (SessionRun events); pass --steps=N, '
                           'the number of steps the profiler window covered')
    return (min(op.start for op in ops), max(op.end for op in ops)), steps, '--steps'


def summarize(trace_path, steps=0, cores=None):
    """All numbers of one trace as a dict (milliseconds per step unless named otherwise)."""
    ops, runs = read_events(load_host_plane(trace_path))
    if not ops:
        raise ProfileError('%s holds no TensorFlow op events (was the window on training '
                           'steps?); %s' % (trace_path, HOW_TO_TRACE))
    window, steps, counted_by = _window(ops, runs, steps)
    ops = clipped(ops, window)
    if not ops or window[1] <= window[0]:
        raise ProfileError('%s: no op ran inside the traced steps; %s' % (trace_path,
                                                                          HOW_TO_TRACE))
    per_step = 1.0 / (steps * PS_PER_MS)
    wall_ps = window[1] - window[0]
    in_window = [(s, e) for s, e in runs if s >= window[0] and e <= window[1]]
    op_ps = sum(op.end - op.start for op in ops)
    levels = concurrency(ops, window)
    return {
        'trace': trace_path, 'steps': steps, 'steps_from': counted_by,
        'wall_ms_per_step': wall_ps * per_step,
        'session_run_ms_per_step': sum(e - s for s, e in in_window) * per_step,
        'op_ms_per_step': op_ps * per_step,
        'op_types': _by_op_type(ops, per_step, op_ps),
        'parts': _by_part(ops, per_step, op_ps),
        'parallelism': _parallelism(ops, levels, wall_ps, op_ps, cores or os.cpu_count()),
    }


def _by_op_type(ops, per_step, op_ps):
    totals, counts = collections.Counter(), collections.Counter()
    for op in ops:
        totals[op.op_type] += op.end - op.start
        counts[op.op_type] += 1
    return [{'op_type': name, 'ms_per_step': ps * per_step, 'calls': counts[name],
             'percent': 100.0 * ps / op_ps} for name, ps in totals.most_common()]


def _by_part(ops, per_step, op_ps):
    totals = collections.Counter()
    for op in ops:
        totals[profile_parts.classify(op.name, op.op_type, op.thread)] += op.end - op.start
    return [{'group': group, 'part': part, 'ms_per_step': totals[(group, part)] * per_step,
             'percent': 100.0 * totals[(group, part)] / op_ps}
            for group, part in profile_parts.ALL_PARTS]


def _parallelism(ops, levels, wall_ps, op_ps, cores):
    threads = {op.thread for op in ops}
    busy = {'%d' % n if n < 2 else '2+': 0.0 for n in range(3)}
    for running, ps in levels.items():
        busy['%d' % running if running < 2 else '2+'] += 100.0 * ps / wall_ps
    return {'ops_in_flight_mean': op_ps / wall_ps, 'cores': cores,
            'core_share_percent': 100.0 * op_ps / wall_ps / cores,
            'percent_of_wall_with_ops_running': busy, 'threads_with_ops': len(threads)}


def _step_section(summary):
    gap = summary['wall_ms_per_step'] - summary['session_run_ms_per_step']
    return ['## Time per training step', '',
            'Trace: `%s`; %d steps (from %s).' % (summary['trace'], summary['steps'],
                                                  summary['steps_from']), '',
            report.markdown_table(['per step', 'ms'], [
                ['wall time (window / steps)', '%.1f' % summary['wall_ms_per_step']],
                ['inside Session.run', '%.1f' % summary['session_run_ms_per_step']],
                ['between runs (Python, hooks)', '%.1f' % gap],
                ['sum of op times (all threads)', '%.1f' % summary['op_ms_per_step']]],
                text_columns=1)]


def _op_type_section(summary, top):
    rows = [[t['op_type'], '%.0f' % (t['calls'] / float(summary['steps'])),
             '%.1f' % t['ms_per_step'], '%.1f' % t['percent']] for t in summary['op_types'][:top]]
    rest = summary['op_types'][top:]
    if rest:
        rows.append(['all other (%d types)' % len(rest),
                     '%.0f' % (sum(t['calls'] for t in rest) / float(summary['steps'])),
                     '%.1f' % sum(t['ms_per_step'] for t in rest),
                     '%.1f' % sum(t['percent'] for t in rest)])
    return ['## Op time by op type (top %d)' % top, '',
            report.markdown_table(['op type', 'calls/step', 'ms/step', '% of op time'], rows,
                                 text_columns=1)]


def _part_section(summary):
    rows, groups = [], collections.OrderedDict()
    for part in summary['parts']:
        rows.append([part['group'], part['part'], '%.1f' % part['ms_per_step'],
                     '%.1f' % part['percent']])
        groups[part['group']] = groups.get(part['group'], 0.0) + part['ms_per_step']
    rows.append(['**total**', '', '%.1f' % summary['op_ms_per_step'], '100.0'])
    return ['## Op time by model part', '',
            report.markdown_table(['pass', 'part', 'ms/step', '%'], rows, text_columns=2),
            '', 'By pass: ' + ', '.join('%s %.1f ms' % item for item in groups.items()) + '.']


def _parallelism_section(summary):
    par = summary['parallelism']
    running = par['percent_of_wall_with_ops_running']
    return ['## Parallelism', '', report.markdown_table(['measure', 'value'], [
        ['threads that ran ops', par['threads_with_ops']],
        ['op time / wall time (mean ops in flight)', '%.2f' % par['ops_in_flight_mean']],
        ['... as a share of %d cores' % par['cores'], '%.0f%%' % par['core_share_percent']],
        ['wall time with no op running', '%.1f%%' % running['0']],
        ['wall time with 1 op running', '%.1f%%' % running['1']],
        ['wall time with 2+ ops running', '%.1f%%' % running['2+']]], text_columns=1), '',
        'Op times are wall times on the thread that ran the op; oneDNN / Eigen worker '
        'threads inside an op are not traced, so the core share is a lower bound for ops '
        'that parallelise internally and an upper bound when ops compete for cores.']


def render(summary, top=20):
    """The markdown report of a summarize() dict."""
    sections = [_step_section(summary), _op_type_section(summary, top), _part_section(summary),
                _parallelism_section(summary)]
    return '\n\n'.join('\n'.join(section) for section in sections) + '\n'


def write_json(summary, path):
    """Writes atomically: a reader never sees half a file."""
    atomic_file.write_text_atomically(path, json.dumps(summary, indent=1, sort_keys=True))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s (flags are --name=value)' % argv[1:])
    if not FLAGS.trace:
        raise app.UsageError('--trace=MODEL_DIR (or a profile directory or .xplane.pb) is '
                             'required; %s' % HOW_TO_TRACE)
    try:
        summary = summarize(find_trace(FLAGS.trace), FLAGS.steps, FLAGS.cores)
    except ProfileError as error:
        return errors.fail('profile_summary', error)
    print(render(summary, FLAGS.top))
    if FLAGS.json:
        write_json(summary, FLAGS.json)
    return 0


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    define_flags()
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
