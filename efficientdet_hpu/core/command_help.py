"""`--help` of every command: the command's own flags with their help, in its groups.

absl's `--help` lists the key flags of the `__main__` module (sys.argv[0]), and a command's flags
are defined in its module under efficientdet_hpu/, which `python main.py`, `efficientdet-train`
or `python -m dataset.doctor` runs through `entry_point()` (core/compat.py; pyproject.toml's
console scripts): absl would list none. A command's entry point calls `install(__name__)` before
`app.run`; its `--help` (and `--helpshort`, `-?`) then prints, as absl's does: the command
module's docstring, `flags:`, the flags in groups, and "Try --helpfull to get a list of all
flags.", exit status 1. The groups:
  - the flags the command module defines, under the command as typed (sys.argv[0], as absl
    heads a main module's flags); with `subcommands`, a flag whose help starts a sentence with
    a subcommand label (`predict: ...`, `export tflite_int8: ...`, `train/infer: ...`) is listed
    under each subcommand it names (`inference.py predict:`), the others under the command;
  - then the flags the command adopted from another module (`flags.adopt_module_key_flags`,
    e.g. main.py's Habana/automl flags of config/legacy_flags.py), one group per module, headed
    by its name as in --helpfull.
--helpfull and --helpxml stay absl's.
"""
import os
import re
import sys

from absl import app, flags

HELPFULL_HINT = 'Try --helpfull to get a list of all flags.'  # absl's last line of --help
_HELP_WORDS = ('--help', '-help', '--helpshort', '-helpshort', '-?')
_LABEL = re.compile(r'(?:^|[.;]\s+)([A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)*)(?:\s[^:.;]*)?:')


def asks_for_help(argv=None):
    """Whether the command line (sys.argv) asks for --help, --helpshort or -? (before any `--`):
    a command may then leave out imports its flags do not need. Another spelling
    (`--help=true`) only takes the longer way."""
    for argument in (sys.argv if argv is None else argv)[1:]:
        if argument == '--':
            return False
        if argument in _HELP_WORDS:
            return True
    return False


def install(module_name, subcommands=(), flag_values=flags.FLAGS):
    """Makes --help, --helpshort and -? print the flags of the command whose entry point is in
    `module_name` (its `__name__`); `subcommands` (names) group the flags by the labels of their
    help. Call it after the command's flags are defined, before app.run."""
    app.define_help_flags()  # absl's own, so app.run does not define them over these
    for name, short_name in (('help', '?'), ('helpshort', None)):
        flags.DEFINE_flag(CommandHelpFlag(name, short_name, module_name, tuple(subcommands),
                                          flag_values),
                          flag_values, module_name='absl.app')


class CommandHelpFlag(flags.BooleanFlag):
    """absl's --help flag ('show this help'), printing `help_text` of one command."""

    def __init__(self, name, short_name, module_name, subcommands, flag_values):
        super().__init__(name, False, 'show this help', short_name=short_name,
                         allow_hide_cpp=True, allow_override=True)
        self._command = (module_name, subcommands, flag_values)

    def parse(self, argument):
        if self._parse(argument):
            module_name, subcommands, flag_values = self._command
            text = '%s\n%s\n' % (help_text(module_name, subcommands, flag_values),
                                 HELPFULL_HINT)
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except BrokenPipeError:  # `main.py --help | head`: not an error, as for absl.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)


def help_text(module_name, subcommands=(), flag_values=flags.FLAGS):
    """The command module's docstring, `flags:` and its flags in groups, laid out as absl's
    usage text (absl.app.usage)."""
    doc = sys.modules[module_name].__doc__ or '\nUSAGE: %s [flags]\n' % sys.argv[0]
    groups = flag_groups(module_name, subcommands, flag_values)
    if not groups:
        return doc + '\n'
    return '%s\nflags:\n%s\n' % (doc, '\n'.join(_render(title, group) for title, group in groups))


def flag_groups(module_name, subcommands=(), flag_values=flags.FLAGS):
    """[(title, [Flag])] of the command's key flags, grouped as the module docstring says."""
    registered = sys.argv[0] if module_name == '__main__' else module_name  # absl's naming
    own, adopted = [], {}
    for flag in flag_values.get_key_flags_for_module(module_name):
        defined_in = flag_values.find_module_defining_flag(flag.name)
        if defined_in == registered:
            own.append(flag)
        else:
            adopted.setdefault(defined_in, []).append(flag)
    by_label = {name: [] for name in subcommands}
    common = []
    for flag in own:
        named = [name for name in _labels(flag.help or '') if name in by_label]
        for name in named:
            by_label[name].append(flag)
        if not named:
            common.append(flag)
    command = sys.argv[0]
    groups = [(command, common)]
    groups += [('%s %s' % (command, name), group) for name, group in by_label.items()]
    groups += list(adopted.items())
    return [(title, group) for title, group in groups if group]


def _labels(help_string):
    """Subcommand names of the labels starting the sentences of a flag's help, in order:
    'train/infer: ... input: ...' -> ['train', 'infer', 'input']."""
    names = []
    for label in _LABEL.findall(help_string):
        names += [name for name in label.split('/') if name not in names]
    return names


def _render(title, group):
    """absl's rendering of a module's key flags (`--[no]name: help`, default, type), under
    `title`, through a FlagValues holding only this group."""
    holder = flags.FlagValues()
    for flag in group:
        holder[flag.name] = flag
        holder.register_key_flag_for_module(title, flag)
    return holder.module_help(title)
