"""Inference throughput and latency of the exported detection graph, per batch size.

One frozen graph and session per batch size (detector.build_frozen_graph: in-graph
preprocessing, network, decode + NMS; the graph the SavedModel export holds). Each
post-processing mode fetches a different part of that graph:

  graph  the detections (in-graph decode + NMS), as the SavedModel serves them
  host   the raw network outputs, then decode + NMS in NumPy (host_postprocess.py)
  none   the raw network outputs only

so the difference between `none` and the other two is the cost of post-processing. Only
session.run (plus the NumPy post-processing for `host`) is timed; feeds are prepared before.

Sources of the images fed:
  random          random uint8 pixels at the model's image size (no resize work)
  image:PATH      one image decoded on the host, the same pixels B times
  repeat:PATH     one image's encoded bytes B times, decoded in the graph
  dir:PATH        the encoded image files of a directory, cycled, decoded in the graph

With formats (bench.py infer --formats=saved_model,tflite_fp32,...), each format is timed end
to end on the same feeds, preprocessing + network + NMS (benchmark_format):
  saved_model     the SavedModel's frozen graph (detector.GraphPredictor: what the export
                  holds, run in a session), in-graph preprocessing and NMS
  tflite_*        serving/tflite_runner.py: preprocessing as a tf.function, the converted
                  network then the post-processing file (NMS) in tf.lite.Interpreter with
                  XNNPACK on every core, boxes scaled on the host; a batch runs image by image
                  (the models are batch 1).
                  int8 is calibrated on a few images of the source (timing, not accuracy).
  onnx_fp32       serving/onnx_runner.py: the same, the network converted by tf2onnx and run
                  in onnxruntime (CPUExecutionProvider, every core); the post-processing is
                  still the TFLite file (ONNX has no soft-NMS).
"""
import os
import time

import numpy as np

from efficientdet_hpu.benchmarks.report import BenchError
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.ops import anchors
from efficientdet_hpu.ops import host_postprocess
from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving import onnx_export
from efficientdet_hpu.serving import onnx_runner
from efficientdet_hpu.serving import predict
from efficientdet_hpu.serving import tflite_export
from efficientdet_hpu.serving import tflite_runner
from efficientdet_hpu.engine import train_log


POSTPROCESS_MODES = ('graph', 'host', 'none')
PERCENTILES = (50, 90, 95, 99)


def parse_source(text):
    """'random' | 'image:PATH' | 'repeat:PATH' | 'dir:PATH' -> (kind, path)."""
    kind, _, path = text.partition(':')
    if kind == 'random' and not path:
        return kind, None
    if kind not in ('image', 'repeat', 'dir') or not path:
        raise BenchError("--source=%s must be random, image:PATH, repeat:PATH or dir:PATH"
                         % text)
    if not os.path.exists(path):
        raise BenchError('--source=%s: %s does not exist' % (text, path))
    return kind, path


def _read_bytes(path):
    with open(path, 'rb') as f:
        return f.read()


def make_batches(source, batch_size, config, count=8, seed=0):
    """A few feed values of the source (cycled while timing). Pixel sources give uint8
    [B, H, W, 3], encoded sources give object arrays of bytes [B]."""
    kind, path = source
    if kind == 'random':
        height, width = hparams_config.parse_image_size(config.image_size)
        rng = np.random.default_rng(seed)
        return [rng.integers(0, 256, [batch_size, height, width, 3], dtype=np.uint8)
                for _ in range(min(count, 2))]
    if kind == 'image':
        return [np.repeat(predict.read_rgb(path)[None], batch_size, axis=0)]
    if kind == 'repeat':
        return [np.array([_read_bytes(path)] * batch_size, dtype=object)]
    files = predict.list_images(path)
    data = [_read_bytes(f) for f in files[:max(batch_size * count, batch_size)]]
    batches = []
    for start in range(0, len(data), batch_size):
        batch = [data[(start + i) % len(data)] for i in range(batch_size)]
        batches.append(np.array(batch, dtype=object))
    return batches


def _host_nms_args(config):
    """host_postprocess.generate_detections' settings: the config's, network size included."""
    return dict(hparams_config.nms_settings(config),
                network_size=hparams_config.parse_image_size(config.image_size))


