"""profile_summary: op names of our graph land in the right model part; a hand-built trace
gives hand-computed step, op and concurrency times; the real trace of the tiny profiled run
is summarised consistently; a missing or broken trace is a clear error (exit 2)."""
import json
import os

import pytest

from efficientdet_hpu.benchmarks import profile_parts
from efficientdet_hpu.benchmarks import profile_summary
from cli_runs import assert_one_line_error, run_python

MS = 10 ** 9  # picoseconds


@pytest.mark.parametrize('name, op_type, thread, expected', [
    ('efficientnet-b0/blocks_3/depthwise_conv2d/depthwise', '_MklNativeDepthwiseConv2dNative',
     'tf_Compute/1', ('forward', 'backbone')),
    ('fpn_cells/cell_0/fnode2/op_after_combine5/conv/separable_conv2d', 'Conv2D', '',
     ('forward', 'BiFPN')),
    ('resample_p6/MaxPool2d', 'MaxPool', '', ('forward', 'BiFPN')),
    ('class_net/class-0-bn-3/FusedBatchNormV3', 'FusedBatchNormV3', '', ('forward', 'class head')),
    ('box_net/box-predict_2/separable_conv2d', 'Conv2D', '', ('forward', 'box head')),
    ('logistic_loss_1/Log1p', 'Log1p', '', ('forward', 'loss')),
    ('Pow', 'Pow', '', ('forward', 'loss')),
    ('ArithmeticOptimizer/AddOpsRewrite_add_28', 'AddN', '', ('forward', 'loss')),
    ('gradients/efficientnet-b0/blocks_1/IdentityN_grad/mul', 'Mul', '', ('backward', 'backbone')),
    ('ConstantFolding/gradients/fpn_cells/cell_0/fnode0/mul_1_grad/Mul', 'Mul', '',
     ('backward', 'BiFPN')),
    ('gradients/class_net/class-predict/separable_conv2d_grad/Conv2DBackpropInput',
     'Conv2DBackpropInput', '', ('backward', 'class head')),
    ('gradients/box_net/IdentityN_1_grad/Sigmoid', 'Sigmoid', '', ('backward', 'box head')),
    ('gradients/logistic_loss/Log1p_grad/mul', 'Mul', '', ('backward', 'loss')),
    ('gradients/AddN_17', 'AddN', '', ('backward', 'unattributed')),
    ('cond/then/_6390/Momentum/update_box_net/box-0/bias/ResourceApplyMomentum',
     'ResourceApplyMomentum', '', ('update', 'optimizer + EMA')),
    ('cond/then/_6390/ExponentialMovingAverage/AssignMovingAvg/sub', 'Sub', '',
     ('update', 'optimizer + EMA')),
    ('clip_by_global_norm/mul_1', 'Mul', '', ('update', 'optimizer + EMA')),
    ('IteratorGetNext', 'IteratorGetNext', 'tf_Compute/1', ('input', 'input pipeline')),
    ('ParseSingleExample/ParseExample/ParseExampleV2', 'ParseExampleV2',
     'tf_data_private_threadpool/7', ('input', 'input pipeline')),
    ('global_step/Read/ReadVariableOp', 'ReadVariableOp', '', ('other', 'other')),
])
def test_op_names_of_our_graph_map_to_parts(name, op_type, thread, expected):
    assert profile_parts.classify(name, op_type, thread) == expected
    assert expected in profile_parts.ALL_PARTS


