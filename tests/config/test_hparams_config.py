"""Config system: variants, overrides in order, type checks, errors and YAML round trip."""
import pytest

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config.hparams_config import ConfigError, get_efficientdet_config
from efficientdet_hpu.config.recipe import read_recipe


def test_variant_table_holds_the_published_scaling():
    d3 = get_efficientdet_config('efficientdet-d3')
    assert (d3.backbone_name, d3.image_size, d3.fpn_num_filters, d3.fpn_cell_repeats,
            d3.box_class_repeats) == ('efficientnet-b3', 896, 160, 6, 4)
    d7x = get_efficientdet_config('efficientdet-d7x')
    assert (d7x.backbone_name, d7x.max_level, d7x.anchor_scale, d7x.fpn_weight_method) == (
        'efficientnet-b7', 8, 4.0, 'sum')
    assert get_efficientdet_config('efficientdet-d7').anchor_scale == 5.0
    # Defaults shared by every variant.
    assert d3.nms_configs.max_output_size == 100 and d3.weight_decay == 4e-5


def test_lite_variants_are_automls():
    # automl's efficientdet_lite_param_dict: relu6, 'sum' fusion, (x - 127) / 128 inputs.
    lite = {name: get_efficientdet_config('efficientdet-' + name) for name in
            ('lite0', 'lite1', 'lite2', 'lite3', 'lite3x', 'lite4')}
    assert {n: (c.backbone_name, c.image_size, c.fpn_num_filters, c.fpn_cell_repeats,
                c.box_class_repeats, c.anchor_scale) for n, c in lite.items()} == {
        'lite0': ('efficientnet-lite0', 320, 64, 3, 3, 3.0),
        'lite1': ('efficientnet-lite1', 384, 88, 4, 3, 3.0),
        'lite2': ('efficientnet-lite2', 448, 112, 5, 3, 3.0),
        'lite3': ('efficientnet-lite3', 512, 160, 6, 4, 4.0),
        'lite3x': ('efficientnet-lite3', 640, 200, 6, 4, 3.0),
        'lite4': ('efficientnet-lite4', 640, 224, 7, 4, 4.0)}
    for config in lite.values():
        assert (config.act_type, config.fpn_weight_method, config.mean_rgb,
                config.stddev_rgb) == ('relu6', 'sum', [127.0] * 3, [128.0] * 3)
    d0 = get_efficientdet_config('efficientdet-d0')
    assert (d0.act_type, d0.mean_rgb[0]) == ('swish', 0.485 * 255)


def test_unknown_model_name_lists_valid_choices():
    with pytest.raises(ConfigError, match=r"efficientdet-d9.*efficientdet-d0.*efficientdet-lite4"):
        get_efficientdet_config('efficientdet-d9')


def test_string_overrides_with_nesting_lists_and_types():
    config = get_efficientdet_config('efficientdet-d0')
    config.override('num_classes=3,nms_configs.iou_thresh=0.6,aspect_ratios=[1.0,2.0],'
                    'image_size=640x384,learning_rate=1')
    assert config.num_classes == 3
    assert config.nms_configs.iou_thresh == 0.6
    assert config.aspect_ratios == [1.0, 2.0]
    assert config.image_size == '640x384'
    assert hparams_config.parse_image_size(config.image_size) == (384, 640)
    assert isinstance(config.learning_rate, float) and config.learning_rate == 1.0
    config.override('learning_rate=1e-3,weight_decay=4E-5')  # YAML 1.1 reads these as strings.
    assert (config.learning_rate, config.weight_decay) == (1e-3, 4e-5)
    config.override('aspect_ratios=1.0*0.5')  # automl's list syntax.
    assert config.aspect_ratios == [1.0, 0.5]


def test_yaml_then_string_applied_in_that_order(tmp_path):
    path = tmp_path / 'recipe.yaml'
    path.write_text('num_classes: 5\nimage_size: 256\nnms_configs:\n  method: gaussian\n')
    config = get_efficientdet_config('efficientdet-d0')
    config.override(str(path)).override('num_classes=7')
    assert (config.num_classes, config.image_size, config.nms_configs.method) == (7, 256, 'gaussian')