def _runner(predictor, mode, config):
    """A function feed -> result doing one timed unit of work for `mode`."""
    if mode == 'graph':
        return lambda feed: predictor.predict(feed, detector.OUTPUT_KEYS)
    if mode == 'none':
        return lambda feed: predictor.predict(feed, ('class_logits', 'box_codes'))
    height, width = hparams_config.parse_image_size(config.image_size)
    anchor_boxes = anchors.generate_anchor_boxes(height, width,
                                                 **hparams_config.anchor_settings(config))
    nms_args = _host_nms_args(config)

    def run_host(feed):
        raw = predictor.predict(feed, detector.RAW_KEYS)
        return host_postprocess.generate_detections(
            raw['class_logits'], raw['box_codes'], anchor_boxes, raw['image_scales'],
            raw['image_sizes'], **nms_args)
    return run_host


def latency_summary(seconds, batch_size):
    """Throughput and latency statistics of per-batch wall times (seconds)."""
    ms = np.asarray(seconds, np.float64) * 1e3
    summary = {'batch_size': batch_size, 'steps': int(ms.size),
               'images_per_sec': batch_size * 1e3 / float(ms.mean()),
               'latency_avg_ms': float(ms.mean())}
    for q in PERCENTILES:
        summary['latency_p%d_ms' % q] = float(np.percentile(ms, q))
    return summary


def time_runs(run, batches, steps, warmup):
    for index in range(warmup):
        run(batches[index % len(batches)])
    durations = []
    for index in range(steps):
        feed = batches[index % len(batches)]
        start = time.perf_counter()
        run(feed)
        durations.append(time.perf_counter() - start)
    return durations


def benchmark_batch_size(spec, batch_size, source, modes, steps, warmup, session_config=None):
    """One row per post-processing mode for one batch size."""
    batches = make_batches(source, batch_size, spec.config)
    encoded = batches[0].dtype == object
    start = time.perf_counter()
    predictor = detector.GraphPredictor(spec, batch_size, session_config, encoded)
    build_seconds = time.perf_counter() - start
    rows = []
    try:
        for mode in modes:
            run = _runner(predictor, mode, spec.config)
            row = latency_summary(time_runs(run, batches, steps, warmup), batch_size)
            row.update(postprocess=mode, warmup=warmup, graph_build_sec=build_seconds,
                       peak_host_memory_mb=train_log.host_memory_mb()[1])
            rows.append(row)
    finally:
        predictor.close()
    return rows


def _calibration_images(batches, config, count=8):
    """float32 [1, h, w, 3] inputs of up to `count` images of the feeds (int8 calibration)."""
    preprocessor = tflite_runner.Preprocessor(config.image_size, config.mean_rgb,
                                              config.stddev_rgb)
    images = [image for batch in batches for image in batch][:count]
    return [preprocessor.decode(image)[0] if isinstance(image, bytes) else
            preprocessor(image)[0] for image in images]


def format_predictor(spec, fmt, batches):
    """A predictor of `fmt` ('saved_model', a TFLite or the ONNX format) for `spec`, converted
    here."""
    if fmt == tflite_export.SAVED_MODEL:
        return detector.GraphPredictor(spec, None, None, batches[0].dtype == object)
    representative = None
    if fmt == 'tflite_int8':
        images = _calibration_images(batches, spec.config)
        representative = lambda: iter(images)
    predictor_class = (onnx_runner.ONNXPredictor if fmt in onnx_export.ONNX_FILES
                       else tflite_runner.TFLitePredictor)
    return predictor_class(
        metadata=tflite_export.export_metadata(spec),
        model_content=tflite_export.convert(spec, fmt, representative),
        postprocess_content=tflite_export.convert_postprocess(spec))


def benchmark_format(spec, fmt, batch_sizes, source, steps, warmup):
    """One row per batch size for one format, end to end (preprocessing, network, NMS)."""
    start = time.perf_counter()
    predictor = format_predictor(spec, fmt, make_batches(source, batch_sizes[0], spec.config))
    build_seconds = time.perf_counter() - start
    rows = []
    try:
        for batch_size in batch_sizes:
            batches = make_batches(source, batch_size, spec.config)
            row = latency_summary(time_runs(predictor.predict, batches, steps, warmup),
                                  batch_size)
            row.update(format=fmt, postprocess='graph', warmup=warmup,
                       graph_build_sec=build_seconds,
                       peak_host_memory_mb=train_log.host_memory_mb()[1])
            rows.append(row)
    finally:
        predictor.close()
    return rows
