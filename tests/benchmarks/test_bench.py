"""Benchmarks and run diagnostics on the tiny config: every bench.py mode runs a couple of real
steps and emits all its fields; the profiler window writes a trace; memory.csv and the curves
PNG are produced; host post-processing agrees with the in-graph one."""
import csv
import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.ops import anchors
from efficientdet_hpu.ops import host_postprocess
from efficientdet_hpu.ops import postprocess
from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving import model_spec
from cli_runs import TINY_HPARAMS, assert_one_line_error, run_python

tf1 = tf.compat.v1


def _bench(args, timeout=900):
    result = run_python(['bench.py'] + args, timeout=timeout)
    assert result.returncode == 0, result.stdout[-5000:]
    parsed = report.parse_result_lines(result.stdout)
    assert len(parsed) == 1, result.stdout[-3000:]
    return parsed[0], result.stdout


def test_profiler_window_writes_a_trace(profiled_run):
    traces = glob.glob(os.path.join(profiled_run, 'profile', '**', '*.xplane.pb'),
                       recursive=True)
    assert traces and all(os.path.getsize(path) > 0 for path in traces)


def test_memory_csv_has_a_row_per_log_step(profiled_run):
    with open(os.path.join(profiled_run, 'memory.csv')) as f:
        rows = list(csv.DictReader(f))
    assert rows and [int(r['step']) for r in rows] == sorted(int(r['step']) for r in rows)
    assert all(float(r['host_rss_mb']) > 0 and float(r['host_peak_rss_mb']) > 0 for r in rows)


