"""Which part of a training step a TF op belongs to, from its node name and op type.

Node names follow the variable and name scopes of our graph (efficientdet_arch.py,
backbone/, det_model_fn.py, losses.py); for example

    efficientnet-b0/blocks_3/depthwise_conv2d/depthwise             forward, backbone
    fpn_cells/cell_0/fnode2/op_after_combine5/conv/separable_conv2d  forward, BiFPN
    resample_p6/conv2d/Conv2D                                       forward, BiFPN (extra levels)
    class_net/class-0-bn-3/FusedBatchNormV3                         forward, class head
    logistic_loss_1/Log1p, Pow, mul_6, L2Loss_12                    forward, loss (top level)
    gradients/efficientnet-b0/blocks_1/IdentityN_grad/mul           backward, backbone
    gradients/logistic_loss/Log1p_grad/mul, gradients/Pow_grad/mul  backward, loss
    gradients/AddN_17                                               backward, unattributed
    cond/then/_6390/Momentum/update_box_net/.../ResourceApplyMomentum   optimizer + EMA
    global_norm/L2Loss_3, clip_by_global_norm/mul                   optimizer + EMA
    IteratorGetNext (op type) or any op on a tf.data thread         input pipeline

losses.py and the weight decay open no name scope, so the loss is what is left at the top
level: any op not under a scope listed here (the learning-rate schedule's few scalar ops land
there too; they take microseconds). Grappler's renames are undone first:
`ConstantFolding/<node>` and `ArithmeticOptimizer/<Stage>_<node>` are classified as <node>.
"""
import re

MODEL_PARTS = ('backbone', 'BiFPN', 'class head', 'box head', 'loss')
ALL_PARTS = tuple(('forward', part) for part in MODEL_PARTS) + tuple(
    ('backward', part) for part in MODEL_PARTS + ('unattributed',)) + (
    ('update', 'optimizer + EMA'), ('input', 'input pipeline'), ('other', 'other'))

# First scope component -> model part (variable scopes of efficientdet_arch / backbone).
_MODEL_SCOPES = (
    (re.compile(r'^efficientnet-[a-z0-9-]+$'), 'backbone'),
    (re.compile(r'^(fpn_cells|resample_p\d+)$'), 'BiFPN'),
    (re.compile(r'^class_net$'), 'class head'),
    (re.compile(r'^box_net$'), 'box head'),
)
# The optimizer step, gradient clipping and the EMA (det_model_fn._train_op). The update runs
# inside tf.cond, so most of it is named cond/then/_<n>/...
_UPDATE_SCOPES = re.compile(
    r'^(cond(_\d+)?|Momentum|Adam|ExponentialMovingAverage|global_norm|clip_by_global_norm)$')
# Estimator and summary plumbing, not part of the model.
_OTHER_SCOPES = re.compile(r'^(global_step|save|report_uninitialized_\w+|init(_\d+)?|train'
                           r'|Merge|summaries)$')
_GRAPPLER_PREFIX = re.compile(
    r'^((ConstantFolding|DependencyOptimizer|LayoutOptimizer|Remapper|MemoryOptimizer|'
    r'LoopOptimizer)/|ArithmeticOptimizer/[A-Za-z0-9]+_)')
_GRADIENT_SCOPE = re.compile(r'^gradients(_\d+)?/')
_INPUT_OP_TYPES = frozenset((
    'IteratorGetNext', 'IteratorGetNextSync', 'IteratorGetNextAsOptional', 'IteratorV2',
    'AnonymousIteratorV2', 'AnonymousIteratorV3', 'MakeIterator', 'OneShotIterator',
    'IteratorToStringHandle', 'IteratorFromStringHandleV2'))


def original_name(node_name):
    """The node name before grappler renamed it: 'ConstantFolding/gradients/x' -> 'gradients/x'."""
    previous = None
    while previous != node_name:
        previous, node_name = node_name, _GRAPPLER_PREFIX.sub('', node_name, count=1)
    return node_name


def _model_part(node_name):
    """The model part of a forward node name, 'loss' for a top-level op, else None."""
    scope = node_name.split('/', 1)[0] if '/' in node_name else ''
    for pattern, part in _MODEL_SCOPES:
        if pattern.match(scope):
            return part
    if _UPDATE_SCOPES.match(scope) or _OTHER_SCOPES.match(scope):
        return None
    return 'loss'


def classify(node_name, op_type, thread=''):
    """(group, part), one of ALL_PARTS, of one op.

    Args:
      node_name: graph node name without the ':OpType' suffix.
      op_type: e.g. 'Conv2D', '_MklNativeFusedConv2D'.
      thread: name of the trace line the op ran on (tf.data threads start 'tf_data').
    """
    if op_type in _INPUT_OP_TYPES or thread.startswith('tf_data'):
        return ('input', 'input pipeline')
    name = original_name(node_name)
    gradient = _GRADIENT_SCOPE.match(name)
    if gradient:
        rest = name[gradient.end():]
        if re.match(r'^AddN(_\d+)?(/|$)', rest):
            return ('backward', 'unattributed')  # sums a tensor's gradients from all its uses
        return ('backward', _model_part(rest) or 'unattributed')
    scope = name.split('/', 1)[0] if '/' in name else ''
    if _UPDATE_SCOPES.match(scope):
        return ('update', 'optimizer + EMA')
    if _OTHER_SCOPES.match(scope):
        return ('other', 'other')
    return ('forward', _model_part(name))
