"""Fixtures and hooks only; plain helpers are in cli_runs.py, tfrecord_fixtures.py and
session_cache.py.

The tiny real dataset (JPEGs -> TFRecords) and the shared tiny training runs are built once per
test session, however many xdist workers read them (session_cache.py), and are read only: a
test that changes one copies it first.

`slow` marks a test that starts, itself or through a fixture, a Python process that imports
TensorFlow (main.py, inference.py, bench.py, the dataset tools, ...: ~5 s of start-up here even
when the command stops at a user error, minutes when it trains, evaluates or exports) or
mpirun; and a test that trains in-process or builds a full-size network (D1-D7x, B1-B7, the
automl D0 checkpoint). Building tiny_dataset (two converter processes, once per session) does
not make its tests slow. `make test-fast` runs the rest (`-m "not slow"`) in about 2 minutes
on 2 cores.
"""
import collections
import concurrent.futures
import os
import signal
import threading

import pytest

import session_cache
from cli_runs import run_main, run_python, stops_end_the_commands, tiny_flags, two_rank_flags

pytest_plugins = ['deadlines']  # A deadline per test, every thread's stack when it passes.

# Fixtures that start slow processes: the training runs here, test_training.py's own
# train_and_eval run, test_runtime.py's mpirun probe, test_verify_tfrecords.py's CLI run. A
# test using one, directly or through another fixture (an export of a run), is marked slow; a
# test that starts such a process itself carries @pytest.mark.slow.
SLOW_FIXTURES = frozenset({'tiny_trained_run', 'profiled_run', 'train_and_eval_run',
                           'two_ranks', 'faulty_run', 'two_rank_run', 'tiny_export'})


def pytest_configure(config):  # pylint: disable=unused-argument
    """Grappler is off (below). The commands the tests start see SIGINT and SIGHUP as from a
    terminal: a suite started in the background of a script (`make test &`) or under nohup
    inherits them ignored, and a command keeps a signal ignored from its start ignored
    (core/processes.py, as nohup asks), so the tests that send them would wait in vain. Handled
    here, they are default in each child."""
    # Grappler off in every command the tests start (engine/setup.py, docs/training.md): about
    # 6 s less of each start-up, which is most of a tiny run. The tests of a run as users run it
    # (test_training.py's train_and_eval run, the time budget's in test_finetune_budget.py) set
    # it on; test_session_config.py checks both.
    os.environ.setdefault('EFFICIENTDET_GRAPPLER', 'off')
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    stops_end_the_commands()


def pytest_terminal_summary(terminalreporter, config):
    """With TEST_TIMES_FILE=PATH (tools/run_tests.sh sets it), every test's time (set-up, call
    and teardown summed, as the workers reported them) to PATH, slowest first: where the suite's
    time goes, beyond --durations' 30. Written by the controlling pytest only (an xdist worker
    holds its own tests' reports), as deadlines.py's summary."""
    path = os.environ.get('TEST_TIMES_FILE')
    if not path or hasattr(config, 'workerinput'):
        return
    seconds = collections.Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, 'duration', None) is not None and hasattr(report, 'nodeid'):
                seconds[report.nodeid] += report.duration
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as stream:
        stream.write('seconds\ttest\n')
        for nodeid, spent in seconds.most_common():
            stream.write('%.2f\t%s\n' % (spent, nodeid))


# A slow test (a real run: 30-400 s) against a quick one (about a second), for the order below.
SLOW_WEIGHT = 100


