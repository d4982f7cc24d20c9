"""From run options and a resolved config to a ready run: workers and device, input and
model_dir checks, step arithmetic, the run files in model_dir, the Estimator."""
import atexit
import dataclasses
import json
import os
import shutil
import tempfile

import tensorflow as tf
from absl import logging

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import legacy_flags
from efficientdet_hpu.config import recipe
from efficientdet_hpu.config import settings as settings_lib
from efficientdet_hpu.config.options import RunOptions
from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.data import label_map as label_map_lib
from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.checkpoints import checkpoint_integrity
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.checkpoints import weight_files
from efficientdet_hpu.engine import bad_records
from efficientdet_hpu.training import det_model_fn
from efficientdet_hpu.engine import resume_check
from efficientdet_hpu.engine import model_dir_lock

tf1 = tf.compat.v1


class RunSetupError(UserError, ValueError):
    """A user mistake in options, data or model_dir; the message names it and the fix."""


@dataclasses.dataclass
class Run:
    """A prepared run: what it was asked (options), its finalised configuration (settings,
    config/settings.py: the only source of the batch, schedule and precision), the Estimator."""
    options: RunOptions
    settings: settings_lib.Settings
    estimator: object
    label_map: object
    train_skip: object = None  # engine.bad_records.SkipList with --skip_bad_records.
    eval_skip: object = None
    lock: object = None  # engine.model_dir_lock.ModelDirLock of a training job's rank 0.

    @property
    def config(self):
        """The frozen hparams Config (settings.config)."""
        return self.settings.config

    def close(self):
        """Ends what the run holds (the model_dir lock and its refresher); idempotent."""
        if self.lock is not None:
            self.lock.release()


def _check_pattern(flag_name, pattern):
    if not pattern:
        raise RunSetupError('--%s is required for this mode' % flag_name)
    if not dataloader.list_record_files(pattern):
        raise RunSetupError(
            'no files match --%s=%s; convert your COCO-format data first with '
            '`python -m dataset.create_coco_tfrecord --image_dir=... '
            '--object_annotations_file=... --output_file_prefix=...`' % (flag_name, pattern))


def _check_inputs(options):
    if options.mode in ('train', 'train_and_eval') and not options.use_fake_data:
        _check_pattern('training_file_pattern', options.training_file_pattern)
    if options.mode in ('eval', 'train_and_eval') or options.eval_after_training:
        _check_pattern('validation_file_pattern', options.validation_file_pattern)
    if options.val_json_file and not os.path.isfile(options.val_json_file):
        raise RunSetupError('--val_json_file=%s does not exist' % options.val_json_file)


def _check_warm_start(options):
    """--ckpt (else --backbone_ckpt) sniffed now (checkpoints/weight_files.py): a file of
    another kind or model is one line before a graph is built. Not on a model_dir that holds a
    checkpoint: the run resumes from its own and never reads them (warm_start.apply)."""
    flag = 'ckpt' if options.ckpt else 'backbone_ckpt' if options.backbone_ckpt else None
    path = getattr(options, flag) if flag else ''
    if not flag or '://' in path or checkpoints.has_checkpoint(options.model_dir):
        return
    weight_files.check(flag, path, exact=True)


def _find_label_map(options):
    for pattern in (options.training_file_pattern, options.validation_file_pattern):
        path = label_map_lib.label_map_path_for(pattern) if pattern else None
        if path:
            return label_map_lib.load_label_map(path), path
    return None, None


def _adopt_num_classes(config, explicit_keys, label_map, path):
    """The label map beside the shards decides num_classes unless the user set it."""
    if label_map is None:
        return
    if 'num_classes' not in explicit_keys:
        if config.num_classes != label_map.num_classes:
            logging.info('num_classes=%d from %s', label_map.num_classes, path)
        config.num_classes = label_map.num_classes
    elif config.num_classes < label_map.num_classes:
        raise RunSetupError(
            'num_classes=%d but the label map %s has %d classes; drop the num_classes '
            'override or set it to %d' % (config.num_classes, path, label_map.num_classes,
                                          label_map.num_classes))


