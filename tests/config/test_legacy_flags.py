"""config/legacy_flags.py: --use_horovod as Habana and this port spell it, TPU-era flags.

Every test parses into a FlagValues of its own, never the global FLAGS.
"""

import subprocess
import sys

import pytest
from absl import flags

from cli_runs import run_process
from efficientdet_hpu.config import legacy_flags
from efficientdet_hpu.core import errors

PROGRAM = "main.py"


def horovod_flags():
    flag_values = flags.FlagValues()
    legacy_flags.define_use_horovod_flag(flag_values)
    flags.DEFINE_string("mode", "train", "", flag_values=flag_values)
    return flag_values


def parse(flag_values, *args):
    """Parses like main.py: fold, then absl; returns the positional arguments left over."""
    return flag_values(legacy_flags.fold_use_horovod_value([PROGRAM, *args]))[1:]


@pytest.mark.parametrize("args, expected", [
    ([], None),
    (["--use_horovod"], True), (["-use_horovod"], True), (["--nouse_horovod"], False),
    (["--use_horovod=true"], True), (["--use_horovod=True"], True), (["--use_horovod=t"], True),
    (["--use_horovod=1"], True), (["--use_horovod=false"], False), (["--use_horovod=0"], False),
    (["--use_horovod=8"], 8), (["--use_horovod", "8"], 8), (["-use_horovod", "2"], 2),
    (["--use_horovod", "false"], False), (["--use_horovod", "TRUE"], True),
    (["--use_horovod", "--mode=eval"], True),   # alone before another flag
    (["--mode=eval", "--use_horovod"], True),   # alone at the end
    (["--use_horovod", "8", "--nouse_horovod"], False),  # the last one wins, as in absl
])
def test_use_horovod_spellings(args, expected):
    flag_values = horovod_flags()
    assert parse(flag_values, *args) == []
    assert flag_values.use_horovod == expected
    assert type(flag_values.use_horovod) is type(expected)  # 8 is an int, true is True


def test_the_mode_after_a_bare_use_horovod_is_still_parsed():
    flag_values = horovod_flags()
    parse(flag_values, "--use_horovod", "--mode=eval")
    assert flag_values.mode == "eval"


@pytest.mark.parametrize("value", ["eight", "-1", "2.5", ""])
def test_use_horovod_rejects_what_is_neither_switch_nor_count(value):
    with pytest.raises(flags.IllegalFlagValueError, match="rank count such as 8"):
        parse(horovod_flags(), "--use_horovod=" + value)


def test_a_word_after_use_horovod_that_is_no_value_stays_positional():
    # Not joined: main.py then reports it as an unexpected argument instead of guessing.
    assert parse(horovod_flags(), "--use_horovod", "eight") == ["eight"]


@pytest.mark.parametrize("argv, expected", [
    (["p", "--use_horovod", "8", "--x"], ["p", "--use_horovod=8", "--x"]),
    (["p", "--x", "--use_horovod", "1"], ["p", "--x", "--use_horovod=1"]),
    (["p", "--use_horovod", "--", "--use_horovod", "8"],
     ["p", "--use_horovod", "--", "--use_horovod", "8"]),
    (["--use_horovod", "8"], ["--use_horovod", "8"]),  # argv[0] is the program, never a flag
    (["p", "--use_horovod=4", "8"], ["p", "--use_horovod=4", "8"]),
    (["p", "--nouse_horovod", "8"], ["p", "--nouse_horovod", "8"]),
    (["p", "--use_horovodx", "8"], ["p", "--use_horovodx", "8"]),
])
def test_fold_joins_only_a_separate_value_of_use_horovod(argv, expected):
    assert legacy_flags.fold_use_horovod_value(argv) == expected


def test_serialized_values_parse_back_to_the_same_value():
    for args in (["--use_horovod", "8"], ["--use_horovod"], ["--nouse_horovod"]):
        flag_values = horovod_flags()
        parse(flag_values, *args)
        text = flag_values["use_horovod"].serialize()
        again = horovod_flags()
        parse(again, text)
        assert again.use_horovod == flag_values.use_horovod, text


@pytest.mark.parametrize("value, switch", [(None, None), (True, True), (False, False), (8, True)])
def test_horovod_switch(value, switch):
    assert legacy_flags.horovod_switch(value) is switch


@pytest.mark.parametrize("value, world, per_box", [
    (None, 2, None), (True, 1, None), (False, 2, None), (2, 2, None), (1, 1, None),
    (8, 16, 8),  # Habana's count is per box: two boxes of 8
    (16, 16, 8),
])
def test_world_size_agrees(value, world, per_box):
    legacy_flags.check_world_size(value, world, ranks_per_box=per_box)


