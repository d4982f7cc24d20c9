"""A plan as main.py's recipe (output_dir/plan.yaml) and as the lines printed before training.

The recipe's keys that name main.py flags set those flags (config/recipe.py RUN_OPTION_KEYS);
the rest are hparams. `python main.py --hparams=OUT/plan.yaml --model_dir=OUT/model` trains
the same steps as the fine-tune: num_epochs evaluations of num_examples_per_epoch images,
a fraction where an end moved while training (finetune/correction.py) falls inside one, so that
main.py's int(epochs x images / global batch) is the plan's steps exactly.
"""
import math

import yaml

from efficientdet_hpu.core import atomic_file

BACKBONE_SCOPE = 'efficientnet'  # var_freeze_expr: re.match on efficientnet-lite0/... names.


def warmup_epochs(warmup_steps, interval) -> float:
    """Evaluation intervals whose int(x * interval) is `warmup_steps`, as main.py counts an
    epoch's steps: lr_warmup_epoch, or a num_epochs that ends inside an interval."""
    value = round(warmup_steps / float(interval), 6)
    while int(value * interval) < warmup_steps:
        value = round(value + 1e-6, 6)
    return value


def num_epochs(plan):
    """The recipe's num_epochs for the plan's steps: its evaluations, or where the steps end
    inside an interval the fraction whose int(x * interval) is the steps."""
    if plan.steps % plan.eval_interval == 0:
        return plan.steps // plan.eval_interval
    return warmup_epochs(plan.steps, plan.eval_interval)


def _nested(dotted):
    """{'nms_configs.iou_thresh': 0.6} -> {'nms_configs': {'iou_thresh': 0.6}}."""
    result = {}
    for key, value in dotted:
        node, parts = result, key.split('.')
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return result


# main.py run options that plan.yaml sets and --hparams may override (they are counts): how
# often to evaluate, log and checkpoint, how long, and early stop. A finer override than the
# plan's gives main.py a schedule the plan's printed steps and time no longer describe, and the
# plan says so in its `overrides` line.
RUN_OPTION_OVERRIDES = ('num_examples_per_epoch', 'num_epochs', 'log_every_n_steps',
                        'cp_every_n_steps', 'keep_checkpoint_max', 'early_stop_patience')


def log_every(interval) -> int:
    """A record every quarter interval (at most 50 steps): the probe's three records past the
    freeze (finetune/probe.py) come by the first evaluation, where a short plan leaves time to
    move its end."""
    return max(1, min(50, interval // 4))


def recipe(plan, training_pattern, validation_pattern, val_json, hparams=()) -> dict:
    """The plan as a main.py recipe (run options first, then hparams; `hparams` the
    --hparams overrides, last, so they win)."""
    content = {
        'mode': 'train_and_eval', 'model_name': plan.model_name,
        'train_batch_size': plan.per_rank_batch, 'eval_batch_size': plan.per_rank_batch,
        'num_examples_per_epoch': plan.eval_interval * plan.global_batch,
        'num_epochs': num_epochs(plan),
        'log_every_n_steps': log_every(plan.eval_interval),
        'cp_every_n_steps': plan.eval_interval, 'keep_checkpoint_max': 3,
        'early_stop_patience': plan.early_stop_patience,
        'training_file_pattern': training_pattern, 'validation_file_pattern': validation_pattern,
        'val_json_file': val_json,
    }
    if plan.weights.kind == 'backbone':
        content['backbone_ckpt'] = plan.weights.path
    elif plan.weights.kind == 'detector':
        content['ckpt'] = plan.weights.path
    content.update(image_size=plan.image_size, gradient_accumulation_steps=plan.accumulation)
    content.update(dict(plan.model_keys))
    content.update(dict(plan.schedule_keys))
    content.update(lr_warmup_epoch=warmup_epochs(plan.warmup_steps, plan.eval_interval),
                   moving_average_decay=plan.ema_decay,
                   max_instances_per_image=plan.max_instances)
    if plan.freeze_steps:
        content.update(var_freeze_expr=BACKBONE_SCOPE, var_freeze_steps=plan.freeze_steps)
    content.update(dict(plan.anchors))
    content.update(_nested(hparams))
    return content


def yaml_text(content, rerun) -> str:
    """plan.yaml: a header naming the command that reruns it, then the recipe."""
    header = ('# Written by efficientdet-finetune: its plan as a main.py recipe (keys naming '
              'main.py flags set\n# those flags; the others are hparams). Rerun the same '
              'training with\n#   %s\n' % rerun)
    return header + yaml.safe_dump(content, sort_keys=False, default_flow_style=False)


def lines(plan) -> list:
    """The plan as printed: one line per decision with its reason."""
    width = max(len(topic) for topic, _ in plan.reasons)
    return ['  %-*s  %s' % (width, topic, text) for topic, text in plan.reasons]


def minutes(seconds) -> str:
    """'27 min', '1 h 05 min'."""
    total = int(math.ceil(seconds / 60.0))
    return '%d min' % total if total < 60 else '%d h %02d min' % divmod(total, 60)


def header_of(text) -> list:
    """The comment lines at the top of a recipe's text."""
    lines = []
    for line in text.splitlines():
        if not line.startswith('#'):
            break
        lines.append(line)
    return lines


def _length_values(plan) -> dict:
    """The recipe's keys that follow the number of steps, as recipe() writes them."""
    values = {'num_examples_per_epoch': plan.eval_interval * plan.global_batch,
              'cp_every_n_steps': plan.eval_interval,
              'log_every_n_steps': log_every(plan.eval_interval),
              'lr_warmup_epoch': warmup_epochs(plan.warmup_steps, plan.eval_interval),
              'early_stop_patience': plan.early_stop_patience}
    if plan.freeze_steps:
        values['var_freeze_steps'] = plan.freeze_steps
    return values


def length_keys(was, now) -> dict:
    """{key: (the value plan `was` wrote, plan `now`'s)} for the keys that follow the steps."""
    before = _length_values(was)
    return {key: (before.get(key), value) for key, value in _length_values(now).items()}


def set_num_epochs(path, epochs, notes=(), keys=None):
    """Rewrites the recipe at `path` with num_epochs = `epochs` (num_epochs(plan)), its header
    kept and `notes` (a search's result) added to it as comment lines in place of earlier
    ones. `keys` {key: (was, now)}: each set to `now` where the recipe holds `was` (a value
    --hparams set stays)."""
    with open(path, encoding='utf-8') as stream:
        text = stream.read()
    content = yaml.safe_load(text)
    content['num_epochs'] = int(epochs) if float(epochs).is_integer() else float(epochs)
    for key, (was, now) in (keys or {}).items():
        if key in content and content[key] == was:
            content[key] = now
    header = [line for line in header_of(text)  # A new search result replaces the old.
              if not (notes and line.startswith('# search: '))]
    header += ['# search: %s' % note for note in notes]
    with atomic_file.replacing(path, suffix='.yaml') as temporary:
        with open(temporary, 'w', encoding='utf-8') as stream:
            stream.write('\n'.join(header) + '\n' + yaml.safe_dump(
                content, sort_keys=False, default_flow_style=False))


def planned_num_epochs(path):
    """num_epochs of the recipe at `path`."""
    with open(path, encoding='utf-8') as stream:
        return yaml.safe_load(stream).get('num_epochs')


def holds_steps_of(path, plan) -> bool:
    """Whether the recipe at `path` trains `plan`'s steps: False where --hparams set its
    num_epochs (those steps stay; the time budget stops them)."""
    return planned_num_epochs(path) == num_epochs(plan)
