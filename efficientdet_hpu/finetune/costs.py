"""What a fine-tune costs on a machine: training images per second per model and input size,
the start-up of a training process, an evaluation, the data stage, the whole-photo evaluation
and the export; host memory per image. Plain numbers read from a table that
`python bench.py finetune-costs` measures (benchmarks/finetune_costs.py), each with the machine
and date it was measured on.

The table the plan reads: $EFFICIENTDET_FINETUNE_COSTS when set, else the one the command
writes by default (~/.cache/efficientdet_hpu/finetune-costs.json) when it was measured on this
CPU, else the table shipped with the package (finetune/cost_table.py, measured on this
project's 2-core CPU VM). Sizes between the measured ones are interpolated in log-log (rate
against pixels); variants not measured are scaled from their family's nearest measured entry by
multiply-adds (docs/models.md) and pixels; other core counts linearly (an assumption, said with
the estimate, and corrected before training by the stages' measured speed and then by the first
training steps' measured rate: finetune/budget.py).
"""
import dataclasses
import json
import math
import os
from typing import Tuple

from efficientdet_hpu.config.model_variants import MODEL_VARIANTS
from efficientdet_hpu.finetune import cost_table

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
USER_TABLE = os.path.join('~', '.cache', 'efficientdet_hpu', 'finetune-costs.json')
ENVIRONMENT = 'EFFICIENTDET_FINETUNE_COSTS'


@dataclasses.dataclass(frozen=True)
class Memory:
    """One family's host memory of a training process = base_gb + per_image_gb x batch at
    its measured variant and size."""
    model: str
    base_gb: float
    per_image_gb: float


# Lite0: main.py --benchmark's peak, 2.33 GB at batch 8 at 320 px, over an assumed 1.0 GB
# base, rounded up: 0.2 GB an image. D0: docs/training.md (3.0 GB at batch 2, 8.1 at 8).
LITE0_MEMORY = Memory('efficientdet-lite0', 1.0, 0.2)
D0_MEMORY = Memory('efficientdet-d0', 1.3, 0.85)


def family(model_name) -> str:
    return 'lite' if 'lite' in model_name else 'd'


def training_memory_gb(model_name, image_size, batch) -> float:
    """Peak host memory (GB) of a training process with micro-batches of `batch` images."""
    measured = LITE0_MEMORY if family(model_name) == 'lite' else D0_MEMORY
    per_image = (measured.per_image_gb * FLOPS[model_name] / FLOPS[measured.model]
                 * (float(image_size) / NATIVE_SIZE[model_name]) ** 2)
    return measured.base_gb + per_image * batch


@dataclasses.dataclass(frozen=True)
class Rate:
    """A measured training run: `model` at `image_size`, batch 8, images/s and the seconds
    from the process's start to its first step done."""
    model: str
    image_size: int
    images_per_second: float
    startup_seconds: float


def _interpolate(points, pixels):
    """log-log interpolation of [(pixels, rate)] (sorted) at `pixels`; outside the measured
    range the nearest pair's slope (one point: rate inversely proportional to pixels)."""
    if len(points) == 1:
        return points[0][1] * points[0][0] / float(pixels)
    pairs = list(zip(points, points[1:]))
    (p0, r0), (p1, r1) = next(((a, b) for a, b in pairs if pixels <= b[0]), pairs[-1])
    if pixels < p0:
        (p0, r0), (p1, r1) = pairs[0]
    slope = math.log(r1 / r0) / math.log(p1 / float(p0))
    return r0 * math.exp(slope * math.log(pixels / float(p0)))


