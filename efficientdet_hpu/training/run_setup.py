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

from efficientdet_hpu.config import automl_config
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import legacy_flags
from efficientdet_hpu.config import model_params
from efficientdet_hpu.config import recipe
from efficientdet_hpu.config.options import RunOptions
from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core.cli import UserError
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.data import label_map as label_map_lib
from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.training import checkpoint_integrity
from efficientdet_hpu.training import checkpoints
from efficientdet_hpu.training import data_faults
from efficientdet_hpu.training import det_model_fn
from efficientdet_hpu.training import resume_check
from efficientdet_hpu.training import run_lock

tf1 = tf.compat.v1


class RunSetupError(UserError, ValueError):
    """A user mistake in options, data or model_dir; the message names it and the fix."""


@dataclasses.dataclass
class Run:
    options: RunOptions
    config: hparams_config.Config
    params: model_params.RunParams  # The run's half of the Estimator's params.
    estimator: object
    label_map: object
    steps_per_epoch: float  # automl's: examples / global batch, not floored.
    total_steps: int
    train_skip: object = None  # training.data_faults.SkipList with --skip_bad_records.
    eval_skip: object = None
    lock: object = None  # training.run_lock.ModelDirLock of a training job's rank 0.

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


def _check_batch(name, batch):
    if batch < 1:
        raise RunSetupError('--%s=%d must be a positive number of images per rank (the global '
                            'batch is it times the number of ranks)' % (name, batch))
    return batch


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


def schedule_steps(examples_per_epoch, global_batch, num_epochs):
    """(steps per epoch, total steps) as automl counts them: the steps per epoch stay a float
    (118287 / 64 = 1848.23 on COCO), the total is int(num_epochs * that), at least 1; the
    warm-up and the learning-rate drops are int(epochs * steps per epoch) in model_fn."""
    steps_per_epoch = examples_per_epoch / float(global_batch)
    return steps_per_epoch, max(1, int(num_epochs * steps_per_epoch))


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


def _check_model_dir(model_dir, config):
    """A model_dir holding another model's checkpoint is an error, not a silent mix."""
    saved = os.path.join(model_dir, 'config.yaml')
    # listed_checkpoints also sees a newest checkpoint whose index is gone.
    if not (os.path.exists(saved) and checkpoint_integrity.listed_checkpoints(model_dir)):
        return
    previous = recipe.read_saved_config(saved)  # Ours, or automl's config.yaml.
    fields = ('name', 'backbone_name', 'num_classes', 'fpn_num_filters', 'fpn_cell_repeats',
              'box_class_repeats', 'min_level', 'max_level', 'num_scales', 'aspect_ratios')
    differing = [f for f in fields if previous.get(f) != config.get(f)]
    if differing:
        raise RunSetupError(
            '--model_dir=%s holds a checkpoint of another model (%s); use a new --model_dir, '
            'or fine-tune from it with --ckpt=%s' % (model_dir, ', '.join(
                '%s %r != %r' % (f, previous.get(f), config.get(f)) for f in differing),
                model_dir))


# ---- google/automl model_dirs (training/automl_config.py) ----
def _automl_config_path(model_dir):
    """model_dir/config.yaml when it is google/automl's own, else None."""
    path = os.path.join(model_dir, 'config.yaml')
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return path if automl_config.is_automl_config(
            automl_config.load_yaml_text(f.read(), path)) else None


def _adopt_automl_config(model_dir, config, explicit_keys):
    """In an automl model_dir, automl's config.yaml decides every hparam the user did not set,
    so evaluating its checkpoint reproduces automl's model and post-processing."""
    path = _automl_config_path(model_dir) if model_dir else None
    if path is None:
        return
    saved = hparams_config.flatten_keys(recipe.read_saved_config(path).as_dict())
    keep = set(explicit_keys) | {'mixed_precision'}  # --use_amp decides that one.
    config.override({key: value for key, value in saved.items() if key not in keep})
    logging.info('hparams from automl\'s %s (except those set: %s)', path,
                 ', '.join(sorted(explicit_keys)) or 'none')
# ---- end of automl model_dirs ----


def _write_run_files(model_dir, config, options, label_map):
    """config.yaml, flags.json and the data's label map: what export, predict and eval read
    back from model_dir (class names included) with no other flag."""
    os.makedirs(model_dir, exist_ok=True)
    if _automl_config_path(model_dir) is None:  # automl's own config.yaml is left as it is.
        atomic_file.write_text_atomically(os.path.join(model_dir, 'config.yaml'),
                                          config.to_yaml())
    if label_map is not None:
        atomic_file.write_json_atomically(os.path.join(model_dir, label_map_lib.MODEL_DIR_FILE),
                                          label_map.to_json_dict(), indent=2)
    atomic_file.write_json_atomically(os.path.join(model_dir, 'flags.json'),
                                      options.as_dict())


