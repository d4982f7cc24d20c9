import dataloader, tensorflow as tf
from test_dataloader import *
def test_mutant_flip(tmp_path, monkeypatch):
    orig = dataloader.flip_left_right
    monkeypatch.setattr(dataloader, 'flip_left_right', lambda im, b: (orig(im, b)[0], b))
    test_augmented_boxes_stay_on_their_object(tmp_path)
def test_mutant_offset(tmp_path, monkeypatch):
    orig = dataloader.boxes_to_network_pixels
    def bad(b, o, w):
        return orig(b, o, w._replace(crop_offset=w.crop_offset * 0))
    monkeypatch.setattr(dataloader, 'boxes_to_network_pixels', bad)
    test_augmented_boxes_stay_on_their_object(tmp_path)
