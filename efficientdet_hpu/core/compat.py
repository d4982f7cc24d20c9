"""The names users of google/automl's and Habana's ports type, kept at the repository root.

`main.py`, `demo_efficientdet.py`, `hparams_config.py`, `dataset/create_coco_tfrecord.py`, ...
stay where those users look for them, as thin modules over this package: a module name
(`import hparams_config`) gives the package's module itself, one object under two names, so a
patch or a global set through either is seen through both; a command file
(`python main.py`, `python -m dataset.doctor`) starts the package module's command line.
"""
import importlib
import os
import sys


def alias(name: str, target: str):
    """Makes the module `name` (a root thin module's __name__) be `target`; returns it."""
    module = importlib.import_module(target)
    sys.modules[name] = module
    return module


def run_or_alias(name: str, target: str):
    """For a root command file: run as a program (name '__main__') it calls target's
    `entry_point()`; imported, it is `target` (as alias)."""
    module = importlib.import_module(target)
    if name == '__main__':
        module.entry_point()
    else:
        sys.modules[name] = module
    return module


# The directory holding this package: in a checkout, the repository root with main.py.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def root_script(name: str):
    """Path of the checkout's root command file `name` (e.g. 'main.py'), or None when this
    package was installed without a checkout around it."""
    path = os.path.join(PACKAGE_PARENT, name)
    return path if os.path.isfile(path) else None
