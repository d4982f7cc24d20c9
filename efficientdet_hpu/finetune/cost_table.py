"""The cost table shipped with the package (finetune/costs.py reads it where no table measured on
this CPU is found). Written by `python bench.py finetune_costs
--output=efficientdet_hpu/finetune/cost_table.py` (the wheel holds only Python modules)."""
TABLE = {
    'machine': 'AMD EPYC, 2 logical cores, AVX2, AVX-512 (VNNI, BF16)',
    'cores': 2,
    'date': '2026-11-27',
    'command': ('stages: python bench.py finetune_costs --quick on a busy machine (load average '
                '2-6), rounded toward a quiet one; Lite0 at 320 px from make trees (docs/trees.md, '
                'quiet), D0 at 512 from docs/benchmarks-vm.md; to be replaced by a full run of '
                'the command on a quiet machine'),
    'training': [
        {'model': 'efficientdet-lite0', 'image_size': 320, 'images_per_second': 10.0,
         'startup_seconds': 35.0},
        {'model': 'efficientdet-d0', 'image_size': 512, 'images_per_second': 1.13,
         'startup_seconds': 40.0},
    ],
    'stages': {
        'evaluation_fixed_seconds': 1.0, 'inference_speedup': 2.0, 'convert_seconds': 5.0,
        'convert_images_per_second': 20.0, 'doctor_seconds': 15.0, 'predict_seconds': 20.0,
        'analysis_seconds': 10.0, 'export_seconds': 50.0,
    },
}
