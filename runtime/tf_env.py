"""Process settings TensorFlow reads once, when it is first imported.

Entry points (main.py, inference.py) import this module before anything imports tensorflow.
A value already in the environment always wins, so a user can still say
`TF_ENABLE_ONEDNN_OPTS=0 python main.py ...`.

- TF_ENABLE_ONEDNN_OPTS=1: oneDNN CPU kernels. TensorFlow 2.15 turns them on by itself only on
  CPUs with AVX512-VNNI/BF16/AMX; on this project's AVX2 benchmark VM they make D0 training
  about 20% faster (docs/benchmarks-vm.md, the `oneDNN off` rows). No effect on HPU kernels.
"""
import os

DEFAULTS = {'TF_ENABLE_ONEDNN_OPTS': '1'}

for _name, _value in DEFAULTS.items():
    os.environ.setdefault(_name, _value)
