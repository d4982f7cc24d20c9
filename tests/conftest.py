"""Shared fixtures: a tiny real dataset (JPEGs -> TFRecords) and a way to run main.py.

Built once per test session: generating and converting takes a few seconds, and every
training, evaluation, export and launcher test reads the same files.
"""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A model small enough to build and step in seconds on 2 cores, same code paths as D0.
TINY_HPARAMS = ('image_size=128,min_level=3,max_level=5,fpn_num_filters=16,'
                'fpn_cell_repeats=1,box_class_repeats=1,jitter_min=0.9,jitter_max=1.1')


def run_python(args, timeout=600, env=None, cwd=REPO):
    """Runs `python args...` with the test interpreter; returns CompletedProcess (text)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED='1', TF_CPP_MIN_LOG_LEVEL='2')
    full_env.update(env or {})
    return subprocess.run([sys.executable] + list(args), cwd=cwd, env=full_env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_main(flags, timeout=600, env=None):
    return run_python(['main.py'] + list(flags), timeout=timeout, env=env)


@pytest.fixture(scope='session')
def tiny_dataset(tmp_path_factory):
    """Synthetic COCO-format data converted to TFRecords: 16 train and 8 val images."""
    from dataset import synthetic_coco
    root = tmp_path_factory.mktemp('tiny_dataset')
    synthetic_coco.generate(str(root), num_train=16, num_val=8, seed=7)
    records = root / 'tfrecords'
    for split, shards in (('train', 2), ('val', 1)):
        result = run_python([
            '-m', 'dataset.create_coco_tfrecord', '--image_dir=%s' % (root / split),
            '--object_annotations_file=%s' % (root / 'annotations' / ('instances_%s.json' % split)),
            '--output_file_prefix=%s' % (records / split), '--num_shards=%d' % shards,
            '--num_threads=2'], timeout=300)
        assert result.returncode == 0, result.stdout
    return {
        'root': str(root),
        'train_pattern': str(records / 'train-*.tfrecord'),
        'val_pattern': str(records / 'val-*.tfrecord'),
        'val_json': str(root / 'annotations' / 'instances_val.json'),
        'train_label_map': str(records / 'train-label_map.json'),
    }


def tiny_flags(dataset, model_dir, *extra, hparams=TINY_HPARAMS):
    """main.py flags of a 2-step-per-epoch tiny run on `dataset`."""
    return ['--model_dir=%s' % model_dir, '--hparams=%s' % hparams,
            '--training_file_pattern=%s' % dataset['train_pattern'],
            '--validation_file_pattern=%s' % dataset['val_pattern'],
            '--val_json_file=%s' % dataset['val_json'],
            '--train_batch_size=2', '--eval_batch_size=2', '--num_examples_per_epoch=4',
            '--log_every_n_steps=1', '--cp_every_n_steps=100'] + list(extra)


@pytest.fixture(scope='session')
def tiny_trained_run(tiny_dataset, tmp_path_factory):
    """model_dir of two training steps of the tiny model (read only: the TFLite and ONNX
    export tests export it into directories of their own)."""
    model_dir = str(tmp_path_factory.mktemp('tiny_trained_run'))
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train', '--num_epochs=1'))
    assert result.returncode == 0, result.stdout[-5000:]
    return model_dir


def val_images(pattern, count=4):
    """uint8 [H, W, 3] pixels of the first `count` images of the TFRecords matching pattern."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    images = []
    for path in sorted(tf.io.gfile.glob(pattern)):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
            encoded = tf.train.Example.FromString(raw).features.feature['image/encoded']
            images.append(tf.io.decode_jpeg(encoded.bytes_list.value[0], channels=3).numpy())
    return images[:count]


def write_jpegs(images, directory):
    """Writes uint8 [H, W, 3] images as directory/000001.jpg, 000002.jpg, ...; returns it."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    directory.mkdir()
    for index, image in enumerate(images):
        (directory / ('%06d.jpg' % (index + 1))).write_bytes(tf.io.encode_jpeg(image).numpy())
    return directory


@pytest.fixture(scope='session')
def profiled_run(tiny_dataset, tmp_path_factory):
    """model_dir of two steps of train_and_eval with the profiler on step 2 (the trace is
    under model_dir/profile); shared by the bench and profile_summary tests."""
    model_dir = str(tmp_path_factory.mktemp('profiled_run'))
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train_and_eval',
                                 '--num_epochs=1', '--profile_steps=2,2'))
    assert result.returncode == 0, result.stdout[-5000:]
    return model_dir
