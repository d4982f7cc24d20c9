r"""Throughput of the input pipeline alone (dataloader.InputReader), in images per second.

    python bench.py input --file_pattern='/data/train-*.tfrecord' --image_size=512 \
        --batch_size=4 --num_batches=50 --model_name=efficientdet-d0 [--hparams=...] \
        [--is_training=true] [--use_fake_data]

Batches are pulled as fast as the pipeline makes
them (nothing consumes them), after a few warm-up batches that fill the prefetch buffers
and let tf.data's autotuner settle. An eval pipeline is repeated so short datasets can be
timed. `measure()` is what `bench.py input` and the benchmark suite call.
"""
import time

import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import settings
from efficientdet_hpu.data import dataloader

WARMUP_BATCHES = 5


def measure(file_pattern, config, batch_size, num_batches, is_training, *,
            use_fake_data=False, warmup=WARMUP_BATCHES):
    """Times `num_batches` batches of the pipeline after `warmup` batches.

    Args:
        file_pattern: TFRecords glob (ignored with use_fake_data).
        config: hparams_config.Config (or dict) of the model, e.g. efficientdet-d0.
        batch_size, num_batches: batch size and number of timed batches.
        is_training: time the training pipeline (augmentation) or the eval pipeline.

    Returns:
        dict(images_per_sec=float, batches=int, seconds=float, cpu_ms_per_image=float):
        cpu_ms_per_image is the process's CPU time (all threads) per image while timing,
        which stays meaningful on a busy machine: an idle one with C cores can deliver
        about C * 1000 / cpu_ms_per_image images/s.
    """
    config = hparams_config.Config(config.as_dict() if hasattr(config, 'as_dict') else config)
    params = settings.finalize(config, settings.RunFacts(per_rank_batch=batch_size))
    reader = dataloader.InputReader(file_pattern, is_training=is_training,
                                    use_fake_data=use_fake_data)
    dataset = reader(params)
    if not is_training:
        dataset = dataset.repeat()  # One pass may hold fewer than warmup + num_batches.
    timer = _time_eager if tf.executing_eagerly() else _time_graph
    seconds, cpu_seconds, images = timer(dataset, num_batches, warmup)
    return {'images_per_sec': images / seconds, 'batches': num_batches, 'seconds': seconds,
            'cpu_ms_per_image': 1000.0 * cpu_seconds / images}


def _batch_size(batch):
    return int(batch[0].shape[0])


def _time_eager(dataset, num_batches, warmup):
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    images, start, cpu_start = 0, time.perf_counter(), time.process_time()
    for _ in range(num_batches):
        images += _batch_size(next(iterator))
    return time.perf_counter() - start, time.process_time() - cpu_start, images


def _time_graph(dataset, num_batches, warmup):
    next_batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    with tf.compat.v1.Session() as session:
        for _ in range(warmup):
            session.run(next_batch)
        images, start, cpu_start = 0, time.perf_counter(), time.process_time()
        for _ in range(num_batches):
            images += _batch_size(session.run(next_batch))
        return time.perf_counter() - start, time.process_time() - cpu_start, images
