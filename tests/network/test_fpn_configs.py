"""BiFPN topology data, checked against the node table worked out from the paper's Fig. 2d."""
import pytest

from efficientdet_hpu.network import fpn_configs
from efficientdet_hpu.network.fpn_configs import FpnNode


def test_p3_p7_table_by_hand():
    # Inputs P3..P7 are ids 0..4; new nodes are 5, 6, ...
    assert fpn_configs.bifpn_config(3, 7) == [
        FpnNode(6, (3, 4)),       # 5: P6' = P6 + up(P7)
        FpnNode(5, (2, 5)),       # 6: P5' = P5 + up(P6')
        FpnNode(4, (1, 6)),       # 7: P4' = P4 + up(P5')
        FpnNode(3, (0, 7)),       # 8: P3" = P3 + up(P4')          (output)
        FpnNode(4, (1, 7, 8)),    # 9: P4" = P4 + P4' + down(P3")   (output)
        FpnNode(5, (2, 6, 9)),    # 10: P5" = P5 + P5' + down(P4")  (output)
        FpnNode(6, (3, 5, 10)),   # 11: P6" = P6 + P6' + down(P5")  (output)
        FpnNode(7, (4, 11)),      # 12: P7" = P7 + down(P6")        (output)
    ]
    assert fpn_configs.output_node_ids(fpn_configs.bifpn_config(3, 7), 3, 7) == {
        3: 8, 4: 9, 5: 10, 6: 11, 7: 12}


def test_p3_p8_for_d7x():
    nodes = fpn_configs.bifpn_config(3, 8)
    assert len(nodes) == 10
    assert nodes[0] == FpnNode(7, (4, 5))       # P7' = P7 + up(P8)
    assert nodes[4] == FpnNode(3, (0, 9))       # P3" closes the top-down path
    assert nodes[-1] == FpnNode(8, (5, 14))     # P8" = P8 + down(P7")
    assert fpn_configs.output_node_ids(nodes, 3, 8) == {
        3: 10, 4: 11, 5: 12, 6: 13, 7: 14, 8: 15}


@pytest.mark.parametrize('min_level,max_level', [(3, 4), (3, 5), (2, 6), (3, 7), (3, 8)])
def test_structure_for_any_level_range(min_level, max_level):
    nodes = fpn_configs.bifpn_config(min_level, max_level)
    num_levels = max_level - min_level + 1
    assert len(nodes) == 2 * (num_levels - 1)
    top_down, bottom_up = nodes[:num_levels - 1], nodes[num_levels - 1:]
    assert [n.level for n in top_down] == list(range(max_level - 1, min_level - 1, -1))
    assert [n.level for n in bottom_up] == list(range(min_level + 1, max_level + 1))
    level_of = {i: min_level + i for i in range(num_levels)}
    for index, node in enumerate(nodes):
        node_id = num_levels + index
        level_of[node_id] = node.level
        assert all(i < node_id for i in node.inputs)          # inputs already exist
        assert node.inputs[0] == node.level - min_level       # every node keeps its input
        neighbours = [level_of[i] for i in node.inputs if level_of[i] != node.level]
        assert len(neighbours) == 1 and abs(neighbours[0] - node.level) == 1
    # Middle bottom-up nodes fuse three inputs, the ends two.
    assert [len(n.inputs) for n in bottom_up] == [3] * (num_levels - 2) + [2]
    outputs = fpn_configs.output_node_ids(nodes, min_level, max_level)
    assert sorted(outputs) == list(range(min_level, max_level + 1))
    assert outputs[max_level] == num_levels + len(nodes) - 1


def test_single_level_is_rejected():
    with pytest.raises(ValueError, match='min_level < max_level'):
        fpn_configs.bifpn_config(3, 3)
