"""benchmarks/finetune_costs.py: the cost table's two-point fit, a table written as a module;
slow: `bench.py finetune_costs --quick` writes a table the plan reads."""
import pytest

from cli_runs import run_python
from efficientdet_hpu.benchmarks import finetune_costs
from efficientdet_hpu.finetune import costs


def test_a_cost_split_into_fixed_and_per_item():
    # 2 s + 32 images at 16/s = 4 s; 2 s + 8 at 16/s = 2.5 s.
    fixed, rate = finetune_costs._two_points(8, 32, 2.5, 4.0)  # pylint: disable=protected-access
    assert (fixed, rate) == pytest.approx((2.0, 16.0))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_costs_command_writes_a_table_the_plan_reads(tmp_path):
    table_path = tmp_path / 'costs.json'
    result = run_python(['bench.py', 'finetune_costs', '--quick', '--output=%s' % table_path],
                        timeout=1400)
    assert result.returncode == 0, result.stdout[-3000:]
    table = costs.load(path=str(table_path))
    rate, how = table.images_per_second('efficientdet-lite0', 128, table.cores)
    assert rate > 0 and str(table_path) in how
    assert table.final_seconds(rate, 10) > table.export_seconds > 0
    assert table.machine in result.stdout


def test_a_table_written_as_a_module_reads_back(tmp_path):
    import importlib.util
    from efficientdet_hpu.finetune import cost_table
    path = finetune_costs.write(cost_table.TABLE, str(tmp_path / 'cost_table.py'))
    spec = importlib.util.spec_from_file_location('written_table', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.TABLE == cost_table.TABLE
    assert costs.Table.from_json(module.TABLE).cores == 2