def pytest_collection_modifyitems(items):
    """Marks the tests using a slow fixture slow; then orders the files by their slow tests,
    most first (each file's own order kept): make test's workers take files in this order
    (--dist loadfile --no-loadscope-reorder), and a file of one long run taken last would
    leave the other worker idle for its length. xdist's own order, by the number of tests,
    puts exactly those files last."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, 'fixturenames', ())):
            item.add_marker(pytest.mark.slow)
    weight, first = collections.Counter(), {}
    for index, item in enumerate(items):
        weight[item.path] += SLOW_WEIGHT if item.get_closest_marker('slow') else 1
        first.setdefault(item.path, index)
    items.sort(key=lambda item: (-weight[item.path], first[item.path]))


@pytest.fixture(autouse=True)
def no_library_thread_outlives_its_test():
    """The library names its threads 'efficientdet:...' (the model_dir lock's refresher): each
    is stopped by its owner (Run.close(), a `with`), so none may still run after a test."""
    def library_threads():
        return {thread for thread in threading.enumerate()
                if thread.name.startswith('efficientdet:') and thread.is_alive()}
    before = library_threads()
    yield
    left = sorted(thread.name for thread in library_threads() - before)
    assert not left, 'library threads still running after the test: %s' % left


def _shared_read_only(tmp_path_factory, name, build):
    """Yields build's value (built once per session) and checks at the end of the session
    that no test wrote into the directory."""
    _, value = session_cache.build_once(tmp_path_factory, name, build)
    yield value
    session_cache.assert_unchanged(tmp_path_factory, name)


def _build_tiny_dataset(root):
    from efficientdet_hpu.datatools import synthetic_coco  # pylint: disable=import-outside-toplevel
    synthetic_coco.generate(str(root), num_train=16, num_val=8, seed=7)
    records = root / 'tfrecords'

    def convert(split, shards):
        return run_python([
            '-m', 'dataset.create_coco_tfrecord', '--image_dir=%s' % (root / split),
            '--object_annotations_file=%s' % (root / 'annotations' / ('instances_%s.json' % split)),
            '--output_file_prefix=%s' % (records / split), '--num_shards=%d' % shards,
            '--num_threads=2'], timeout=300)
    # The two splits at once: each process spends most of its ~5 s importing TensorFlow.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for result in pool.map(convert, ('train', 'val'), (2, 1)):
            assert result.returncode == 0, result.stdout
    return {
        'root': str(root),
        'train_pattern': str(records / 'train-*.tfrecord'),
        'val_pattern': str(records / 'val-*.tfrecord'),
        'val_json': str(root / 'annotations' / 'instances_val.json'),
        'train_label_map': str(records / 'train-label_map.json'),
    }


@pytest.fixture(scope='session')
def tiny_dataset(tmp_path_factory):
    """Synthetic COCO-format data converted to TFRecords: 16 train and 8 val images."""
    yield from _shared_read_only(tmp_path_factory, 'tiny_dataset', _build_tiny_dataset)


@pytest.fixture(scope='session')
def tiny_trained_run(tiny_dataset, tmp_path_factory):
    """model_dir of two training steps of the tiny model (`--mode=train --num_epochs=1`, no
    evaluation), checkpoints at steps 0 and 2. Shared by the export, prediction and evaluator
    tests: tests that evaluate into it or change it work on a shutil.copytree copy."""
    def build(model_dir):
        result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train', '--num_epochs=1'))
        assert result.returncode == 0, result.stdout[-5000:]
        return str(model_dir)
    yield from _shared_read_only(tmp_path_factory, 'tiny_trained_run', build)


@pytest.fixture(scope='session')
def profiled_run(tiny_dataset, tmp_path_factory):
    """model_dir of two steps of train_and_eval with the profiler on step 2 (the trace is
    under model_dir/profile); shared by the bench and profile_summary tests."""
    def build(model_dir):
        result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train_and_eval',
                                     '--num_epochs=1', '--profile_steps=2,2'))
        assert result.returncode == 0, result.stdout[-5000:]
        return str(model_dir)
    yield from _shared_read_only(tmp_path_factory, 'profiled_run', build)


@pytest.fixture(scope='session')
def two_rank_run(tiny_dataset, tmp_path_factory):
    """{'model_dir', 'output'}: an uninterrupted real `mpirun -np 2` training through the
    launcher (two_rank_flags), shared by test_distributed.py and the signal tests' comparison of
    a resumed run with a whole one."""
    def build(model_dir):
        result = run_python(['demo_efficientdet.py', '--use_horovod', '2']
                            + two_rank_flags(tiny_dataset, model_dir), timeout=900)
        assert result.returncode == 0, result.stdout[-6000:]
        return {'model_dir': str(model_dir), 'output': result.stdout}
    yield from _shared_read_only(tmp_path_factory, 'two_rank_run', build)


@pytest.fixture(scope='session')
def tiny_export(tiny_trained_run, tmp_path_factory):
    """{'export_dir', 'output'}: tiny_trained_run exported in every format (`inference.py
    export`: the SavedModel, TFLite fp32, fp16 and int8 calibrated on 4 training images, ONNX
    fp32, in one directory), and the command's output; shared by the serving tests."""
    def build(directory):
        export_dir = str(directory / 'saved_model')
        result = run_python(['inference.py', 'export', '--model_dir=%s' % tiny_trained_run,
                             '--export_dir=%s' % export_dir, '--calibration_count=4',
                             '--formats=saved_model,tflite_fp32,tflite_fp16,tflite_int8,'
                             'onnx_fp32'], timeout=900)
        assert result.returncode == 0, result.stdout[-5000:]
        return {'export_dir': export_dir, 'output': result.stdout}
    yield from _shared_read_only(tmp_path_factory, 'tiny_export', build)