def _prepare_model_dir(options, config, label_map, schedule):
    """Rank 0, before anything is built: the model_dir fits the model, a training job holds
    its lock (an evaluator beside it takes none) and sets a damaged newest checkpoint aside
    (training/checkpoint_integrity.py; none intact: CheckpointError), the run files and the
    schedule are written. Returns the lock (None for an evaluator)."""
    _check_model_dir(options.model_dir, config)
    if options.mode == 'eval':
        _write_run_files(options.model_dir, config, options, label_map)
        return None
    lock = _hold_model_dir(options.model_dir)
    with run_lock.released_on_error(lock):
        recovered = checkpoint_integrity.recover(options.model_dir)
        if recovered:
            logging.warning(recovered)
        _write_run_files(options.model_dir, config, options, label_map)
        _note_schedule(options.model_dir, schedule)
    return lock


def _hold_model_dir(model_dir):
    """model_dir/.lock for this job (training/run_lock.py): Run.close() removes it when the
    run ends, atexit when the process ends first."""
    lock = run_lock.ModelDirLock(model_dir)
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


def _build_estimator(options, params, device):
    """params: the Estimator's params dict (config/model_params.to_estimator)."""
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
        model_dir=model_dir, tf_random_seed=params['seed'],
        save_checkpoints_steps=options.cp_every_n_steps if main else None,
        save_checkpoints_secs=None, keep_checkpoint_max=options.keep_checkpoint_max,
        checkpoint_save_graph_def=options.save_graph_def,
        save_summary_steps=None,  # training/hooks.SummaryHook writes them.
        log_step_count_steps=None, session_config=session_config(device, options.use_xla))
    return tf1.estimator.Estimator(det_model_fn.model_fn, config=run_config, params=params)


def run_summary(config, device, world, per_rank_batch, total_steps, steps_per_epoch, params):
    """The run's first line: the batch per rank (and the micro-batches accumulated) and
    globally, the scaled learning rate and the schedule, so a command carried over from another
    port shows at once what it means here."""
    scale = params.global_batch_size / float(config.lr_base_batch_size)
    batch_norm = ''
    if world > 1:
        batch_norm = '; batch norm %s' % ('synchronised across ranks' if params.cross_rank_batch_norm
                                          else 'per rank')
    accumulated = ''
    if params.accumulation_steps > 1:
        accumulated = ' x %d accumulated micro-batches' % params.accumulation_steps
    return ('%s on %s x%d: batch %d per rank%s, global %d; learning rate %.4g (%.4g per %d '
            'images); %d steps (%.6g per epoch)%s; compute %s' % (
                config.name, device, world, per_rank_batch, accumulated,
                params.global_batch_size, config.learning_rate * scale, config.learning_rate,
                config.lr_base_batch_size, total_steps, steps_per_epoch, batch_norm,
                params.compute_dtype))


def accumulation_steps(options, config, per_rank_batch, world):
    """Micro-batches per optimizer step: derived from --global_batch_size when given, else
    --gradient_accumulation_steps, else the recipe's gradient_accumulation_steps. Records the
    value in `config` (so model_dir/config.yaml says it)."""
    asked = options.gradient_accumulation_steps
    if asked is not None and asked < 1:
        raise RunSetupError('--gradient_accumulation_steps=%d must be >= 1 (1: no '
                            'accumulation)' % asked)
    steps = asked or config.gradient_accumulation_steps
    wanted = options.global_batch_size
    if wanted is not None:
        per_micro_batch = per_rank_batch * world
        ranks = '%d %s' % (world, 'rank' if world == 1 else 'ranks')
        if wanted < 1 or wanted % per_micro_batch:
            raise RunSetupError(
                '--global_batch_size=%d is not a multiple of %s x --train_batch_size=%d '
                '= %d images; ask for a multiple of %d or change --train_batch_size'
                % (wanted, ranks, per_rank_batch, per_micro_batch, per_micro_batch))
        if asked is not None and asked != wanted // per_micro_batch:
            raise RunSetupError(
                '--gradient_accumulation_steps=%d disagrees with --global_batch_size=%d (%s '
                'x %d x %d = %d); give only one of them'
                % (asked, wanted, ranks, per_rank_batch, asked, per_micro_batch * asked))
        steps = wanted // per_micro_batch
    config.gradient_accumulation_steps = steps
    return steps