def _examples_per_epoch(options):
    if options.num_examples_per_epoch:
        return options.num_examples_per_epoch
    if options.use_fake_data or not options.training_file_pattern:
        return 1000
    counted = _count_from_summary(options.training_file_pattern)
    if counted is None:
        counted = sum(1 for f in dataloader.list_record_files(options.training_file_pattern)
                      for _ in tf1.io.tf_record_iterator(f))
    return counted


def _count_from_summary(pattern):
    """Images written, from the converter's `<prefix>-summary.json` beside the shards."""
    label_map_path = label_map_lib.label_map_path_for(pattern)
    if not label_map_path:
        return None
    summary_path = label_map_path[:-len('-label_map.json')] + '-summary.json'
    try:
        with open(summary_path) as f:
            return int(json.load(f)['images_written'])
    except (OSError, ValueError, KeyError):
        return None


def _read_model_dir_config(model_dir):
    """model_dir/config.yaml, read once per run: (Config or None, True when it is google/automl's
    own, which the run then leaves as it is)."""
    path = os.path.join(model_dir, 'config.yaml')
    if not os.path.isfile(path):
        return None, False
    return recipe.read_saved_config_and_origin(path)  # Ours, or automl's config.yaml.


def _check_model_dir(model_dir, saved, config):
    """A model_dir holding another model's checkpoint is an error, not a silent mix."""
    # listed_checkpoints also sees a newest checkpoint whose index is gone.
    if saved is None or not checkpoint_integrity.listed_checkpoints(model_dir):
        return
    fields = ('name', 'backbone_name', 'num_classes', 'fpn_num_filters', 'fpn_cell_repeats',
              'box_class_repeats', 'min_level', 'max_level', 'num_scales', 'aspect_ratios')
    differing = [f for f in fields if saved.get(f) != config.get(f)]
    if differing:
        raise RunSetupError(
            '--model_dir=%s holds a checkpoint of another model (%s); use a new --model_dir, '
            'or fine-tune from it with --ckpt=%s' % (model_dir, ', '.join(
                '%s %r != %r' % (f, saved.get(f), config.get(f)) for f in differing),
                model_dir))


def _adopt_automl_config(model_dir, saved, config, explicit_keys):
    """In an automl model_dir (or evaluating any), its config.yaml decides every hparam the user
    did not set, so evaluating its checkpoint reproduces its model and post-processing."""
    values = hparams_config.flatten_keys(saved.as_dict())
    keep = set(explicit_keys) | {'mixed_precision'}  # --use_amp decides that one.
    config.override({key: value for key, value in values.items() if key not in keep})
    logging.info('hparams from %s (except those set: %s)',
                 os.path.join(model_dir, 'config.yaml'), ', '.join(sorted(explicit_keys)) or 'none')


def _write_run_files(options, settings, label_map, automl_dir, missing_only=False):
    """config.yaml, flags.json and the label map, read back by export, predict and eval; with
    missing_only (an evaluator) never over the training's (int8 export reads its flags)."""
    os.makedirs(options.model_dir, exist_ok=True)
    files = {'flags.json': lambda path: atomic_file.write_json_atomically(path,
                                                                          options.as_dict())}
    if not automl_dir:  # automl's own config.yaml is left as it is.
        files['config.yaml'] = lambda path: atomic_file.write_text_atomically(
            path, settings.config.to_yaml())
    if label_map is not None:
        files[label_map_lib.MODEL_DIR_FILE] = lambda path: atomic_file.write_json_atomically(
            path, label_map.to_json_dict(), indent=2)
    for name, write in files.items():
        if not (missing_only and os.path.exists(os.path.join(options.model_dir, name))):
            write(os.path.join(options.model_dir, name))