@pytest.mark.parametrize("value, world, per_box, message", [
    (8, 2, 2, "--use_horovod 8 disagrees with the 2 ranks mpirun started; pass --use_horovod 2"),
    (4, 16, 8, "--use_horovod 4 disagrees with the 16 ranks mpirun started, 8 on this box; "
               "pass --use_horovod 8"),
    (8, 1, None, "--use_horovod 8 asks for 8 ranks but this process is the only one"),
])
def test_world_size_disagreement_names_both_numbers(value, world, per_box, message):
    with pytest.raises(legacy_flags.WorldSizeError) as raised:
        legacy_flags.check_world_size(value, world, ranks_per_box=per_box)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, errors.UserError)
    assert message in str(raised.value)


# ---------------------------------------------------------------- TPU-era flags


def tpu_flags():
    flag_values = flags.FlagValues()
    legacy_flags.define_tpu_era_flags(flag_values)
    return flag_values


def test_tpu_era_flags_have_the_ports_types_and_defaults():
    flag_values = tpu_flags()
    flag_values([PROGRAM])
    defaults = {name: flag_values[name].value for name, *_ in legacy_flags.TPU_ERA_FLAGS}
    assert defaults == {"use_tpu": False, "tpu": None, "tpu_zone": None, "gcp_project": None,
                        "eval_master": "", "num_cores": 8, "num_cores_per_replica": 8,
                        "use_spatial_partition": False, "input_partition_dims": [1, 4, 2, 1],
                        "sbs_test": False}
    flag_values([PROGRAM, "--num_cores=32", "--input_partition_dims=1",
                 "--input_partition_dims=2", "--nouse_spatial_partition"])
    assert flag_values.num_cores == 32 and flag_values.input_partition_dims == [1, 2]
    with pytest.raises(flags.IllegalFlagValueError):
        flag_values([PROGRAM, "--num_cores=eight"])


def test_no_tpu_era_flag_given_means_no_problem():
    flag_values = tpu_flags()
    flag_values([PROGRAM])
    assert legacy_flags.tpu_era_problems(flag_values) == ([], [])
    assert legacy_flags.ignored_flags_warning([]) is None


def test_flags_asking_for_a_tpu_are_errors_and_the_rest_are_ignored():
    flag_values = tpu_flags()
    flag_values([PROGRAM, "--sbs_test", "--use_tpu", "--tpu=my-tpu", "--num_cores", "8",
                 "--eval_master=", "--tpu_zone=us-central1-b"])
    errors, ignored = legacy_flags.tpu_era_problems(flag_values)
    assert len(errors) == 2
    assert errors[0].startswith("--use_tpu asks for a Cloud TPU")
    assert errors[1].startswith("--tpu=my-tpu names a Cloud TPU")
    assert all("\n" not in line and "drop" in line for line in errors)
    # Given on the command line, even at their default value: listed, in definition order.
    assert ignored == ["tpu_zone", "eval_master", "num_cores", "sbs_test"]
    assert legacy_flags.ignored_flags_warning(ignored) == (
        "ignoring TPU-era flags that have no effect here: --tpu_zone, --eval_master, "
        "--num_cores, --sbs_test")


@pytest.mark.parametrize("args", [["--use_tpu=false"], ["--nouse_tpu"], ["--tpu="]])
def test_values_that_ask_for_no_tpu_are_only_ignored(args):
    flag_values = tpu_flags()
    flag_values([PROGRAM, *args])
    errors, ignored = legacy_flags.tpu_era_problems(flag_values)
    assert errors == [] and len(ignored) == 1


def test_module_imports_no_tensorflow():
    code = ("import sys; from efficientdet_hpu.config import legacy_flags; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))")
    result = run_process([sys.executable, "-c", code], timeout=60, stderr=subprocess.PIPE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_check_tpu_era_flags_raises_one_user_error_or_warns_once():
    flag_values = tpu_flags()
    flag_values([PROGRAM, "--use_tpu", "--tpu=my-tpu"])
    with pytest.raises(legacy_flags.TpuFlagError) as raised:
        legacy_flags.check_tpu_era_flags(flag_values, warn=pytest.fail)
    assert isinstance(raised.value, errors.UserError)
    assert str(raised.value).count("Cloud TPU") == 2 and "\n" not in str(raised.value)
    warnings = []
    flag_values = tpu_flags()
    flag_values([PROGRAM, "--num_cores=8", "--sbs_test"])
    legacy_flags.check_tpu_era_flags(flag_values, warn=warnings.append)
    assert warnings == ["ignoring TPU-era flags that have no effect here: --num_cores, "
                        "--sbs_test"]
    legacy_flags.check_tpu_era_flags(tpu_flags(), warn=pytest.fail)  # unparsed: nothing set