def test_plot_curves_renders_a_png(profiled_run, tmp_path):
    output = str(tmp_path / 'curves.png')
    result = run_python(['-m', 'training.plot_curves', '--model_dir=%s' % profiled_run,
                         '--output=%s' % output])
    assert result.returncode == 0, result.stdout[-3000:]
    assert '1 eval records' in result.stdout
    with open(output, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert os.path.getsize(output) > 10000


@pytest.mark.slow  # training.plot_curves in a process of its own (TensorFlow).
def test_plot_curves_without_a_log_is_a_clear_error(tmp_path):
    result = run_python(['-m', 'training.plot_curves', '--model_dir=%s' % tmp_path,
                         '--output=%s' % (tmp_path / 'c.png')])
    assert_one_line_error(result, 'no train or eval records')


@pytest.mark.slow
def test_bench_train_reports_throughput_and_memory():
    result, output = _bench(['train', '--batch_sizes=2', '--steps=2', '--warmup=2',
                             '--hparams=%s' % TINY_HPARAMS])
    assert 'images/s/rank' in output and 'bwd %' in output
    (row,) = result['rows']
    for key in ('images_per_sec_per_rank', 'images_per_sec_global', 'step_time_ms',
                'peak_host_memory_mb'):
        assert row[key] > 0, key
    assert row['global_batch'] == 2 and row['ranks'] == 1 and row['steps'] == 2
    assert row['batch_per_rank'] == 2
    # Start-up: process start to the end of the first step, which it includes.
    assert 'start-up s' in output
    assert row['startup_sec'] > row['first_step_sec'] > 0
    assert row['startup_sec'] < row['wall_time_sec'] + 60
    assert '--use_fake_data' in row['command'] and '--benchmark' in row['command']
    # The profile of the last warm-up step: where a step goes.
    assert '--profile_steps=2,2' in row['command']
    assert row['forward_percent'] > 0 and row['backward_percent'] > 0
    assert row['update_percent'] > 0
    total = sum(row[k + '_percent'] for k in ('forward', 'backward', 'update', 'input'))
    assert total <= 100.0 + 1e-6


@pytest.mark.slow
def test_bench_train_and_eval_runs_both_modes_and_says_where_the_time_went():
    result, output = _bench(['train_and_eval', '--model_name=efficientdet-d0', '--image_size=128',
                             '--hparams=%s' % TINY_HPARAMS.replace('image_size=128,', ''),
                             '--batch_sizes=2', '--steps=2', '--evaluations=2',
                             '--eval_images=4'])
    assert 'CPU: %s' % report.cpu_description() in output.splitlines()
    assert result['cpu'] == report.cpu_description()
    both, alone = result['rows']
    assert (both['mode'], alone['mode']) == ('train_and_eval', 'train')
    assert both['evaluations'] == result['evaluations'] == 2 and alone['evaluations'] == 0
    assert both['step'] == alone['step'] == result['steps'] == 4
    for row in (both, alone):
        assert row['process_wall_sec'] >= row['wall_sec'] > 0
        parts = sum(row[key + '_sec'] for key in ('startup', 'steps', 'evaluations',
                                                  'checkpoints', 'other'))
        assert parts == pytest.approx(row['wall_sec'], rel=1e-9)
        assert '--use_fake_data' in row['command'] and '--num_epochs=2' in row['command']
    assert result['wall_ratio'] == pytest.approx(
        both['process_wall_sec'] / alone['process_wall_sec'])
    assert 'train_and_eval / train: wall %.2fx' % result['wall_ratio'] in output
    assert 'evaluations s' in output


def test_cpu_description_names_the_model_and_the_vector_extensions(tmp_path):
    cpuinfo = tmp_path / 'cpuinfo'
    cpuinfo.write_text('processor\t: 0\nmodel name\t: AMD EPYC 7B13\n'
                       'flags\t\t: fpu sse avx avx2 fma\n\nprocessor\t: 1\n')
    cores = os.cpu_count()
    assert report.cpu_description(str(cpuinfo)) == (
        'AMD EPYC 7B13, %d logical cores, AVX2, no AVX-512' % cores)
    cpuinfo.write_text('model name\t: Intel Xeon\nflags\t: avx2 avx512f avx512_vnni amx_bf16\n')
    assert report.cpu_description(str(cpuinfo)) == (
        'Intel Xeon, %d logical cores, AVX2, AVX-512 (VNNI), AMX' % cores)
    assert report.cpu_description(str(tmp_path / 'none')) == (
        'unknown CPU, %d logical cores, no AVX2, no AVX-512' % cores)


INFER_FIELDS = ('images_per_sec', 'latency_avg_ms', 'latency_p50_ms', 'latency_p90_ms',
                'latency_p95_ms', 'latency_p99_ms', 'peak_host_memory_mb')


@pytest.mark.slow
def test_bench_infer_every_postprocess_mode():
    result, output = _bench(['infer', '--random_weights', '--batch_sizes=1,2',
                             '--postprocess=graph,host,none', '--steps=2', '--warmup=1',
                             '--hparams=%s' % TINY_HPARAMS])
    assert 'p99 ms' in output
    assert [(r['batch_size'], r['postprocess']) for r in result['rows']] == [
        (b, m) for b in (1, 2) for m in ('graph', 'host', 'none')]
    for row in result['rows']:
        assert all(row[key] > 0 for key in INFER_FIELDS) and row['steps'] == 2


@pytest.mark.slow
def test_bench_infer_image_sources(tiny_dataset):
    image_dir = os.path.join(tiny_dataset['root'], 'val')
    image = sorted(glob.glob(os.path.join(image_dir, '*.jpg')))[0]
    for source in ('image:' + image, 'repeat:' + image, 'dir:' + image_dir):
        result, _ = _bench(['infer', '--random_weights', '--batch_sizes=2', '--steps=1',
                            '--warmup=0', '--source=' + source, '--hparams=%s' % TINY_HPARAMS])
        assert result['rows'][0]['images_per_sec'] > 0, source


@pytest.mark.slow  # bench.py up to its user error: TensorFlow's start-up.
def test_bench_infer_user_errors():
    result = run_python(['bench.py', 'infer', '--batch_sizes=1', '--postprocess=gpu'])
    assert_one_line_error(result, 'graph, host, none')
    result = run_python(['bench.py', 'infer', '--batch_sizes=1'])
    assert_one_line_error(result, '--random_weights')


@pytest.mark.slow
def test_bench_input_measures_the_pipeline(tiny_dataset):
    result, _ = _bench(['input', '--file_pattern=%s' % tiny_dataset['train_pattern'],
                        '--batch_size=2', '--num_batches=3', '--hparams=%s' % TINY_HPARAMS])
    assert result['bench'] == 'input' and result['batch_size'] == 2
    numbers = [v for v in result.values() if isinstance(v, float)]
    assert numbers and all(np.isfinite(numbers))


def test_predictor_raw_outputs_have_anchor_order_shapes():
    config = hparams_config.get_efficientdet_config('efficientdet-d0')
    config.override(TINY_HPARAMS + ',num_classes=3')
    predictor = detector.GraphPredictor(model_spec.ModelSpec(config, None, None))
    try:
        outputs = predictor.predict(np.zeros([2, 100, 140, 3], np.uint8),
                                    detector.OUTPUT_KEYS + detector.RAW_KEYS)
    finally:
        predictor.close()
    num_anchors = (16 * 16 + 8 * 8 + 4 * 4) * 9
    assert outputs['class_logits'].shape == (2, num_anchors, 3)
    assert outputs['box_codes'].shape == (2, num_anchors, 4)
    np.testing.assert_allclose(outputs['image_scales'], [140 / 128.0] * 2, rtol=1e-6)
    assert outputs['image_sizes'].tolist() == [[100, 140]] * 2
    assert outputs['detection_boxes'].shape == (2, 100, 4)


def test_host_postprocess_matches_the_graph_postprocess():
    num_classes, levels = 3, {3: 16, 4: 8, 5: 4}
    anchor_boxes = anchors.generate_anchor_boxes(128, 128, 3, 5, 3, [1.0, 2.0, 0.5], 4.0)
    rng = np.random.default_rng(0)
    # Well-separated scores, so both sides agree on one order (random weights give ties).
    logits = rng.normal(-3.0, 2.0, [2, len(anchor_boxes), num_classes]).astype(np.float32)
    codes = rng.normal(0.0, 0.3, [2, len(anchor_boxes), 4]).astype(np.float32)
    class_outputs, box_outputs, start = {}, {}, 0
    for level, side in levels.items():
        count = side * side * 9
        class_outputs[level] = logits[:, start:start + count].reshape(2, side, side, -1)
        box_outputs[level] = codes[:, start:start + count].reshape(2, side, side, -1)
        start += count
    scales, sizes = np.array([1.5, 2.0], np.float32), np.array([[150, 192], [256, 200]])
    nms_args = dict(iou_thresh=0.5, score_thresh=0.05, max_nms_inputs=1000, max_output_size=50)
    rows, counts = postprocess.generate_detections(
        class_outputs, box_outputs, anchor_boxes, np.zeros([2]), scales, sizes,
        num_classes=num_classes, **nms_args)
    host = host_postprocess.generate_detections(logits, codes, anchor_boxes, scales, sizes,
                                                **nms_args)
    for index, (boxes, scores, labels) in enumerate(host):
        count = int(counts[index])
        # Of the 50 kept, those the clip to the photo (150 px high) leaves without area dropped.
        assert 40 < count == len(scores) <= 50
        expected = rows.numpy()[index, :count]
        np.testing.assert_allclose(scores, expected[:, 5], rtol=1e-5)
        np.testing.assert_allclose(boxes, expected[:, 1:5], atol=1e-3)
        assert labels.tolist() == expected[:, 6].astype(int).tolist()


def test_result_lines_survive_mpirun_output_tags():
    output = ('[1,0]<stdout>:BENCHMARK {"rank": 0, "x": [1]}[1,0]<stdout>:\nnoise\n'
              '[1,1]<stdout>:BENCHMARK {"rank": 1}\n')
    assert report.parse_result_lines(output) == [{'rank': 0, 'x': [1]}, {'rank': 1}]