def _prepare_model_dir(options, settings, label_map, automl_dir):
    """Rank 0, before anything is built: a training job holds the model_dir's lock (an
    evaluator beside it takes none) and sets a damaged newest checkpoint aside
    (checkpoints/checkpoint_integrity.py; none intact: CheckpointError), the run files and the
    schedule are written. Returns the lock (None for an evaluator)."""
    if options.mode == 'eval':  # Before a training's first checkpoint, the files are its.
        if checkpoint_integrity.listed_checkpoints(options.model_dir):
            _write_run_files(options, settings, label_map, automl_dir, missing_only=True)
        return None
    lock = _hold_model_dir(options.model_dir)
    with model_dir_lock.released_on_error(lock):
        recovered = checkpoint_integrity.recover(options.model_dir)
        if recovered:
            logging.warning(recovered)
        _write_run_files(options, settings, label_map, automl_dir)
        _note_schedule(options.model_dir, settings_lib.schedule_record(settings))
    return lock


def _hold_model_dir(model_dir):
    """model_dir/.lock for this job (engine/model_dir_lock.py): Run.close() removes it when the
    run ends, atexit when the process ends first."""
    lock = model_dir_lock.ModelDirLock(model_dir)
    lock.acquire()
    atexit.register(lock.release)
    return lock


def _note_schedule(model_dir, schedule):
    """Says what a resume changes from the checkpoint's run; records this run's schedule."""
    latest = checkpoints.latest_checkpoint(model_dir)
    line = latest and resume_check.change_line(resume_check.read_schedule(model_dir),
                                               schedule, latest)
    if line:
        logging.warning(line)
    resume_check.write_schedule(model_dir, schedule)


# EFFICIENTDET_GRAPPLER=off: no Grappler pass in the training and evaluation sessions. Grappler
# optimises each new fetch of a session (the training step, each checkpoint's save, each
# evaluation) before its first run: seconds of every start-up, which a short run (a smoke test,
# CI) does not win back. docs/training.md says what it costs and saves.
GRAPPLER_ENV = 'EFFICIENTDET_GRAPPLER'


def grappler_off():
    """True when GRAPPLER_ENV is 'off'; 'on' or unset is Grappler as TensorFlow runs it."""
    value = os.environ.get(GRAPPLER_ENV, 'on').strip().lower()
    if value not in ('on', 'off'):
        raise UserError('%s=%s: set it to on or off (off: no Grappler pass, a shorter start-up '
                        'for short runs)' % (GRAPPLER_ENV, os.environ[GRAPPLER_ENV]))
    return value == 'off'


