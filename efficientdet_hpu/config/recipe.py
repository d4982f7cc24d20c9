"""Recipes: what `--hparams` names (a YAML file and/or 'a=1,b.c=2' overrides) resolved
against the config system. A recipe's keys are hparams, except RUN_OPTION_KEYS, which set
main.py's flags of the same names (a flag typed on the command line wins)."""
import collections
import difflib
import glob
import os
import re

from efficientdet_hpu.config import automl_config
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config.hparams_config import Config, flatten_keys

# Recipe keys that set one of main.py's run options (a flag of the same name), not an hparam.
RUN_OPTION_KEYS = (
    'mode', 'model_name', 'train_batch_size', 'global_batch_size', 'eval_batch_size',
    'eval_samples',
    'training_file_pattern', 'validation_file_pattern', 'val_json_file',
    'num_examples_per_epoch', 'num_epochs', 'iterations_per_loop', 'log_every_n_steps',
    'cp_every_n_steps', 'keep_checkpoint_max', 'eval_after_training', 'use_amp', 'use_xla',
    'deterministic', 'seed', 'backbone_ckpt', 'ckpt', 'min_eval_interval', 'eval_timeout',
    'early_stop_patience')


class Recipe(collections.namedtuple('Recipe', 'run_options hparams overrides')):
    """An `--hparams` value read: run_options {flag name: value} and hparams {key: value} from
    the YAML file, overrides {dotted key: value} from the 'a=1,b.c=2' part."""

    @property
    def explicit_keys(self):
        """hparams keys the user set (a recipe or an override), as opposed to defaults."""
        return set(flatten_keys(self.hparams)) | set(self.overrides)


def read_recipe(text):
    """'recipe.yaml', 'a=1,b.c=2', 'recipe.yaml,a=1' or '' -> Recipe."""
    text = (text or '').strip()
    head, _, rest = text.partition(',')
    problem = recipe_file_error(head)
    if problem:
        raise hparams_config.ConfigError(problem)
    path, override_text = (head, rest) if hparams_config.is_yaml_path(head) else (None, text)
    values = hparams_config.load_yaml(path) if path else {}
    run_options = {key: values.pop(key) for key in list(values) if key in RUN_OPTION_KEYS}
    return Recipe(run_options, values, hparams_config.parse_override_string(override_text))


def recipe_file_error(head):
    """The one line for an --hparams value whose first entry names a recipe file that cannot be
    one: a path that is not there (a .yaml/.yml name, or an entry without '=' that has a '/' or
    a file extension: a mistyped recipe, which would otherwise read as a malformed key=value),
    with the closest YAML file's name; a file there whose name is not .yaml/.yml. Else None."""
    head = head.strip()
    if not head or '=' in head:
        return None
    is_yaml = hparams_config.is_yaml_path(head)
    if os.path.isfile(head):
        return None if is_yaml else (
            '--hparams=%s: a recipe file is YAML named .yaml or .yml (overrides are key=value)'
            % head)
    if not (is_yaml or '/' in head or os.sep in head
            or re.search(r'\.(ya?m?l?|json|cfg|conf|txt)$', head, re.I)):
        return None
    folder = os.path.dirname(head)
    if folder and not os.path.isdir(folder):
        where = 'no folder %s' % folder
    else:
        where = 'no file %s' % head
    candidates = [path for pattern in ('*.yaml', '*.yml')
                  for path in glob.glob(os.path.join(folder, pattern))]
    close = difflib.get_close_matches(head, candidates, n=1, cutoff=0.6)
    return ('--hparams=%s: %s%s (a recipe is a .yaml or .yml file; overrides are key=value)'
            % (head, where, '; did you mean --hparams=%s?' % close[0] if close else ''))


def build_config(model_name, recipe, base=None):
    """`base` (a saved config) or model_name's defaults <- the recipe's hparams <- overrides."""
    config = (Config(base.as_dict()) if base is not None
              else hparams_config.get_efficientdet_config(model_name))
    config.override(recipe.hparams)
    config.override(recipe.overrides)
    return config


def resolve(model_name='efficientdet-d0', hparams='', base=None, **fixed):
    """The config front-end of the tools (bench, model_inspect, inference): defaults or `base`
    <- `hparams` (recipe and/or overrides) <- `fixed` values that are not None (a tool's own
    flags such as image_size=...). A recipe's run options (main.py flags) are ignored, except
    model_name, which the recipe may set. Returns the validated Config, frozen: a tool's
    finalised configuration (it computes in float32 and has no schedule)."""
    recipe = read_recipe(hparams)
    config = build_config(recipe.run_options.get('model_name', model_name), recipe, base)
    config.override({key: value for key, value in fixed.items() if value is not None})
    return hparams_config.validate(config).frozen()


def read_saved_config(path):
    """A model_dir's config.yaml as a Config: this project's (keys added since it was written
    take their defaults), or google/automl's as automl leaves it (read safely, keys mapped)."""
    return read_saved_config_and_origin(path)[0]


def read_saved_config_and_origin(path):
    """(read_saved_config(path), True when the file is google/automl's own config.yaml), from
    one read of the file."""
    try:
        with open(path) as f:
            values = automl_config.load_yaml_text(f.read(), path)
    except OSError as error:
        raise hparams_config.ConfigError('cannot read %s: %s' % (path, error.strerror))
    is_automl = automl_config.is_automl_config(values)
    if is_automl:
        name, values = automl_config.project_values(values)
        automl_config.note('%s is automl\'s config.yaml, read as %s' % (path, name))
    else:
        name = values.get('name', 'efficientdet-d0')
        if 'survival_prob' in values and 'backbone_survival_prob' not in values:
            # Written before survival_prob took automl's meaning (the heads').
            values['backbone_survival_prob'] = values.pop('survival_prob')
    return hparams_config.get_efficientdet_config(name).override(values), is_automl
