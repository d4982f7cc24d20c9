"""The review's page opened in a real headless browser (Debian's chromium, which
tools/setup_env.sh installs for the test set): the DOM it renders holds the first card of each
kind with its reason and score, and the screenshot shows the crops' green label and red model
boxes. The page is the one review_cases.fake_review writes (the real last stage)."""
import os
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

import review_cases
from cli_runs import run_process

CHROMIUM_FLAGS = ('--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
                  '--no-first-run', '--disable-background-networking',
                  '--disable-component-update', '--disable-sync')


def chromium():
    path = shutil.which('chromium') or shutil.which('chromium-browser')
    if path is None:
        pytest.fail('chromium is not installed: the page test needs a real browser; install '
                    'it with `apt-get install -y chromium` (tools/setup_env.sh does it)')
    return path


def browse(page, tmp_path, *args):
    """chromium on `page` with `args`; its output (the DOM for --dump-dom)."""
    result = run_process([chromium(), *CHROMIUM_FLAGS, '--user-data-dir=%s' % (
        tmp_path / 'profile'), *args, 'file://%s' % page], 120,
        stderr=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-2000:]
    return result.stdout


@pytest.fixture(scope='module')
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp('page')
    folder = review_cases.make_coco(str(root / 'data'))
    summary, layout, _, _ = review_cases.fake_review(folder, str(root / 'out'))
    return layout.page, summary


def test_the_dom_holds_the_first_card_of_each_kind(page, tmp_path):
    path, summary = page
    dom = browse(path, tmp_path, '--dump-dom')
    assert '<figure class="card" id="overlooked-1">' in dom
    first = dom[dom.index('id="overlooked-1"'):]
    first = first[:first.index('</figure>')]
    assert 'no label covers it; the model says blue' in first and 'photo3.jpg' in first
    assert 'src="crops/overlooked-001.png"' in first
    for kind in ('swap', 'badloc', 'image'):
        assert 'id="%s"' % kind in dom and 'id="%s-' % kind in dom, kind
    assert 'labelled red; the model says blue' in dom
    assert summary['cards'] == dom.count('<figure class="card"')


def test_the_screenshot_shows_the_label_and_the_model_boxes(page, tmp_path):
    path, _ = page
    shot = tmp_path / 'page.png'
    browse(path, tmp_path, '--screenshot=%s' % shot, '--window-size=1200,900')
    pixels = np.asarray(Image.open(shot).convert('RGB')).astype(int)
    green = (abs(pixels - (0, 200, 0)).sum(axis=2) < 40).sum()
    red = (abs(pixels - (230, 0, 0)).sum(axis=2) < 40).sum()
    # The key's two squares are 14 x 14 px each; the crops' boxes, 3 px wide, add far more.
    assert green > 1000 and red > 1000, (green, red)
    assert os.path.getsize(shot) > 10000