def _write_trace(path, with_step_markers=True):
    """A host plane by hand (times in ms from 0): Python thread with SessionRun [5, 15] (a
    training step) and [15.5, 15.6] (no gradient op: not a step); thread A: Conv2D [5, 9],
    Conv2DBackpropFilter [12, 14], ResourceApplyMomentum [14, 17]; thread B: AddV2 [7, 11]
    with a Mul [8, 9] nested inside it; a tf.data thread: ParseExampleV2 [0, 3]."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name=profile_summary.HOST_PLANE)

    def add(line, name, op_type, start_ms, end_ms):
        meta_id = len(plane.event_metadata) + 1
        plane.event_metadata[meta_id].id = meta_id
        plane.event_metadata[meta_id].name = name + (':' + op_type if op_type else '')
        plane.event_metadata[meta_id].display_name = op_type
        line.events.add(metadata_id=meta_id, offset_ps=int(start_ms * MS),
                        duration_ps=int((end_ms - start_ms) * MS))

    python = plane.lines.add(name='main.py', timestamp_ns=0)
    if with_step_markers:
        add(python, 'SessionRun', '', 5, 15)
        add(python, 'SessionRun', '', 15.5, 15.6)
    thread_a = plane.lines.add(name='tf_Compute/1', timestamp_ns=0)
    add(thread_a, 'efficientnet-b0/stem/conv2d/Conv2D', 'Conv2D', 5, 9)
    add(thread_a, 'gradients/efficientnet-b0/stem/conv2d/Conv2D_grad/Conv2DBackpropFilter',
        'Conv2DBackpropFilter', 12, 14)
    add(thread_a, 'cond/then/_1/Momentum/update_w/ResourceApplyMomentum',
        'ResourceApplyMomentum', 14, 17)
    thread_b = plane.lines.add(name='tf_Compute/2', timestamp_ns=0)
    add(thread_b, 'ExecutorState::Process', '', 5, 13)
    add(thread_b, 'fpn_cells/cell_0/fnode0/add', 'AddV2', 7, 11)
    add(thread_b, 'fpn_cells/cell_0/fnode0/mul', 'Mul', 8, 9)
    data = plane.lines.add(name='tf_data_private_threadpool/3', timestamp_ns=0)
    add(data, 'ParseSingleExample/ParseExampleV2', 'ParseExampleV2', 0, 3)
    with open(path, 'wb') as f:
        f.write(space.SerializeToString())


def test_hand_built_trace_gives_hand_computed_times(tmp_path):
    path = str(tmp_path / 'host.xplane.pb')
    _write_trace(path)
    summary = profile_summary.summarize(path, cores=2)
    # Window = the one training SessionRun [5, 15]; Momentum is cut at 15, tf.data op dropped.
    assert summary['steps'] == 1 and 'SessionRun' in summary['steps_from']
    assert summary['wall_ms_per_step'] == pytest.approx(10.0, rel=1e-9)
    assert summary['session_run_ms_per_step'] == pytest.approx(10.0, rel=1e-9)
    assert summary['op_ms_per_step'] == pytest.approx(4 + 4 + 2 + 1, rel=1e-9)
    op_types = {t['op_type']: t['ms_per_step'] for t in summary['op_types']}
    assert op_types == pytest.approx({'Conv2D': 4.0, 'AddV2': 4.0, 'Conv2DBackpropFilter': 2.0,
                                      'ResourceApplyMomentum': 1.0}, rel=1e-9)
    parts = {(p['group'], p['part']): p['ms_per_step'] for p in summary['parts']
             if p['ms_per_step']}
    assert parts == pytest.approx({('forward', 'backbone'): 4.0, ('forward', 'BiFPN'): 4.0,
                                   ('backward', 'backbone'): 2.0,
                                   ('update', 'optimizer + EMA'): 1.0}, rel=1e-9)
    # [5,7] 1 op, [7,9] 2, [9,11] 1, [11,12] 0, [12,15] 1  ->  0: 1 ms, 1: 7 ms, 2: 2 ms.
    parallelism = summary['parallelism']
    assert parallelism['percent_of_wall_with_ops_running'] == pytest.approx(
        {'0': 10.0, '1': 70.0, '2+': 20.0}, rel=1e-9)
    assert parallelism['ops_in_flight_mean'] == pytest.approx(1.1, rel=1e-9)
    assert parallelism['core_share_percent'] == pytest.approx(55.0, rel=1e-9)
    assert parallelism['threads_with_ops'] == 2


def test_without_step_markers_steps_come_from_the_flag(tmp_path):
    path = str(tmp_path / 'host.xplane.pb')
    _write_trace(path, with_step_markers=False)
    with pytest.raises(profile_summary.ProfileError, match='--steps'):
        profile_summary.summarize(path)
    summary = profile_summary.summarize(path, steps=2)
    # Window = all op events, [0, 17], over 2 steps; nothing is cut.
    assert summary['wall_ms_per_step'] == pytest.approx(8.5, rel=1e-9)
    assert summary['op_ms_per_step'] == pytest.approx((4 + 2 + 3 + 4 + 3) / 2.0, rel=1e-9)


def test_summary_of_the_profiled_tiny_run(profiled_run, tmp_path):
    output = str(tmp_path / 'profile.json')
    result = run_python(['-m', 'benchmarks.profile_summary', '--trace=%s' % profiled_run, '--top=5',
                         '--json=%s' % output])
    assert result.returncode == 0, result.stdout[-5000:]
    for heading in ('## Time per training step', '## Op time by op type (top 5)',
                    '## Op time by model part', '## Parallelism'):
        assert heading in result.stdout
    with open(output) as f:
        summary = json.load(f)
    assert os.listdir(str(tmp_path)) == ['profile.json']  # no temp file left behind
    assert summary['steps'] == 1 and 'SessionRun' in summary['steps_from']
    assert 0 < summary['session_run_ms_per_step'] <= summary['wall_ms_per_step']
    op_types = [t['op_type'] for t in summary['op_types']]
    assert any('Conv2D' in t for t in op_types), op_types
    assert sum(t['ms_per_step'] for t in summary['op_types']) == pytest.approx(
        summary['op_ms_per_step'], rel=1e-6)
    parts = {(p['group'], p['part']): p['ms_per_step'] for p in summary['parts']}
    assert sum(parts.values()) == pytest.approx(summary['op_ms_per_step'], rel=1e-6)
    assert sum(p['percent'] for p in summary['parts']) == pytest.approx(100.0, rel=1e-6)
    assert parts[('forward', 'backbone')] > 0 and parts[('backward', 'backbone')] > 0
    assert parts[('forward', 'loss')] > 0 and parts[('update', 'optimizer + EMA')] > 0
    assert sum(v for (group, _), v in parts.items() if group == 'backward') > 0
    assert summary['parallelism']['ops_in_flight_mean'] > 0


@pytest.mark.slow  # benchmarks.profile_summary in processes of their own (TensorFlow).
def test_missing_or_broken_trace_is_a_clear_error(tmp_path):
    result = run_python(['-m', 'benchmarks.profile_summary', '--trace=%s' % tmp_path])
    assert_one_line_error(result, str(tmp_path), '--profile_steps=START,END')
    broken = tmp_path / 'x.xplane.pb'
    broken.write_bytes(b'\x00not a trace')
    result = run_python(['-m', 'benchmarks.profile_summary', '--trace=%s' % broken])
    assert_one_line_error(result, str(broken))
