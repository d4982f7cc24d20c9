"""What a fine-tune costs on this kind of machine: training images per second, host memory per
image, and the fixed stages' time; plain numbers with where each comes from.

Measured (the source says where) for EfficientDet-Lite0 at 320 px and D0 at 512 px on this
project's 2-core CPU VM; the other variants are scaled from their family's measured one by
their multiply-adds (docs/models.md), other image sizes by their pixels, other core counts
linearly (an assumption, said with the estimate). A rate the user measured
(--images_per_second) replaces them.
"""
import dataclasses

from efficientdet_hpu.config.model_variants import MODEL_VARIANTS

# Multiply-adds (billions) at each variant's own image size: docs/models.md, the paper.
FLOPS = {
    'efficientdet-lite0': 0.99, 'efficientdet-lite1': 2.01, 'efficientdet-lite2': 3.43,
    'efficientdet-lite3': 7.59, 'efficientdet-lite3x': 14.15, 'efficientdet-lite4': 20.39,
    'efficientdet-d0': 2.54, 'efficientdet-d1': 6.1, 'efficientdet-d2': 11.0,
    'efficientdet-d3': 24.9, 'efficientdet-d4': 55.2, 'efficientdet-d5': 130.0,
    'efficientdet-d6': 226.0, 'efficientdet-d7': 325.0, 'efficientdet-d7x': 410.0,
}
# Each variant's own image size, from the D0-D7x table.
NATIVE_SIZE = {name: variant['image_size'] for name, variant in MODEL_VARIANTS.items()}
MEASURED_CORES = 2


@dataclasses.dataclass(frozen=True)
class Measured:
    """One family's measured variant: training images/s (float32, MEASURED_CORES cores),
    host memory of the training process = base_gb + per_image_gb x batch, and the sources."""
    model: str
    images_per_second: float
    base_gb: float
    per_image_gb: float
    source: str


# Lite0: make trees (docs/trees.md) with the evaluations in the training session (2026-11-26):
# 2000 steps of 8 tiles in 1606 s of training steps, 9.96 images/s (a few minutes of it beside
# other measurements), taken as 10; the plan's own deepforest run on the quiet machine trained
# at 11.4. Memory: main.py --benchmark's peak, 2.33 GB at batch 8 (fake data, one class), over
# an assumed 1.0 GB base (D0's measured one is 1.3 GB), rounded up: 0.2 GB an image.
LITE0 = Measured('efficientdet-lite0', 10.0, 1.0, 0.2,
                 'make trees: Lite0 at 320 px, 2000 steps of 8 in 1606 s of training steps on '
                 'a 2-core CPU, docs/trees.md')
# D0: docs/benchmarks-vm.md (1.13 images/s at batch 2) and docs/training.md (peak host
# memory 3.0 GB at batch 2, 8.1 GB at batch 8: 0.85 GB an image over 1.3 GB).
D0 = Measured('efficientdet-d0', 1.13, 1.3, 0.85,
              'make bench: D0 at 512 px, 1.13 images/s on a 2-core CPU, '
              'docs/benchmarks-vm.md')

# Graph, session, first step (the run's wall-time line): Lite0 30-35 s quiet, 52 s on a busy
# machine; D0 at 512 px 35-42 s (docs/dev/performance-notes.md).
STARTUP_SECONDS = 45
# Per evaluation during training besides its images (in the training session: no rebuild):
# COCO, the analysis, best/: make trees' 20 of 20 tiles took 33 s in all, 1.7 s each.
EVAL_SECONDS = 5
INFERENCE_SPEEDUP = 3.0  # Predicting an image costs about a third of training on it.
CONVERT_IMAGES_PER_SECOND = 4.0  # The converter on 2 cores (make trees-data: 3.7 tiles/s).
DOCTOR_SECONDS = 40  # python -m dataset.doctor: TensorFlow's import and the anchor search.
EXPORT_SECONDS = 150  # inference.py export: SavedModel (~60 s) and TFLite (~90 s).
PHOTO_EVAL_SECONDS = 60  # inference.py predict's graph and the error analysis.


def family(model_name) -> Measured:
    return LITE0 if 'lite' in model_name else D0


def images_per_second(model_name, image_size, cores, stated=None) -> tuple:
    """(training images/s, where the figure comes from) for a model at image_size (a side in
    pixels) on `cores` CPU cores; `stated`: the user's measured rate, used as it is."""
    if stated:
        return float(stated), 'stated with --images_per_second'
    measured = family(model_name)
    scale = (FLOPS[measured.model] / FLOPS[model_name]
             * (NATIVE_SIZE[model_name] / float(image_size)) ** 2)
    rate = measured.images_per_second * scale * max(1, cores) / MEASURED_CORES
    how = measured.source
    if model_name != measured.model or image_size != NATIVE_SIZE[model_name]:
        how += '; scaled by multiply-adds and pixels to %s at %d px' % (model_name, image_size)
    if cores != MEASURED_CORES:
        how += '; x %d/%d cores (assumed linear)' % (cores, MEASURED_CORES)
    return rate, how


def training_memory_gb(model_name, image_size, batch) -> float:
    """Peak host memory (GB) of a training process with micro-batches of `batch` images."""
    measured = family(model_name)
    per_image = (measured.per_image_gb * FLOPS[model_name] / FLOPS[measured.model]
                 * (float(image_size) / NATIVE_SIZE[model_name]) ** 2)
    return measured.base_gb + per_image * batch
