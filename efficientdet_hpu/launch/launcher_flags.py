"""demo_efficientdet.py's command line: its own flags apart, everything else for main.py.

The launcher reads only its own flags and forwards every other argument unchanged and in order.
It also peeks at two of main.py's flags without removing them: --model_dir (where generated
files go) and --dump_all_ranks (each rank's output to its own file).
"""

import dataclasses
import re

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.launch.hcl_config import DEFAULT_HLS_TYPE, check_hls_type

BOOL_FLAGS = ("kubernetes_run", "dry_run")
VALUE_FLAGS = ("use_horovod", "hls_type", "main_script", "hostfile")
TRUE_WORDS = ("true", "t", "1")
FALSE_WORDS = ("false", "f", "0")
_BOOLEAN_LOOKING = TRUE_WORDS + FALSE_WORDS + ("yes", "no", "y", "n")
_FLAG = re.compile(r"--?([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?", re.DOTALL)


class LaunchError(UserError, ValueError):
    """A launcher flag or environment setting is wrong; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class LauncherArgs:
    use_horovod: int | None = None
    hls_type: str = DEFAULT_HLS_TYPE
    kubernetes_run: bool = False
    dry_run: bool = False
    main_script: str | None = None
    hostfile: str | None = None
    show_help: bool = False


def parse_launcher_argv(argv):
    """Splits `argv` (without the program name) into LauncherArgs and the args for main.py.

    Flags are written as absl writes them: `--flag=value`, `--flag value`, one or two dashes,
    booleans as `--flag`, `--flag=true|false|t|f|1|0` or `--noflag`. `--flag false` is refused:
    absl's FLAGS(argv, known_only=True) reads it as --flag=true and passes `false` on to main.py
    as a positional, which is why this exact parser is used instead.
    """
    values, forwarded, index = {}, [], 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        match = _FLAG.fullmatch(arg)
        name, value = (match.group(1), match.group(2)) if match else (None, None)
        if arg == "--":
            forwarded.extend(argv[index:])
            break
        if name in ("help", "h"):
            values["show_help"] = True
        elif name in BOOL_FLAGS or (name or "").removeprefix("no") in BOOL_FLAGS:
            flag, setting = _parse_boolean(arg, name, value, argv[index:index + 1])
            values[flag] = setting
        elif name in VALUE_FLAGS:
            if value is None:
                if index == len(argv):
                    raise LaunchError(f"--{name} needs a value, as in --{name}=VALUE")
                value, index = argv[index], index + 1
            values[name] = value
        else:
            forwarded.append(arg)
    return _check_launcher_values(values), forwarded


def _parse_boolean(arg, name, value, next_args):
    flag = name if name in BOOL_FLAGS else name.removeprefix("no")
    spelled_out = f"write --{flag}=true or --{flag}=false"
    if value is not None:
        if flag != name:
            raise LaunchError(f"{arg!r}: --no{flag} takes no value; {spelled_out}")
        if value.lower() in TRUE_WORDS + FALSE_WORDS:
            return flag, value.lower() in TRUE_WORDS
        raise LaunchError(f"{arg!r}: --{flag} is true or false; {spelled_out}")
    if next_args and next_args[0].lower() in _BOOLEAN_LOOKING:
        raise LaunchError(f"'{arg} {next_args[0]}' is ambiguous: a boolean flag takes no "
                          f"separate value; {spelled_out}")
    return flag, flag == name


def _check_launcher_values(values):
    ranks = values.get("use_horovod")
    if ranks is not None:
        if not re.fullmatch(r"[0-9]+", ranks) or int(ranks) < 1:
            raise LaunchError(f"--use_horovod={ranks!r} is not a rank count; give the number of "
                              f"ranks per box as a positive integer, e.g. --use_horovod 8")
        values["use_horovod"] = int(ranks)
    if "hls_type" in values:
        check_hls_type(values["hls_type"])
    return LauncherArgs(**values)


def model_dir_from(forwarded):
    """The last --model_dir given to main.py (absl: the last one wins), or None."""
    return forwarded_value(forwarded, 'model_dir')


def forwarded_value(forwarded, name):
    """The last value given to main.py's flag `name` (--name=V or --name V; absl: the last
    one wins), or None."""
    value = None
    for index, arg in enumerate(forwarded):
        match = re.fullmatch(r"--?%s(?:=(.*))?" % re.escape(name), arg, re.DOTALL)
        if match and match.group(1) is not None:
            value = match.group(1)
        elif match and index + 1 < len(forwarded):
            value = forwarded[index + 1]
    return value


def forwarded_boolean(forwarded, name):
    """The value main.py will give the boolean flag `name` (absl spellings, last one wins).

    A value absl would refuse (`--name=maybe`) counts as false here; main.py reports it.
    """
    setting = False
    for arg in forwarded:
        match = _FLAG.fullmatch(arg)
        if not match:
            continue
        flag, value = match.group(1), match.group(2)
        if flag == name:
            setting = value is None or value.lower() in TRUE_WORDS
        elif flag == "no" + name and value is None:
            setting = False
    return setting
