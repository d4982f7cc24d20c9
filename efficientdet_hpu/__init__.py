"""EfficientDet D0-D7x training, evaluation and serving (TF1 Estimator style, Horovod, Gaudi).

The packages stand in a line; a module imports only from its own package or from packages
before it (tests/project/test_layout.py checks it, and that no modules import in a cycle):

  core        the error policy, atomic files, TensorFlow's process settings, root-name shims,
              every command's --help
  ops         pure functions and layers over tensors: boxes, anchors, losses, NMS, conv/BN
  config      the D0-D7x table and defaults, recipes, run options, automl's and Habana's keys
  runtime     devices, Horovod ranks and collectives, Habana settings, rank-tagged logging
  data        the record format and its checks, label maps, COCO annotations, input pipeline
  analysis    why the AP is what it is: TIDE error types, confusions, sizes, worst images
  evaluation  COCO scoring: the evaluation metric, whole photos, the analysis around a score
  backbone    EfficientNet
  network     BiFPN topology, EfficientDet
  checkpoints finding checkpoints, EMA restore, damaged checkpoints, warm starts
  training    the Estimator model_fn and its step: accumulation, loss scaling, frozen variables,
              an end moved while it trains (--steps_file)
  engine      the training engine: set-up, loops, hooks, evaluation of checkpoints, model_dir
              lock, training log, stop signals, bad records, the throughput benchmark mode
  serving     frozen detection graph, SavedModel/TFLite/ONNX export, prediction
  datatools   the converter, the record verifier, the data doctor, the synthetic data set
  benchmarks  training, inference and input benchmarks, profiles
  finetune    one-command fine-tuning: input detection and split, the plan, the stages run
  review      the labels reviewed: K-fold out-of-sample predictions, cleanlab's scores, the
              ranked issues, their page and the labelling tools' files
  launch      the launcher's library: hosts, MPI environment, placement, HCL config
  cli         the entry points (main, demo_efficientdet, inference, bench, model_inspect,
              plot_curves, analyze, finetune, review)

Installed (`pip install .`), this package is the only top-level name; the checkout's root also
keeps the names users of google/automl's and Habana's ports type (main.py, hparams_config.py,
dataset/, ...) as thin modules over it (core/compat.py).

From Python (docs/python-api.md): `from efficientdet_hpu import Detector` (serving/python_api.py)
and `efficientdet_hpu.train(...)` (cli/training_run.py). They stand at the end of the line, as
the package's face, and load on first use (PEP 562), so `import efficientdet_hpu` stays cheap:
no TensorFlow, and test_layout.py still reads LAYERS from this file alone.
"""
import importlib

LAYERS = ('core', 'ops', 'config', 'runtime', 'data', 'analysis', 'evaluation', 'backbone',
          'network', 'checkpoints', 'training', 'engine', 'serving', 'datatools', 'benchmarks',
          'finetune', 'review', 'launch', 'cli')

# name -> module defining it; imported when the name is first looked up.
EXPORTS = {'Detector': 'efficientdet_hpu.serving.python_api',
           'Detections': 'efficientdet_hpu.serving.results',
           'train': 'efficientdet_hpu.cli.training_run',
           'TrainingRun': 'efficientdet_hpu.cli.training_run',
           'UserError': 'efficientdet_hpu.core.errors',
           'InferenceError': 'efficientdet_hpu.core.errors'}
__all__ = ['LAYERS'] + sorted(EXPORTS)


def __getattr__(name):
    if name not in EXPORTS:
        raise AttributeError('module %r has no attribute %r' % (__name__, name))
    value = getattr(importlib.import_module(EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(EXPORTS))
