"""Tile geometry and the sliver rule, worked by hand (data/tiling.py)."""
import numpy as np
import pytest

from efficientdet_hpu.data import tiling
from efficientdet_hpu.data.tiling import Window


def test_axis_starts_by_hand():
    # 400 px tiles, 100 px overlap: a stride of 300.
    assert tiling.axis_starts(1000, 400, 100) == [0, 300, 600]       # 600 + 400 = 1000 exactly
    assert tiling.axis_starts(1100, 400, 100) == [0, 300, 600, 700]  # one more, flush right
    assert tiling.axis_starts(300, 400, 100) == [0]                  # shorter than a tile
    assert tiling.axis_starts(400, 400, 0) == [0]
    assert tiling.axis_starts(801, 400, 0) == [0, 400, 401]
    with pytest.raises(ValueError, match='overlap < tile'):
        tiling.axis_starts(1000, 400, 400)


def test_windows_cover_the_photo_row_by_row():
    windows = tiling.tile_windows(300, 1100, 400, 100)
    assert windows == [Window(0, 0, 300, 400), Window(0, 300, 300, 700),
                       Window(0, 600, 300, 1000), Window(0, 700, 300, 1100)]


# The 300 x 1100 photo above; boxes [ymin, xmin, ymax, xmax] in photo pixels.
ON_SEAM = [100, 350, 140, 390]        # inside the 300..400 overlap of tiles 0 and 1
ACROSS_SEAM = [10, 380, 50, 440]      # 60 wide: 20 px (1/3) in tile 0, whole in tile 1
MOSTLY_IN = [200, 370, 220, 410]      # 40 wide: 30 px (3/4) in tile 0, whole in tile 1
ON_EDGE = [280, 1050, 300, 1100]      # touches the photo's right and bottom edges
THIN = [250, 100, 251.5, 180]         # 1.5 px tall: a sliver wherever it is
BOXES = np.array([ON_SEAM, ACROSS_SEAM, MOSTLY_IN, ON_EDGE, THIN], np.float64)


def test_sliver_rule_on_a_seam_an_edge_and_a_thin_box():
    windows = tiling.tile_windows(300, 1100, 400, 100)
    kept = [tiling.boxes_in_tile(BOXES, window) for window in windows]
    # Tile 0 (x 0..400): the seam box whole, MOSTLY_IN clipped at x = 400, ACROSS_SEAM (1/3
    # visible) and THIN (1.5 px) left out.
    np.testing.assert_array_equal(kept[0][1], [0, 2])
    np.testing.assert_array_equal(kept[0][0], [[100, 350, 140, 390], [200, 370, 220, 400]])
    # Tile 1 (x 300..700): the first three whole, shifted by its origin x0 = 300.
    np.testing.assert_array_equal(kept[1][1], [0, 1, 2])
    np.testing.assert_array_equal(kept[1][0], [[100, 50, 140, 90], [10, 80, 50, 140],
                                               [200, 70, 220, 110]])
    # Tile 2 (x 600..1000) holds nothing; tile 3 (x 700..1100) the edge box, at x 350..400.
    assert kept[2][1].size == 0 and kept[2][0].shape == (0, 4)
    np.testing.assert_array_equal(kept[3][1], [3])
    np.testing.assert_array_equal(kept[3][0], [[280, 350, 300, 400]])


def test_min_visible_is_inclusive_and_settable():
    window = Window(0, 0, 300, 400)
    half = np.array([[0, 380, 10, 420]], np.float64)  # exactly half inside
    assert tiling.boxes_in_tile(half, window)[1].tolist() == [0]
    assert tiling.boxes_in_tile(half, window, min_visible=0.51)[1].tolist() == []
    assert tiling.boxes_in_tile(BOXES, window, min_visible=0.3)[1].tolist() == [0, 1, 2]


def test_tile_boxes_map_back_to_the_photo():
    window = Window(0, 300, 300, 700)
    boxes, indices = tiling.boxes_in_tile(BOXES, window)
    np.testing.assert_array_equal(tiling.to_photo(boxes, window), BOXES[indices])
