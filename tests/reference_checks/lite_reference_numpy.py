"""An independent NumPy forward pass of EfficientNet-Lite over a lukemelas-named state dict.

Used by tests/reference_checks/lite_imagenet_check.py as the reference for the imported TensorFlow network. It
shares nothing with the project's network code or name mapping: it reads the state dict as
the PyTorch model holds it (conv weights [out, in, kh, kw], depthwise [C, 1, kh, kw], fc
[out, in]), derives the block layout from the tensors, and computes in float64 with
TensorFlow's 'same' padding (the weights come from TF Lite checkpoints):

  stem 3x3/2 conv -> BN -> ReLU6
  block: [1x1 expand -> BN -> ReLU6] -> kxk depthwise (stride) -> BN -> ReLU6 -> 1x1 project
         -> BN -> (+ input when stride 1 and channels in == out)
  head 1x1 conv -> BN -> ReLU6 -> global mean -> fc
BN: (x - running_mean) / sqrt(running_var + 1e-3) * weight + bias.
"""
import numpy as np

BN_EPSILON = 1e-3
# EfficientNet's seven stages stride 1, 2, 2, 2, 1, 2, 1 in their first block (Tan & Le,
# Table 1); a new stage starts where the project conv's output width changes.
STAGE_STRIDES = (1, 2, 2, 2, 1, 2, 1)


def _same_pad(x, kernel, stride):
    """x [H, W, C] padded as TF 'same': total max((ceil(n/s) - 1) * s + k - n, 0), the odd
    pixel at the bottom / right."""
    pads = []
    for size in x.shape[:2]:
        total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
        pads.append((total // 2, total - total // 2))
    return np.pad(x, pads + [(0, 0)])


def _shifted_windows(x, kernel, stride):
    """(i, j, x's 'same'-padded pixels under kernel tap (i, j) at every output position)."""
    padded = _same_pad(x, kernel, stride)
    out_h, out_w = -(-x.shape[0] // stride), -(-x.shape[1] // stride)
    for i in range(kernel):
        for j in range(kernel):
            yield i, j, padded[i:i + stride * out_h:stride, j:j + stride * out_w:stride]


def conv(x, weight, stride=1):
    """x [H, W, Cin], weight [Cout, Cin, k, k] -> [H', W', Cout]."""
    return sum(window @ weight[:, :, i, j].T
               for i, j, window in _shifted_windows(x, weight.shape[-1], stride))


def depthwise(x, weight, stride):
    """x [H, W, C], weight [C, 1, k, k] -> [H', W', C]."""
    return sum(window * weight[:, 0, i, j]
               for i, j, window in _shifted_windows(x, weight.shape[-1], stride))


def batch_norm(x, state, prefix):
    scale = state[prefix + '.weight'] / np.sqrt(state[prefix + '.running_var'] + BN_EPSILON)
    return (x - state[prefix + '.running_mean']) * scale + state[prefix + '.bias']


def relu6(x):
    return np.clip(x, 0.0, 6.0)


def block_strides(state):
    """[stride of block 0, 1, ...] from the project convs' output widths."""
    strides, stage, previous = [], -1, None
    index = 0
    while '_blocks.%d._project_conv.weight' % index in state:
        width = state['_blocks.%d._project_conv.weight' % index].shape[0]
        first = width != previous
        stage += int(first)
        strides.append(STAGE_STRIDES[stage] if first else 1)
        previous, index = width, index + 1
    return strides


def forward(state, image):
    """Logits [1000] of one normalised image [H, W, 3] ((x - 127) / 128)."""
    state = {name: np.asarray(value, np.float64) for name, value in state.items()}
    x = relu6(batch_norm(conv(np.asarray(image, np.float64), state['_conv_stem.weight'], 2),
                         state, '_bn0'))
    for index, stride in enumerate(block_strides(state)):
        prefix = '_blocks.%d.' % index
        inputs = x
        if prefix + '_expand_conv.weight' in state:
            x = relu6(batch_norm(conv(x, state[prefix + '_expand_conv.weight']), state,
                                 prefix + '_bn0'))
        x = relu6(batch_norm(depthwise(x, state[prefix + '_depthwise_conv.weight'], stride),
                             state, prefix + '_bn1'))
        x = batch_norm(conv(x, state[prefix + '_project_conv.weight']), state, prefix + '_bn2')
        if stride == 1 and inputs.shape == x.shape:
            x = x + inputs
    x = relu6(batch_norm(conv(x, state['_conv_head.weight']), state, '_bn1'))
    return state['_fc.weight'] @ x.mean(axis=(0, 1)) + state['_fc.bias']
