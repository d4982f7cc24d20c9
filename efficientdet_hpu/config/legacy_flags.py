"""Command lines written for Habana's and google/automl's EfficientDet main.py, accepted here.

Pure Python over absl (no TensorFlow import), so main.py and the launcher can both use it.

`--use_horovod`: Habana's main.py defines it as an integer, the ranks per box
(`mpirun -np 8 python main.py --use_horovod 8`); this port treats it as a switch. The flag
defined here takes both: `--use_horovod`, `--nouse_horovod`, `--use_horovod=true|false|t|f|1|0`
and a rank count `--use_horovod=8` or `--use_horovod 8`. absl cannot take that last spelling by
itself: for a boolean flag it reads `--use_horovod` as true and leaves `8` behind as a
positional argument; for an integer flag it takes the next argument whatever it is, so
`--use_horovod` alone fails ("Missing value") or swallows the next flag
(`--use_horovod --mode=train` -> value "--mode=train"). So the flag is boolean to absl, and
`fold_use_horovod_value` joins a separate number (or true/false word) to it before absl parses.

The TPU-era flags of the automl seed (`--use_tpu`, `--tpu`, ...) are defined so old command
lines parse; `tpu_era_problems` says which ask for a TPU (an error) and which are ignored.
"""

from absl import flags
from absl import logging

from efficientdet_hpu.core import errors

USE_HOROVOD = "use_horovod"
_TRUE_WORDS = ("true", "t", "1")
_FALSE_WORDS = ("false", "f", "0")


class WorldSizeError(errors.UserError, ValueError):
    """A rank count given with --use_horovod disagrees with the ranks mpirun started."""


class TpuFlagError(errors.UserError, ValueError):
    """A TPU-era flag asks for a Cloud TPU."""


class UseHorovodParser(flags.ArgumentParser):
    """Parses `--use_horovod` values: True/False, or a rank count (an int >= 2).

    "1" and "0" are the boolean words absl accepts, so they read as true and false.
    """

    def parse(self, argument):
        if isinstance(argument, bool) or argument is None:
            return argument
        text = str(argument).strip().lower()
        if text in _TRUE_WORDS:
            return True
        if text in _FALSE_WORDS:
            return False
        if text.isdigit():  # "8"; "-1", "2.5", "eight" are not counts
            return int(text)
        raise ValueError("expected true/false or a rank count such as 8 (Habana's "
                         "--use_horovod 8), got %r" % (argument,))

    def flag_type(self):
        return "bool or rank count"


class UseHorovodFlag(flags.Flag):
    """A flag absl treats as boolean (`--use_horovod`, `--nouse_horovod`) that also holds a count."""

    def __init__(self, name, default, help_string):
        super().__init__(UseHorovodParser(), None, name, default, help_string, boolean=True)

    def _serialize(self, value):
        if isinstance(value, bool) or value is None:
            return super()._serialize(value)
        return "--%s=%d" % (self.name, value)


def define_use_horovod_flag(flag_values=flags.FLAGS):
    """Defines --use_horovod (default None: Horovod starts when mpirun started > 1 rank)."""
    return flags.DEFINE_flag(UseHorovodFlag(
        USE_HOROVOD, None,
        "Horovod on/off, or Habana's rank count per box (--use_horovod 8), checked against the "
        "ranks mpirun started. Default: on when run by mpirun with more than one rank."),
        flag_values)


def fold_use_horovod_value(argv):
    """`argv` with `--use_horovod 8` (or `-use_horovod true`) joined into `--use_horovod=8`.

    Only a following number or true/false word is joined; argv[0] and everything after `--`
    are left alone. Returns a new list.
    """
    folded, index = list(argv[:1]), 1
    while index < len(argv):
        arg = argv[index]
        following = argv[index + 1] if index + 1 < len(argv) else None
        if arg == "--":
            folded.extend(argv[index:])
            break
        if (arg in ("--" + USE_HOROVOD, "-" + USE_HOROVOD) and following is not None
                and _is_flag_value(following)):
            folded.append("%s=%s" % (arg, following))
            index += 2
            continue
        folded.append(arg)
        index += 1
    return folded


def _is_flag_value(text):
    return text.isdigit() or text.lower() in _TRUE_WORDS + _FALSE_WORDS


def parse_flags(argv):
    """absl's parsing (`app.run(main, flags_parser=parse_flags)`) after folding a separate
    --use_horovod value; a flag error (a typo, a bad value) is the one-line error of every
    command, exit status 2, with absl's suggestion ('Did you mean: model_dir ?')."""
    return errors.parse_flags(fold_use_horovod_value(argv))


def horovod_switch(value):
    """The on/off meaning of a --use_horovod value: None (decide from mpirun), True or False."""
    return value if value is None else bool(value)


