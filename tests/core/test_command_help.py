"""core/command_help.py on flags of its own (a FlagValues of the test, not absl's global one):
which flags a command's --help lists, in which groups, laid out as absl lays them out. The
commands' --help as users run it: tests/cli/test_help.py."""
import sys

import pytest
from absl import flags

from efficientdet_hpu.core import command_help

OTHER_MODULE = 'efficientdet_hpu.config.legacy_flags'  # a real module, for its name only


@pytest.fixture
def command(monkeypatch):
    """A FlagValues with a command's flags defined by this module (two subcommands), one flag
    adopted from another module, and one of that module that the command did not adopt."""
    monkeypatch.setattr(sys, 'argv', ['tool.py'])
    values = flags.FlagValues()
    flags.DEFINE_string('model_dir', None, 'Run directory.', flag_values=values)
    flags.DEFINE_string('export_dir', None, 'export: where to write.', flag_values=values)
    flags.DEFINE_string('formats', 'a', 'export tflite_int8: calibration. predict: none.',
                        flag_values=values)
    flags.DEFINE_integer('repeat', 1, 'predict: runs per image (export: unused).',
                         flag_values=values)
    flags.DEFINE_bool('use_tpu', False, 'TPU-era flag.', flag_values=values)
    adopted = flags.BooleanFlag('dump_all_ranks', False, 'Every rank logs.')
    flags.DEFINE_flag(adopted, values, module_name=OTHER_MODULE)
    flags.DEFINE_flag(flags.BooleanFlag('elsewhere', False, 'Not adopted.'), values,
                      module_name=OTHER_MODULE)
    values.register_key_flag_for_module(__name__, adopted)
    values.register_key_flag_for_module(__name__, values['use_tpu'])
    return values


def names(groups):
    return [(title, sorted(flag.name for flag in group)) for title, group in groups]


def test_own_flags_first_then_each_adopted_module(command):
    assert names(command_help.flag_groups(__name__, flag_values=command)) == [
        ('tool.py', ['export_dir', 'formats', 'model_dir', 'repeat', 'use_tpu']),
        (OTHER_MODULE, ['dump_all_ranks'])]


def test_subcommand_labels_starting_a_sentence_group_the_flags(command):
    """'predict:' after a full stop counts; '(export: unused)' inside a sentence does not; a
    flag of both subcommands is listed under each."""
    groups = command_help.flag_groups(__name__, ('export', 'predict'), command)
    assert names(groups) == [('tool.py', ['model_dir', 'use_tpu']),
                             ('tool.py export', ['export_dir', 'formats']),
                             ('tool.py predict', ['formats', 'repeat']),
                             (OTHER_MODULE, ['dump_all_ranks'])]


@pytest.mark.parametrize('help_string,labels', [
    ('train/infer: comma-separated batch sizes (train: images per rank).', ['train', 'infer']),
    ('train: fake. input: only when given. train_and_eval: fake too.',
     ['train', 'input', 'train_and_eval']),
    ('train without fake data: TFRecords.', ['train']),
    ('Variant, d0 .. d7x (train_and_eval: lite0 unless given).', []),
    ('Recipe YAML and/or overrides, e.g. image_size=640 (infer/input/train).', []),
])
def test_labels(help_string, labels):
    found = [name for name in command_help._labels(help_string)  # pylint: disable=protected-access
             if name in ('train', 'infer', 'input', 'train_and_eval')]
    assert found == labels


def test_help_text_is_the_docstring_then_the_groups_as_absl_renders_them(command):
    text = command_help.help_text(__name__, ('export', 'predict'), command)
    assert text.startswith(__doc__ + '\nflags:\n\ntool.py:\n  --model_dir: Run directory.\n')
    assert ("\ntool.py predict:\n  --formats: export tflite_int8: calibration. predict: none.\n"
            "    (default: 'a')\n  --repeat: predict: runs per image (export: unused).\n"
            "    (default: '1')\n    (an integer)\n\n%s:\n  --[no]dump_all_ranks: Every rank "
            "logs.\n    (default: 'false')\n" % OTHER_MODULE) in text
    assert 'elsewhere' not in text


@pytest.mark.parametrize('argv,asks', [
    (['main.py', '--help'], True), (['main.py', '--model_dir=x', '-?'], True),
    (['main.py', '--helpshort'], True), (['main.py', '--helpfull'], False),
    (['main.py', '--', '--help'], False), (['main.py', '--model_dir=--help'], False),
])
def test_asks_for_help(argv, asks):
    assert command_help.asks_for_help(argv) is asks
