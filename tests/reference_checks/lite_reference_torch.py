"""A PyTorch reference for tests/reference_checks/lite_imagenet_check.py: EfficientNet-Lite written in the style
of lukemelas EfficientNet-PyTorch (TF 'same' padding, ReLU6, no SE), loaded with torch.load.

torch is not a dependency of this project. Run this in a separate virtual environment:

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
    python tests/reference_checks/lite_imagenet_check.py --pth=$PTH --photos=... --save_inputs=/tmp/inputs.npz
    /tmp/torchvenv/bin/python tests/reference_checks/lite_reference_torch.py $PTH /tmp/inputs.npz /tmp/torch_logits.npz
    python tests/reference_checks/lite_imagenet_check.py --pth=$PTH --photos=... --reference_logits=/tmp/torch_logits.npz

It also checks that torch's own loader and this project's reader
(efficientdet_hpu/backbone/torch_legacy_reader.py, when importable) give identical tensors.
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

STAGE_STRIDES = (1, 2, 2, 2, 1, 2, 1)


def same_conv(x, weight, stride=1, groups=1):
    """NCHW conv with TensorFlow's 'same' padding (odd pixel bottom / right)."""
    kernel = weight.shape[-1]
    pads = []
    for size in (x.shape[3], x.shape[2]):  # F.pad takes the last dimension first.
        total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
        pads += [total // 2, total - total // 2]
    return F.conv2d(F.pad(x, pads), weight, stride=stride, groups=groups)


def bn(x, state, prefix):
    return F.batch_norm(x, state[prefix + '.running_mean'], state[prefix + '.running_var'],
                        state[prefix + '.weight'], state[prefix + '.bias'], False, 0.01, 1e-3)


def forward(state, images):
    """images [N, H, W, 3] normalised -> logits [N, 1000]."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    x = F.relu6(bn(same_conv(x, state['_conv_stem.weight'], 2), state, '_bn0'))
    index, stage, previous = 0, -1, None
    while '_blocks.%d._project_conv.weight' % index in state:
        prefix = '_blocks.%d.' % index
        width = state[prefix + '_project_conv.weight'].shape[0]
        stage += int(width != previous)
        stride = STAGE_STRIDES[stage] if width != previous else 1
        inputs = x
        if prefix + '_expand_conv.weight' in state:
            x = F.relu6(bn(same_conv(x, state[prefix + '_expand_conv.weight']), state,
                           prefix + '_bn0'))
        depthwise = state[prefix + '_depthwise_conv.weight']
        x = F.relu6(bn(same_conv(x, depthwise, stride, groups=depthwise.shape[0]), state,
                       prefix + '_bn1'))
        x = bn(same_conv(x, state[prefix + '_project_conv.weight']), state, prefix + '_bn2')
        if stride == 1 and inputs.shape == x.shape:
            x = x + inputs
        previous, index = width, index + 1
    x = F.relu6(bn(same_conv(x, state['_conv_head.weight']), state, '_bn1'))
    return F.linear(x.mean(dim=(2, 3)), state['_fc.weight'], state['_fc.bias'])


def main(pth, inputs_npz, output_npz):
    state = torch.load(pth, map_location='cpu')
    try:
        from efficientdet_hpu.backbone import torch_legacy_reader
        ours = torch_legacy_reader.read_state_dict(pth)
        same = all(np.array_equal(ours[k], v.numpy()) for k, v in state.items())
        print('reader matches torch.load on %d tensors: %s' % (len(state), same))
    except ImportError:
        pass
    inputs = np.load(inputs_npz)
    with torch.no_grad():
        logits = {name: forward(state, inputs[name][None])[0].numpy() for name in inputs.files}
    for name, value in logits.items():
        print(name, 'top5', np.argsort(-value)[:5].tolist())
    np.savez(output_npz, **logits)


if __name__ == '__main__':
    main(*sys.argv[1:4])
