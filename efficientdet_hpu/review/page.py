"""The page a person reviews the issues on: review/index.html, static (opens from the disk in
any browser, nothing to serve), one section per kind, the worst first, each issue a card: a
crop of the photo around it with the label's box in green and the model's in red, what is
suspected, cleanlab's score, the photo and the label's id.
"""
import html
import os
import shutil

from PIL import Image, ImageDraw

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.data import image_codec
from efficientdet_hpu.review import issues as issues_lib
from efficientdet_hpu.review import scores as scores_lib

LABEL_COLOUR = (0, 200, 0)
PREDICTION_COLOUR = (230, 0, 0)
CROP_SIDE = 256  # px: the long side of a crop as shown (small boxes are enlarged, up to 8x).
MAX_ZOOM = 8.0
LINE = 3  # px
MAX_CARDS = 50  # Per kind: the page is for a person's first hour; issues.csv has them all.
TITLES = {'overlooked': 'Overlooked: an object the model sees that no label covers',
          'swap': 'Swapped class: the label\'s class differs from what the model sees there',
          'badloc': 'Bad location: the label\'s box is off the object the model finds',
          'image': 'Photos by label quality: the labels of the whole photo'}


def crop_window(boxes, width, height):
    """(x0, y0, x1, y1) of the photo around `boxes` ([x1, y1, x2, y2]), a margin of half the
    boxes' extent (at least 16 px) on each side, within the photo."""
    left = min(b[0] for b in boxes)
    top = min(b[1] for b in boxes)
    right = max(b[2] for b in boxes)
    bottom = max(b[3] for b in boxes)
    margin = max(16.0, 0.5 * max(right - left, bottom - top))
    return (int(max(0, left - margin)), int(max(0, top - margin)),
            int(min(width, right + margin + 1)), int(min(height, bottom + margin + 1)))


def draw_crop(photo, window, green, red, path):
    """Writes the crop of `photo` (PIL RGB) in `window`, scaled to CROP_SIDE, with the boxes
    `green` and `red` ([x1, y1, x2, y2] photo pixels)."""
    x0, y0, x1, y1 = window
    scale = min(MAX_ZOOM, CROP_SIDE / float(max(1, x1 - x0, y1 - y0)))
    crop = photo.crop(window).resize((max(1, round((x1 - x0) * scale)),
                                      max(1, round((y1 - y0) * scale))))
    draw = ImageDraw.Draw(crop)
    # The model's box just outside its place and the label's on it: where the two boxes
    # coincide (a swap) both lines show.
    for boxes, colour, grow in ((red, PREDICTION_COLOUR, LINE), (green, LABEL_COLOUR, 0)):
        for box in boxes:
            draw.rectangle([(box[0] - x0) * scale - grow, (box[1] - y0) * scale - grow,
                            (box[2] - x0) * scale + grow, (box[3] - y0) * scale + grow],
                           outline=colour, width=LINE)
    with atomic_file.replacing(path, suffix='.png') as temporary:
        crop.save(temporary)


def _boxes(issue, photo, confident):
    """(green boxes, red boxes) of a card: the label and the model's box it is compared with;
    an overlooked card also shows the labels near it, a photo card all labels and the
    confident predictions."""
    labels = [scores_lib.xyxy(a['bbox']) for a in photo['annotations']]
    if issue.kind == 'image':
        return labels, confident
    if issue.kind == 'overlooked':
        return labels, [issue.box]
    return [issue.box], [issue.suggested_box] if issue.suggested_box else []


def reason(issue) -> str:
    if issue.kind == 'overlooked':
        # Class names are the user's ("ellipse", "SUV"): no article before them.
        return 'no label covers it; the model says %s' % issue.class_name
    if issue.kind == 'swap':
        return 'labelled %s; the model says %s' % (issue.class_name,
                                                    issue.suggested_class or 'another class')
    if issue.kind == 'badloc':
        if not issue.suggested_box:
            return 'the %s box matches no prediction of its class' % issue.class_name
        iou = scores_lib.iou_matrix([issue.box], [issue.suggested_box])[0, 0]
        return 'the %s box overlaps the model\'s by IoU %.2f' % (issue.class_name, iou)
    return 'the label quality of the whole photo'


