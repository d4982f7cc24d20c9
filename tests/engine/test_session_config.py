"""engine/setup.py's session_config: the grappler passes left out per device (each new fetch of
a session runs the rest again, so a pass that changes nothing costs every start-up)."""
import pytest

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.engine import setup


def test_cpu_leaves_out_the_passes_that_change_nothing_there():
    rewrite = setup.session_config('CPU').graph_options.rewrite_options
    assert rewrite.layout_optimizer == rewrite.OFF
    assert rewrite.memory_optimization == rewrite.NO_MEM_OPT
    assert rewrite.disable_tfg_optimizer


def test_gpu_keeps_the_layout_and_memory_passes_and_hpu_every_pass():
    gpu = setup.session_config('GPU').graph_options.rewrite_options
    assert gpu.layout_optimizer == gpu.DEFAULT
    assert gpu.memory_optimization == gpu.DEFAULT_MEM_OPT
    hpu = setup.session_config('HPU').graph_options.rewrite_options
    assert (hpu.layout_optimizer, hpu.memory_optimization, hpu.disable_tfg_optimizer) == (
        hpu.DEFAULT, hpu.DEFAULT_MEM_OPT, False)


def test_efficientdet_grappler_off_turns_every_pass_off_and_a_bad_value_is_one_line(monkeypatch):
    monkeypatch.setenv(setup.GRAPPLER_ENV, 'off')
    assert setup.session_config('CPU').graph_options.rewrite_options.disable_meta_optimizer
    monkeypatch.setenv(setup.GRAPPLER_ENV, 'on')
    assert not setup.session_config('CPU').graph_options.rewrite_options.disable_meta_optimizer
    monkeypatch.delenv(setup.GRAPPLER_ENV)
    assert not setup.session_config('GPU').graph_options.rewrite_options.disable_meta_optimizer
    monkeypatch.setenv(setup.GRAPPLER_ENV, 'maybe')
    with pytest.raises(UserError, match='EFFICIENTDET_GRAPPLER=maybe: set it to on or off'):
        setup.session_config('CPU')
