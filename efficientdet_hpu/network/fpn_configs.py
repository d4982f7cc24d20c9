"""BiFPN topology as data (Tan, Pang, Le, EfficientDet, CVPR 2020, Fig. 2d and Eq. 2).

Node ids count the cell's inputs first (0 .. L-1 for levels min..max), then every fused node
in creation order. For min_level=3, max_level=7 (L = 5):

    input        top-down        bottom-up (outputs)
    P7 (4) -------------------------> P7" (12)
      |                     ^
      v                     |
    P6 (3) ---> P6' (5) ----+-----> P6" (11)
      |           |         ^
      v           v         |
    P5 (2) ---> P5' (6) ----+-----> P5" (10)
      |           |         ^
      v           v         |
    P4 (1) ---> P4' (7) ----+-----> P4" (9)
                  |         ^
                  v         |
    P3 (0) -------------> P3" (8)

Top-down, from max_level-1 down to min_level, each node fuses the level's latest node with
the (upsampled) latest node of the level above. Bottom-up, from min_level+1 up to max_level,
each node fuses every node of its level so far (the input and, except at max_level, the
top-down node) with the (downsampled) latest node of the level below. So a cell has
2 * (L - 1) nodes, and each level's output is its last node.
"""
import collections

FpnNode = collections.namedtuple('FpnNode', ['level', 'inputs'])
FpnNode.__doc__ = 'A fused node: its pyramid level and the ids of the nodes it fuses.'


def bifpn_config(min_level, max_level):
    """Returns the BiFPN nodes for levels min_level..max_level, top-down then bottom-up.

    Returns:
      list of FpnNode(level: int, inputs: tuple of node ids); node i of the list has id
      (max_level - min_level + 1) + i.
    """
    if not 1 <= min_level < max_level:
        raise ValueError('BiFPN needs 1 <= min_level < max_level, got %d..%d'
                         % (min_level, max_level))
    num_levels = max_level - min_level + 1
    level_ids = {level: [level - min_level] for level in range(min_level, max_level + 1)}
    nodes = []

    def add(level, inputs):
        nodes.append(FpnNode(level, tuple(inputs)))
        level_ids[level].append(num_levels + len(nodes) - 1)

    for level in range(max_level - 1, min_level - 1, -1):
        add(level, [level_ids[level][-1], level_ids[level + 1][-1]])
    for level in range(min_level + 1, max_level + 1):
        add(level, level_ids[level] + [level_ids[level - 1][-1]])
    return nodes


def output_node_ids(nodes, min_level, max_level):
    """{level: id of the last node of that level}: the cell's outputs."""
    num_levels = max_level - min_level + 1
    outputs = {}
    for index, node in enumerate(nodes):
        outputs[node.level] = num_levels + index
    missing = sorted(set(range(min_level, max_level + 1)) - set(outputs))
    if missing:
        raise ValueError('FPN config has no node for levels %s' % missing)
    return outputs