@pytest.mark.parametrize('text, message', [
    ('image_size=abc', 'image_size must be a positive integer'),
    ('num_classes=2.5', 'num_classes must be an integer'),
    ('separable_conv=maybe', 'separable_conv must be true or false'),
    ('learning_rate=fast', 'learning_rate must be a number'),
    ('optimizer=lamb', "optimizer='lamb' is not one of: sgd, adam"),
    ('num_clases=3', "unknown hparams key 'num_clases'. Did you mean: num_classes"),
    ('nms_configs.iou=0.3', "Valid keys of nms_configs: class_agnostic, clip_to_image, iou_thresh"),
    ('num_classes', 'not of the form key=value'),
])
def test_bad_overrides_are_errors_naming_the_key(text, message):
    config = get_efficientdet_config('efficientdet-d0')
    with pytest.raises(ConfigError) as error:
        config.override(text)
    assert message in str(error.value)


def test_a_recipe_name_that_is_not_there_is_named_with_the_closest_file(tmp_path):
    (tmp_path / 'demo.yaml').write_text('num_classes: 3\n')
    (tmp_path / 'notes.txt').write_text('num_classes: 3\n')
    typed = str(tmp_path / 'demo.yam')
    with pytest.raises(ConfigError) as error:
        read_recipe(typed + ',num_classes=4')
    assert str(error.value) == (
        '--hparams=%s: no file %s; did you mean --hparams=%s? (a recipe is a .yaml or .yml '
        'file; overrides are key=value)' % (typed, typed, tmp_path / 'demo.yaml'))
    assert read_recipe(str(tmp_path / 'demo.yaml') + ',num_classes=4').overrides == {
        'num_classes': 4}
    with pytest.raises(ConfigError, match='no folder nowhere '):
        read_recipe('nowhere/demo.yaml')
    with pytest.raises(ConfigError, match='a recipe file is YAML named .yaml or .yml'):
        read_recipe(str(tmp_path / 'notes.txt'))
    with pytest.raises(ConfigError, match="'num_classes' is not of the form key=value"):
        read_recipe('num_classes')  # No path in it: the entry is a malformed override.