def write_crops(issues, photos, confident, directory):
    """Crops of the cards (MAX_CARDS of each kind, worst first): [(issue, file name)]."""
    shown = []
    per_kind = {kind: 0 for kind in issues_lib.KINDS}
    opened = {}
    shutil.rmtree(directory, ignore_errors=True)  # A rerun at another threshold: its own.
    os.makedirs(directory)
    for issue in issues:
        if per_kind[issue.kind] >= MAX_CARDS:
            continue
        per_kind[issue.kind] += 1
        photo = photos[issue.photo]
        if issue.photo not in opened:
            opened.clear()  # Issues of one photo mostly follow each other: keep one open.
            with Image.open(os.path.join(photo['image_dir'], photo['file_name'])) as image:
                image.load()
                opened[issue.photo] = image_codec.to_rgb(image).copy()
        green, red = _boxes(issue, photo, confident[issue.photo])
        window = crop_window([issue.box] + red, photo['width'], photo['height'])
        name = '%s-%03d.png' % (issue.kind, per_kind[issue.kind])
        draw_crop(opened[issue.photo], window, green, red, os.path.join(directory, name))
        shown.append((issue, name))
    return shown


def _card(position, rank, issue, photo, name, crops_name):
    """A card; its id is the kind and its place in the kind's section (1: the worst)."""
    label = ('label %s' % html.escape(issue.label_id)) if issue.label_id else ''
    return ('<figure class="card" id="%s-%d"><img src="%s/%s" alt="%s">'
            '<figcaption><b>%s</b><br>score <span class="score">%.3g</span> &middot; rank %d'
            '<br>%s %s</figcaption></figure>' % (
                issue.kind, position, crops_name, name, html.escape(reason(issue)),
                html.escape(reason(issue)), issue.score, rank,
                html.escape(photo['name']), label))


STYLE = ('body{font-family:sans-serif;margin:16px;background:#fafafa}'
         '.cards{display:flex;flex-wrap:wrap;gap:12px}'
         '.card{margin:0;width:270px;background:#fff;border:1px solid #ccc;padding:6px}'
         '.card img{display:block;max-width:256px;max-height:256px}'
         'figcaption{font-size:13px;margin-top:4px}'
         '.key span{display:inline-block;width:14px;height:14px;vertical-align:middle}')


def html_page(shown, issues, photos, counts, crops_name, title) -> str:
    ranks = {id(issue): rank for rank, issue in enumerate(issues, start=1)}
    parts = ['<!DOCTYPE html><html><head><meta charset="utf-8"><title>%s</title>'
             '<style>%s</style></head><body><h1>%s</h1>' % (html.escape(title), STYLE,
                                                             html.escape(title)),
             '<p class="key"><span style="background:#00c800"></span> the label &nbsp; '
             '<span style="background:#e60000"></span> the model (a fold that never trained '
             'on the photo) &nbsp; score: cleanlab\'s, 0 = surely wrong, 1 = fine; all '
             'issues in issues.csv</p>']
    for kind in issues_lib.KINDS:
        cards = [(issue, name) for issue, name in shown if issue.kind == kind]
        parts.append('<section id="%s"><h2>%s (%d)</h2><div class="cards">' % (
            kind, html.escape(TITLES[kind]), counts[kind]))
        parts += [_card(position, ranks[id(issue)], issue, photos[issue.photo], name,
                        crops_name) for position, (issue, name) in enumerate(cards, start=1)]
        parts.append('</div>%s</section>' % ('' if cards else '<p>none</p>'))
    parts.append('</body></html>')
    return '\n'.join(parts)


def write_page(path, crops_dir, issues, photos, confident, title):
    """The crops, then the page; returns how many cards it shows."""
    shown = write_crops(issues, photos, confident, crops_dir)
    text = html_page(shown, issues, photos, issues_lib.counts(issues),
                     os.path.basename(crops_dir), title)
    atomic_file.write_text_atomically(path, text)
    return len(shown)