def prepare(options, config, explicit_keys):
    """Validates everything it can before a graph is built; returns a Run."""
    distributed.configure_logging(verbose=options.verbose)
    # The Habana module must be loaded before hvd.init() (it reads HOROVOD_CYCLE_TIME).
    device = distributed.select_device(no_hpu=options.no_hpu, require=options.device)
    distributed.init(legacy_flags.horovod_switch(options.use_horovod))
    legacy_flags.check_world_size(options.use_horovod, distributed.size(),
                                  ranks_per_box=distributed.local_size())
    distributed.configure_logging(verbose=options.verbose)  # Now it knows the main rank.
    if not options.model_dir:
        raise RunSetupError('--model_dir is required (checkpoints, logs and metrics go there)')
    _check_inputs(options)
    _adopt_automl_config(options.model_dir, config, explicit_keys)
    label_map, label_map_path = _find_label_map(options)
    _adopt_num_classes(config, explicit_keys, label_map, label_map_path)
    hparams_config.validate(config)
    world = distributed.size()
    # Per rank, as in Habana's port and Horovod practice: `mpirun -np 8 ... --train_batch_size 8`
    # trains 64 images a step (times --gradient_accumulation_steps), and the learning rate
    # (given per lr_base_batch_size images) and the steps per epoch follow that global batch.
    per_rank_batch = _check_batch('train_batch_size', options.train_batch_size)
    _check_batch('eval_batch_size', options.eval_batch_size)
    accumulated = accumulation_steps(options, config, per_rank_batch, world)
    global_batch = per_rank_batch * world * accumulated
    num_epochs = options.num_epochs if options.num_epochs is not None else config.num_epochs
    steps_per_epoch, total_steps = schedule_steps(_examples_per_epoch(options), global_batch,
                                                  num_epochs)
    if options.deterministic:
        os.environ['TF_DETERMINISTIC_OPS'] = '1'
    seed = options.seed if options.seed is not None else (0 if options.deterministic else None)
    lock = None
    if distributed.is_main():
        lock = _prepare_model_dir(options, config, label_map, resume_check.schedule(
            world, per_rank_batch, global_batch, config.learning_rate * global_batch /
            float(config.lr_base_batch_size), steps_per_epoch, total_steps))
    with run_lock.released_on_error(lock):
        params = model_params.RunParams(
            batch_size=per_rank_batch, global_batch_size=global_batch,
            steps_per_epoch=steps_per_epoch, total_steps=total_steps, seed=seed,
            backbone_ckpt=options.backbone_ckpt, ckpt=options.ckpt,
            compute_dtype=(distributed.mixed_precision_dtype(device) if config.mixed_precision
                           else 'float32'),
            # Synchronised batch norm only means something with more than one rank.
            cross_rank_batch_norm=bool(config.sync_batch_norm and world > 1),
            accumulation_steps=accumulated, model_dir=options.model_dir)
        logging.info(run_summary(config, device, world, per_rank_batch, total_steps,
                                 steps_per_epoch, params))
        rise = det_model_fn.cosine_rise_warning(config, steps_per_epoch, total_steps)
        if rise and options.mode != 'eval' and distributed.is_main():
            logging.warning(rise)
        if options.mode != 'eval' and not options.save_graph_def and distributed.is_main():
            # automl's and Habana's model_dirs have them (a plain Estimator writes them;
            # D0: ~10 s).
            logging.info('no graph.pbtxt or .meta graph files in model_dir (--save_graph_def '
                         'writes them)')
        estimator = _build_estimator(options, model_params.to_estimator(config, params), device)
        return Run(options, config, params, estimator, label_map,
                   steps_per_epoch, total_steps, *_skip_lists(options, config), lock=lock)


def _skip_lists(options, config):
    """--skip_bad_records: rank 0 checks the shards the mode reads, every rank gets the lists."""
    if not options.skip_bad_records:
        return None, None
    lists = (None, None)
    if distributed.is_main():
        reads_train = options.mode != 'eval' and not options.use_fake_data
        reads_eval = options.mode != 'train' or options.eval_after_training
        lists = tuple(data_faults.find_bad_records(pattern, config.num_classes) if wanted
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
        deterministic=options.deterministic, seed=run.params.seed, skip=run.train_skip,
        start_batches=start_step if options.deterministic else 0)