def test_yaml_file_errors_are_clear(tmp_path):
    config = get_efficientdet_config('efficientdet-d0')
    with pytest.raises(ConfigError, match='cannot read hparams file'):
        config.override(str(tmp_path / 'missing.yaml'))
    bad = tmp_path / 'bad.yaml'
    bad.write_text('num_classes: [1, 2\n')
    with pytest.raises(ConfigError, match='not valid YAML'):
        config.override(str(bad))
    code = tmp_path / 'code.yaml'
    code.write_text("num_classes: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError, match='not valid YAML'):
        config.override(str(code))


def test_yaml_round_trip_is_exact():
    config = get_efficientdet_config('efficientdet-d2')
    config.override('image_size=640x384,aspect_ratios=[1.0,2.0,0.5],label_smoothing=0.1')
    text = config.to_yaml()
    assert hparams_config.Config.from_yaml(text) == config
    assert hparams_config.Config.from_yaml(text).to_yaml() == text


def test_validate_rejects_sizes_not_divisible_by_the_coarsest_stride():
    config = get_efficientdet_config('efficientdet-d0')
    config.override('image_size=500')
    with pytest.raises(ConfigError, match=r'divisible by 2\^min\(max_level, 5\) = 32.*512x512'):
        hparams_config.validate(config)
    config.override('image_size=640x384')
    hparams_config.validate(config)
    config.override('image_size=320')  # EfficientDet-Lite0's: levels 6 and 7 round up.
    hparams_config.validate(config)


# Reference key names and google/automl's config.yaml (config/automl_config.py).

from efficientdet_hpu.config import automl_config  # noqa: E402
from efficientdet_hpu.config import recipe  # noqa: E402

AUTOML_CONFIG = '''\
name: efficientdet-d1
backbone_name: efficientnet-b1
image_size: !!python/tuple
- 384
- 640
num_classes: 90
is_training_bn: true
strategy: null
fpn_num_filters: 88
fpn_cell_repeats: 4
fpn_weight_method: null
fpn_name: null
iou_loss_type: null
survival_prob: null
optimizer: lars
mixed_precision: false
nms_configs:
    method: hard
    iou_thresh: null
    score_thresh: 0.0
    sigma: null
    pyfunc: true
    max_nms_inputs: 0
    max_output_size: 100
'''


def test_reference_aliases_are_translated():
    config = get_efficientdet_config('efficientdet-d0')
    config.override({'use_bfloat16': True, 'nms_configs': {'method': None, 'iou_thresh': None,
                                                           'sigma': None, 'pyfunc': True}})
    assert config.mixed_precision is True
    assert config.nms_configs.as_dict()['method'] == 'hard'
    assert (config.nms_configs.iou_thresh, config.nms_configs.sigma) == (0.5, 0.5)
    config.override("nms_configs.method=''")
    assert config.nms_configs.method == 'hard'
    with pytest.raises(automl_config.AutomlConfigError, match='NumPy NMS'):
        config.override('nms_configs.method=linear')


def test_survival_prob_is_automls_head_drop_connect_and_backbones_is_separate():
    config = get_efficientdet_config('efficientdet-d3')
    assert config.survival_prob is None and config.backbone_survival_prob is None
    config.override('survival_prob=0.8,backbone_survival_prob=0.5')
    assert (config.survival_prob, config.backbone_survival_prob) == (0.8, 0.5)
    config.override({'survival_prob': None})
    assert config.survival_prob is None
    with pytest.raises(ConfigError, match=r'survival_prob must be null or 0 \(off\) or a keep'):
        config.override('survival_prob=1.5')


def test_automl_config_yaml_is_read_safely_and_mapped(tmp_path):
    path = tmp_path / 'config.yaml'
    path.write_text(AUTOML_CONFIG)
    config = recipe.read_saved_config(str(path))
    assert (config.name, config.backbone_name, config.fpn_num_filters) == (
        'efficientdet-d1', 'efficientnet-b1', 88)
    assert config.image_size == '640x384'  # automl's (height, width) tuple.
    assert (config.fpn_weight_method, config.iou_loss_type, config.optimizer) == (
        'fastattn', 'none', 'sgd')  # automl's fallbacks; 'lars' is not offered: default kept.
    # automl's nms() fallbacks for hard NMS; its eval path: per class, not clipped.
    assert config.nms_configs.as_dict() == dict(
        method='hard', iou_thresh=0.5, score_thresh=0.0, sigma=0.5, max_nms_inputs=0,
        max_output_size=100, class_agnostic=False, clip_to_image=False)


def test_automl_yaml_runs_no_code_and_unsupported_networks_are_errors(tmp_path):
    marker = tmp_path / 'ran'
    path = tmp_path / 'config.yaml'
    path.write_text('is_training_bn: !!python/object/apply:os.system ["touch %s"]\n' % marker)
    with pytest.raises(automl_config.AutomlConfigError, match='read safely'):
        recipe.read_saved_config(str(path))
    assert not marker.exists()
    path.write_text(AUTOML_CONFIG.replace('fpn_name: null', 'fpn_name: panfpn'))
    with pytest.raises(automl_config.AutomlConfigError, match="fpn_name='panfpn'"):
        recipe.read_saved_config(str(path))


def test_own_config_yaml_of_before_survival_prob_meant_the_heads(tmp_path):
    config = get_efficientdet_config('efficientdet-d0')
    values = config.as_dict()
    del values['backbone_survival_prob'], values['nms_configs']['class_agnostic']
    values['survival_prob'] = 1.0  # The backbone's, in files written before.
    path = tmp_path / 'config.yaml'
    path.write_text(hparams_config.Config(values).to_yaml())
    loaded = recipe.read_saved_config(str(path))
    assert (loaded.survival_prob, loaded.backbone_survival_prob) == (None, 1.0)
    assert loaded.nms_configs.class_agnostic is False  # Keys added since: their defaults.