@dataclasses.dataclass(frozen=True)
class Table:
    """A cost table (the JSON benchmarks/finetune_costs.py writes), as the plan reads it."""
    machine: str
    cores: int
    date: str
    rates: Tuple[Rate, ...]
    evaluation_fixed_seconds: float  # An evaluation in the training session, besides images.
    inference_speedup: float  # Evaluation images/s over training images/s, same model/size.
    convert_seconds: float  # A converter process's start-up (one per split).
    convert_images_per_second: float
    doctor_seconds: float
    predict_seconds: float  # inference.py predict on the whole photos: besides the images.
    analysis_seconds: float
    export_seconds: float  # SavedModel and TFLite fp32.
    source: str = ''

    @classmethod
    def from_json(cls, record, source='') -> 'Table':
        stages = record['stages']
        return cls(record['machine'], int(record['cores']), record['date'],
                   tuple(Rate(r['model'], int(r['image_size']), float(r['images_per_second']),
                              float(r['startup_seconds'])) for r in record['training']),
                   float(stages['evaluation_fixed_seconds']),
                   float(stages['inference_speedup']), float(stages.get('convert_seconds', 0)),
                   float(stages['convert_images_per_second']), float(stages['doctor_seconds']),
                   float(stages['predict_seconds']), float(stages['analysis_seconds']),
                   float(stages['export_seconds']), source)

    def line(self) -> str:
        """'measured on AMD EPYC 9B14, 2 logical cores, ... on 2026-11-27 (cost_table.py)'."""
        return 'measured on %s on %s (%s)' % (self.machine, self.date, self.source)

    def _measured(self, model_name, image_size):
        """(the rate at this model and size from the table's entries, how)."""
        own = sorted(((r.image_size ** 2, r) for r in self.rates if r.model == model_name),
                     key=lambda item: item[0])
        if len(own) == 1 and own[0][1].image_size != image_size:
            return self._along_curve(own[0][1], image_size)
        if own:
            rate = _interpolate([(p, r.images_per_second) for p, r in own], image_size ** 2)
            exact = any(r.image_size == image_size for _, r in own)
            inside = own[0][1].image_size <= image_size <= own[-1][1].image_size
            return rate, '' if exact else (
                'interpolated between measured sizes' if inside else
                'extrapolated from the measured sizes %d-%d px' % (own[0][1].image_size,
                                                                  own[-1][1].image_size))
        kin = [r for r in self.rates if family(r.model) == family(model_name)] or list(self.rates)
        base = min(kin, key=lambda r: (abs(math.log(FLOPS[r.model] / FLOPS[model_name])),
                                       abs(r.image_size - image_size)))
        points = sorted((r.image_size ** 2, r.images_per_second) for r in self.rates
                        if r.model == base.model)
        # Multiply-adds at the same pixels: the ratio of the two variants' at their own sizes,
        # each scaled to its own size's pixels.
        flops_ratio = (FLOPS[model_name] / NATIVE_SIZE[model_name] ** 2) / (
            FLOPS[base.model] / NATIVE_SIZE[base.model] ** 2)
        return (_interpolate(points, image_size ** 2) / flops_ratio,
                'scaled from %s by multiply-adds' % base.model)

    def _along_curve(self, measured, image_size):
        """(rate, how) of `measured`'s model at another size: its rate times the ratio of the
        rates at the two sizes of the model measured at the most sizes. Pixels alone overstate
        small sizes, where a step's fixed costs weigh more: D0 measured at 512 px, 3.7 images/s,
        is 60 at 128 px by pixels; Lite0's sizes give 35, and make demo's D0 trains at about 33
        there."""
        by_model = {}
        for rate in self.rates:
            by_model.setdefault(rate.model, []).append(rate)
        curve = max(by_model.values(), key=len)
        if len(curve) < 2:
            return (_interpolate([(measured.image_size ** 2, measured.images_per_second)],
                                 image_size ** 2),
                    'scaled by pixels from %d px' % measured.image_size)
        points = sorted((r.image_size ** 2, r.images_per_second) for r in curve)
        ratio = (_interpolate(points, image_size ** 2)
                 / _interpolate(points, measured.image_size ** 2))
        return measured.images_per_second * ratio, (
            'scaled from %d px as %s\'s measured rates change with the size' % (
                measured.image_size, curve[0].model))

    def images_per_second(self, model_name, image_size, cores) -> tuple:
        """(training images/s at batch 8, how it was found)."""
        rate, how = self._measured(model_name, image_size)
        notes = [how] if how else []
        if cores != self.cores:
            rate *= max(1, cores) / float(self.cores)
            notes.append('x %d/%d cores (assumed linear)' % (cores, self.cores))
        return rate, ('; '.join(notes) + '; ' if notes else '') + self.line()

    def startup_seconds(self, model_name, image_size) -> float:
        """A training process's start to its first step: the nearest measured entry's."""
        return min(self.rates, key=lambda r: (r.model != model_name, abs(r.image_size -
                                                                           image_size))
                   ).startup_seconds

    def evaluation_seconds(self, rate, images) -> float:
        """One evaluation of `images` during training at training rate `rate`."""
        return self.evaluation_fixed_seconds + images / (rate * self.inference_speedup)

    def data_seconds(self, images) -> float:
        """The converter on `images` (photos or tiles; a process per split) and the data
        doctor."""
        return (2 * self.convert_seconds + images / self.convert_images_per_second
                + self.doctor_seconds)

    def final_seconds(self, rate, images) -> float:
        """The whole-photo evaluation of `images` (tiles when tiled), as they are and with
        their flips fused (two runs, three passes of the network), the analysis, the export."""
        return (2 * self.predict_seconds + 3 * images / (rate * self.inference_speedup)
                + self.analysis_seconds + self.export_seconds)


def _read(path):
    with open(path) as stream:
        return json.load(stream)


def load(cpu='', path=None) -> Table:
    """The table the plan reads (the module docstring's order); `cpu`: this machine's
    benchmarks.report.cpu_description(), to tell whether the user's table is this machine's."""
    path = path or os.environ.get(ENVIRONMENT)
    if path:
        return Table.from_json(_read(path), path)
    user = os.path.expanduser(USER_TABLE)
    if os.path.exists(user):
        try:
            record = _read(user)
            if not cpu or record.get('machine') == cpu:
                return Table.from_json(record, user)
        except (OSError, ValueError, KeyError):
            pass  # A damaged user table: the shipped one.
    return Table.from_json(cost_table.TABLE, 'the table shipped with efficientdet_hpu, '
                                             'finetune/cost_table.py')


def for_machine(table, cpu) -> str:
    """'' when the table was measured on this CPU, else the line saying it was not."""
    if not cpu or table.machine == cpu:
        return ''
    return ('the cost table is for %s, not this %s: its figures are a first guess that the '
            'first training steps correct; `python bench.py finetune_costs` measures this one'
            % (table.machine, cpu))