def session_config(device, use_xla=False):
    """The session of each rank: its share of this box's cores; on a GPU box, as Horovod's
    guide sets it up, only the rank's own GPU (visible_device_list = local rank, so N ranks do
    not all land on GPU 0) with memory grown on demand."""
    session_config = tf1.ConfigProto(allow_soft_placement=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
    session_config.intra_op_parallelism_threads = max(1, cores // distributed.local_size())
    session_config.inter_op_parallelism_threads = 2
    if device == 'GPU':
        session_config.gpu_options.visible_device_list = str(distributed.local_rank())
        session_config.gpu_options.allow_growth = True
    if device != 'HPU':  # Not tried with Habana's graph passes.
        # Grappler's MLIR (TFG) passes leave D0's training graph as it was (the same nodes,
        # inputs and values) and took ~3 of the first step's ~17 CPU seconds.
        session_config.graph_options.rewrite_options.disable_tfg_optimizer = True
    if device == 'CPU':
        # Grappler's layout and memory optimizers change nothing in a CPU graph (0 nodes on
        # D0's training graph) and took ~2 of the first step's ~9 grappler seconds; every
        # new fetch (a checkpoint, an evaluation) runs them again.
        rewrite = session_config.graph_options.rewrite_options
        rewrite.layout_optimizer = rewrite.OFF
        rewrite.memory_optimization = rewrite.NO_MEM_OPT
    if grappler_off():
        session_config.graph_options.rewrite_options.disable_meta_optimizer = True
    if use_xla:
        session_config.graph_options.optimizer_options.global_jit_level = (
            tf1.OptimizerOptions.ON_1)
    return session_config


def rank_log_dir(options):
    """Where this rank writes its logs and summaries: model_dir on rank 0; with Habana's
    --dump_all_ranks model_dir/worker_<rank> on the others; else None (they write nothing)."""
    if distributed.is_main():
        return options.model_dir
    if options.dump_all_ranks:
        return os.path.join(options.model_dir, 'worker_%d' % distributed.rank())
    return None


def _build_estimator(options, settings, device):
    """The Estimator's params are the frozen Settings, which model_fn and input_fn read."""
    main = distributed.is_main()
    log_dir = rank_log_dir(options)
    # Other ranks never checkpoint: their Estimator directory is their log dir or a temp one.
    if log_dir is None:
        model_dir = tempfile.mkdtemp(prefix='rank%d-' % distributed.rank())
        atexit.register(shutil.rmtree, model_dir, ignore_errors=True)
    else:
        model_dir = log_dir
    os.makedirs(model_dir, exist_ok=True)
    run_config = tf1.estimator.RunConfig(
        model_dir=model_dir, tf_random_seed=settings.runtime.seed,
        save_checkpoints_steps=options.cp_every_n_steps if main else None,
        save_checkpoints_secs=None, keep_checkpoint_max=options.keep_checkpoint_max,
        checkpoint_save_graph_def=options.save_graph_def,
        save_summary_steps=None,  # engine/hooks.SummaryHook writes them.
        log_step_count_steps=None, session_config=session_config(device, options.use_xla))
    return tf1.estimator.Estimator(det_model_fn.model_fn, config=run_config, params=settings)


def run_summary(settings, device):
    """The run's first line: the batch per rank (and the micro-batches accumulated) and
    globally, the scaled learning rate and the schedule, so a command carried over from another
    port shows at once what it means here."""
    config, batch, schedule = settings.config, settings.batch, settings.schedule
    batch_norm = ''
    if batch.ranks > 1:
        batch_norm = '; batch norm %s' % ('synchronised across ranks'
                                          if settings.runtime.cross_rank_batch_norm
                                          else 'per rank')
    accumulated = ''
    if batch.accumulation_steps > 1:
        accumulated = ' x %d accumulated micro-batches' % batch.accumulation_steps
    return ('%s on %s x%d: batch %d per rank%s, global %d; learning rate %.4g (%.4g per %d '
            'images); %d steps (%.6g per epoch)%s; compute %s' % (
                config.name, device, batch.ranks, batch.per_rank, accumulated,
                batch.global_size, schedule.learning_rate, config.learning_rate,
                config.lr_base_batch_size, schedule.total_steps, schedule.steps_per_epoch,
                batch_norm, settings.runtime.compute_dtype))


def _run_facts(options, device):
    """What the run was asked and found, for config/settings.finalize."""
    return settings_lib.RunFacts(
        ranks=distributed.size(), per_rank_batch=options.train_batch_size,
        eval_per_rank_batch=options.eval_batch_size,
        accumulation_steps=options.gradient_accumulation_steps,
        global_batch_size=options.global_batch_size,
        examples_per_epoch=_examples_per_epoch(options), num_epochs=options.num_epochs,
        half_dtype=distributed.mixed_precision_dtype(device), use_amp=options.use_amp,
        seed=options.seed if options.seed is not None else (0 if options.deterministic
                                                            else None),
        model_dir=options.model_dir, backbone_ckpt=options.backbone_ckpt, ckpt=options.ckpt,
        steps_file=options.steps_file or '')


def _start_distributed(options):
    """The device, then Horovod; returns the device name."""
    distributed.configure_logging(verbose=options.verbose)
    # The Habana module must be loaded before hvd.init() (it reads HOROVOD_CYCLE_TIME).
    device = distributed.select_device(no_hpu=options.no_hpu, require=options.device)
    distributed.init(legacy_flags.horovod_switch(options.use_horovod))
    legacy_flags.check_world_size(options.use_horovod, distributed.size(),
                                  ranks_per_box=distributed.local_size())
    distributed.configure_logging(verbose=options.verbose)  # Now it knows the main rank.
    return device


def _assemble_config(options, config, explicit_keys):
    """The hparams the user did not set, from the model_dir's automl config.yaml and the label
    map beside the shards; checks the model_dir fits. Returns (label_map, automl model_dir)."""
    saved, automl_dir = _read_model_dir_config(options.model_dir)
    # An evaluation takes the model it evaluates from the config its training wrote, as for
    # automl's model_dirs (a fine-tune's Lite0 is not the flags' default D0).
    if automl_dir or (options.mode == 'eval' and saved is not None):
        _adopt_automl_config(options.model_dir, saved, config, explicit_keys)
    label_map, label_map_path = _find_label_map(options)
    _adopt_num_classes(config, explicit_keys, label_map, label_map_path)
    if distributed.is_main():
        _check_model_dir(options.model_dir, saved, config)
    return label_map, automl_dir


def prepare(options, config, explicit_keys):
    """Validates everything it can before a graph is built; returns a Run.

    Per rank, as in Habana's port and Horovod practice: `mpirun -np 8 ... --train_batch_size 8`
    trains 64 images a step (times --gradient_accumulation_steps), and the learning rate
    (given per lr_base_batch_size images) and the steps per epoch follow that global batch."""
    device = _start_distributed(options)
    if not options.model_dir:
        raise RunSetupError('--model_dir is required (checkpoints, logs and metrics go there)')
    _check_inputs(options)
    _check_warm_start(options)
    label_map, automl_dir = _assemble_config(options, config, explicit_keys)
    settings = settings_lib.finalize(config, _run_facts(options, device))
    if options.deterministic:
        os.environ['TF_DETERMINISTIC_OPS'] = '1'
    lock = None
    if distributed.is_main():
        lock = _prepare_model_dir(options, settings, label_map, automl_dir)
    with model_dir_lock.released_on_error(lock):
        logging.info(run_summary(settings, device))
        _startup_notes(options, settings)
        estimator = _build_estimator(options, settings, device)
        return Run(options, settings, estimator, label_map, *_skip_lists(options, settings.config),
                   lock=lock)


def _startup_notes(options, settings):
    if options.mode == 'eval' or not distributed.is_main():
        return
    rise = det_model_fn.cosine_rise_warning(settings)
    if rise:
        logging.warning(rise)
    if not options.save_graph_def:
        # automl's and Habana's model_dirs have them (a plain Estimator writes them; D0: ~10 s).
        logging.info('no graph.pbtxt or .meta graph files in model_dir (--save_graph_def '
                     'writes them)')


def _skip_lists(options, config):
    """--skip_bad_records: rank 0 checks the shards the mode reads, every rank gets the lists."""
    if not options.skip_bad_records:
        return None, None
    lists = (None, None)
    if distributed.is_main():
        reads_train = options.mode != 'eval' and not options.use_fake_data
        reads_eval = options.mode != 'train' or options.eval_after_training
        lists = tuple(bad_records.find_bad_records(pattern, config.num_classes) if wanted
                      else None for pattern, wanted in (
                          (options.training_file_pattern, reads_train),
                          (options.validation_file_pattern, reads_eval)))
    return distributed.broadcast_object(lists)


def train_input_fn(run, start_step=0):
    """start_step: the step training resumes from; with --deterministic the input skips the
    batches taken before it, so a resumed run sees an uninterrupted run's batches."""
    options = run.options
    return dataloader.InputReader(
        options.training_file_pattern, is_training=True, use_fake_data=options.use_fake_data,
        num_shards=distributed.size(), shard_index=distributed.rank(),
        deterministic=options.deterministic, seed=run.settings.runtime.seed, skip=run.train_skip,
        start_batches=start_step if options.deterministic else 0)