def check_world_size(value, world_size, ranks_per_box=None):
    """Raises WorldSizeError when `value` is a rank count matching neither the job's
    `world_size` nor, when known, the ranks mpirun started on this box (`ranks_per_box`: Habana's
    count is per box, so `--use_horovod 8` fits a 16-rank job on two boxes).
    """
    if value is None or isinstance(value, bool):
        return
    if value in (world_size, ranks_per_box):
        return
    if world_size == 1:
        raise WorldSizeError(
            "--use_horovod %d asks for %d ranks but this process is the only one (started "
            "without mpirun, or with mpirun -np 1); run `mpirun -np %d python main.py "
            "--use_horovod %d ...` or `python demo_efficientdet.py --use_horovod %d ...`, or "
            "drop the number"
            % (value, value, value, value, value))
    per_box = "" if ranks_per_box in (None, world_size) else ", %d on this box" % ranks_per_box
    raise WorldSizeError(
        "--use_horovod %d disagrees with the %d ranks mpirun started%s; pass --use_horovod %d "
        "(or --use_horovod without a number), or start %d ranks per box with mpirun"
        % (value, world_size, per_box, ranks_per_box or world_size, value))


def define_dump_all_ranks_flag(flag_values=flags.FLAGS):
    """Habana's --dump_all_ranks: every rank, not only rank 0, writes its own logs."""
    return flags.DEFINE_bool(
        "dump_all_ranks", False,
        "Every rank writes its own log and summaries (Habana: model_dir/worker_<rank>); "
        "through demo_efficientdet.py each rank's output also goes to its own file.",
        flag_values=flag_values)


# Name, absl type, default, help. Types and defaults as in the automl/Habana ports, except that
# use_tpu defaults to False (Habana's value; automl's TPU-first scripts defaulted to True).
TPU_ERA_FLAGS = (
    ("use_tpu", "bool", False, "TPU-era flag: only false is accepted (no TPU support)."),
    ("tpu", "string", None, "TPU-era flag: naming a Cloud TPU is an error (no TPU support)."),
    ("tpu_zone", "string", None, "TPU-era flag, ignored."),
    ("gcp_project", "string", None, "TPU-era flag, ignored."),
    ("eval_master", "string", "", "TPU-era flag, ignored."),
    ("num_cores", "integer", 8, "TPU-era flag, ignored: ranks come from mpirun."),
    ("num_cores_per_replica", "integer", 8, "TPU-era flag, ignored."),
    ("use_spatial_partition", "bool", False, "TPU-era flag, ignored."),
    ("input_partition_dims", "multi_integer", [1, 4, 2, 1], "TPU-era flag, ignored."),
    ("sbs_test", "bool", False, "Habana test-harness flag, ignored."),
)
_DEFINERS = {"bool": flags.DEFINE_bool, "string": flags.DEFINE_string,
             "integer": flags.DEFINE_integer, "multi_integer": flags.DEFINE_multi_integer}


def define_tpu_era_flags(flag_values=flags.FLAGS):
    """Defines every flag of TPU_ERA_FLAGS so command lines written for the ports parse."""
    for name, kind, default, help_text in TPU_ERA_FLAGS:
        _DEFINERS[kind](name, default, help_text, flag_values=flag_values)


def tpu_era_problems(flag_values=flags.FLAGS):
    """(errors, ignored_names) for the TPU-era flags set on the command line.

    errors: one line per value that asks for a TPU (`--use_tpu=true`, `--tpu=NAME`);
    ignored_names: the other TPU-era flags given on the command line, in definition order.
    """
    errors, ignored = [], []
    for name, _, _, _ in TPU_ERA_FLAGS:
        flag = flag_values[name]
        if not flag.present:
            continue
        if name == "use_tpu" and flag.value:
            errors.append("--use_tpu asks for a Cloud TPU, which this port does not run on; "
                          "drop it: training runs on a Gaudi HPU, a GPU or the CPU (--device)")
        elif name == "tpu" and flag.value:
            errors.append("--tpu=%s names a Cloud TPU, which this port does not run on; drop "
                          "--tpu (and --tpu_zone, --gcp_project): start several ranks with "
                          "demo_efficientdet.py --use_horovod N instead" % flag.value)
        else:
            ignored.append(name)
    return errors, ignored


def ignored_flags_warning(ignored_names):
    """The one warning line for ignored TPU-era flags, or None when there are none."""
    if not ignored_names:
        return None
    return ("ignoring TPU-era flags that have no effect here: %s"
            % ", ".join("--" + name for name in ignored_names))


def check_tpu_era_flags(flag_values=flags.FLAGS, warn=logging.warning):
    """For main.py: raises TpuFlagError (its error lines joined by '; ') when a flag asks for a
    TPU, else passes the one warning line about ignored TPU-era flags, if any, to `warn`."""
    errors, ignored = tpu_era_problems(flag_values)
    if errors:
        raise TpuFlagError("; ".join(errors))
    warning = ignored_flags_warning(ignored)
    if warning:
        warn(warning)
