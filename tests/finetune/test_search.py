"""finetune/search.py: successive halving over candidates whose scores are given, the rungs it
needs, the line that says what was tried and why the winner won."""
import json
import os

from efficientdet_hpu.finetune import rerun
from efficientdet_hpu.finetune import search


def _scorer(table, calls):
    def score(name, rung):
        calls.append((name, rung))
        return table[name][rung]
    return score


def test_two_candidates_one_rung_the_better_goes_on():
    calls = []
    winner, history = search.successive_halving(
        ['192px', '256px'], _scorer({'192px': [0.31], '256px': [0.28]}, calls), 1)
    assert winner == '192px'
    assert history == [(0, '192px', 0.31), (0, '256px', 0.28)]
    assert calls == [('192px', 0), ('256px', 0)]


def test_four_candidates_are_halved_twice_and_the_weak_stop_early():
    scores = {'a': [0.10, 0.20], 'b': [0.30, 0.25], 'c': [0.20, 0.40], 'd': [0.05, 0.90]}
    calls = []
    winner, _ = search.successive_halving(list('abcd'), _scorer(scores, calls), 2)
    # Rung 0: b (0.30) and c (0.20) go on; a and d stop (d would have won later: the price
    # of stopping early). Rung 1: c (0.40) beats b (0.25).
    assert winner == 'c'
    assert calls == [('a', 0), ('b', 0), ('c', 0), ('d', 0), ('b', 1), ('c', 1)]


def test_a_tie_goes_to_the_first_the_plans_own():
    winner, _ = search.successive_halving(['own', 'other'],
                                          lambda name, rung: 0.5, 1)
    assert winner == 'own'
    # Equal to the three decimals printed: noise, a tie (classes-20 in the suite printed 0.000
    # against 0.000, and the other size went on).
    noise = {'own': 0.0001, 'other': 0.0004}
    winner, _ = search.successive_halving(['own', 'other'], lambda name, rung: noise[name], 1)
    assert winner == 'own'
    results = [{'name': 'own', 'AP50': 0.0001, 'step': 15, 'of_steps': 150, 'minutes': 1.2},
               {'name': 'other', 'AP50': 0.0004, 'step': 9, 'of_steps': 90, 'minutes': 1.2}]
    assert search.result_line(results, 'own').endswith(
        "a tie (AP50s under 0.01: no ranking yet), which goes to the plan's own")


def test_a_tie_is_broken_by_the_training_loss_at_the_rung():
    """classes-20 in the suite: both starts at AP50 0.000 at their rungs; the random start's
    classification loss 0.98, the backbone's 1.14. The backbone went on and ended at 0.047,
    where the random start reaches 0.27."""
    ap50 = {'128px': 0.0001, '128px-random': 0.0}
    losses = {'128px': 1.14, '128px-random': 0.98}
    winner, _ = search.successive_halving(list(ap50), lambda name, rung: ap50[name], 1,
                                          lambda name, rung: losses[name])
    assert winner == '128px-random'
    # Within LOSS_MARGIN (2.5%) of the plan's own: noise, the plan's own goes on.
    losses['128px-random'] = 1.12
    winner, _ = search.successive_halving(list(ap50), lambda name, rung: ap50[name], 1,
                                          lambda name, rung: losses[name])
    assert winner == '128px'
    # The classes-20 rung of 2026-12-02: 1.548 against 1.614, 4.1% under: the random start.
    ap50['128px'], losses.update({'128px': 1.614, '128px-random': 1.548})
    winner, _ = search.successive_halving(list(ap50), lambda name, rung: ap50[name], 1,
                                          lambda name, rung: losses[name])
    assert winner == '128px-random'
    # classes-20's third rung that day: AP50 0.0007 against 0.00014, both under SCORE_FLOOR: a
    # tie, and the random start's loss 7% under the backbone's.
    ap50.update({'128px': 0.0007, '128px-random': 0.00014})
    losses.update({'128px': 1.589, '128px-random': 1.476})
    winner, _ = search.successive_halving(list(ap50), lambda name, rung: ap50[name], 1,
                                          lambda name, rung: losses[name])
    assert winner == '128px-random'
    ap50['128px'] = 0.011  # Over the floor: the higher AP50 wins, whatever the loss.
    winner, _ = search.successive_halving(list(ap50), lambda name, rung: ap50[name], 1,
                                          lambda name, rung: losses[name])
    assert winner == '128px'
    ap50['128px'] = 0.0001
    # The loss never overrules a higher AP50 (over the floor), nor decides without the plan's
    # own's loss.
    ap50['128px'], losses['128px-random'] = 0.02, 0.5
    assert search.successive_halving(list(ap50), lambda name, rung: ap50[name], 1,
                                     lambda name, rung: losses[name])[0] == '128px'
    ap50['128px'], losses['128px'] = 0.0, None
    assert search.successive_halving(list(ap50), lambda name, rung: ap50[name], 1,
                                     lambda name, rung: losses[name])[0] == '128px'


def test_the_loss_orders_a_tie_below_the_best_too():
    """Four candidates keep two: 'a' leads; b, c and d tie behind it; d's loss is lowest by
    more than the margin under b's, so d goes on with a."""
    ap50 = {'a': 0.3, 'b': 0.1, 'c': 0.1, 'd': 0.1}
    losses = {'a': 2.0, 'b': 1.0, 'c': 0.97, 'd': 0.8}
    calls = []
    winner, _ = search.successive_halving(
        list('abcd'), _scorer({k: [v, v + (0.1 if k == 'd' else 0)] for k, v in ap50.items()},
                              calls), 2, lambda name, rung: losses[name])
    assert calls[4:] == [('a', 1), ('d', 1)] and winner == 'a'


def test_the_result_line_says_how_a_tie_was_broken():
    results = [{'name': '128px', 'AP50': 0.0001, 'step': 236, 'of_steps': 2832,
                'minutes': 2.0, 'loss': 1.14},
               {'name': '128px-random', 'AP50': 0.0, 'step': 164, 'of_steps': 1968,
                'minutes': 1.5, 'loss': 0.98}]
    assert search.result_line(results, '128px-random').endswith(
        '128px-random goes on: a tie (AP50s under 0.01: no ranking yet) in AP50, broken by the '
        'training loss up to that '
        'evaluation: 0.980 (128px-random) against 1.140 (128px); 2.5% lower or more goes on '
        'before the plan\'s own')
    results[1]['loss'] = 1.12
    assert search.result_line(results, '128px').endswith(
        "128px goes on: a tie (AP50s under 0.01: no ranking yet), which goes to the plan's own: "
        "training losses up to that "
        "evaluation 1.140 (128px) against 1.120 (128px-random), none 2.5% lower")
    results[1]['loss'] = None
    assert search.result_line(results, '128px').endswith(
        "128px goes on: a tie (AP50s under 0.01: no ranking yet), which goes to the plan's own")
    for result, ap50 in zip(results, (0.25, 0.2504)):  # A tie to the decimals printed.
        result['AP50'] = ap50
    assert search.result_line(results, '128px').endswith(
        "128px goes on: a tie, which goes to the plan's own")


def test_the_rung_loss_is_the_median_detection_loss_of_the_second_half(tmp_path):
    records = [{'event': 'train', 'step': step, 'loss': loss + 0.5, 'l2_loss': 0.5}
               for step, loss in ((20, 9.0), (40, 3.0), (60, 1.2), (80, 1.0), (100, 1.1),
                                  (120, 0.2))]
    records.insert(3, {'event': 'eval', 'step': 60})
    (tmp_path / 'train_log.jsonl').write_text(
        '\n'.join(json.dumps(r) for r in records) + '\n{"event": "tr')
    # Steps 60, 80 and 100 are in (50, 100]: the median of 1.2, 1.0 and 1.1, L2 left out.
    assert abs(search.rung_loss(str(tmp_path), 100) - 1.1) < 1e-9
    assert search.rung_loss(str(tmp_path), 10) is None
    assert search.rung_loss(str(tmp_path / 'none'), 100) is None


def test_rungs_take_the_candidates_down_to_one():
    assert [search.rungs_for(n) for n in (1, 2, 3, 4, 8)] == [0, 1, 1, 2, 3]


def test_the_result_line_names_each_score_and_why():
    results = [{'name': '192px', 'AP50': 0.312, 'step': 244, 'of_steps': 2440, 'minutes': 1.9},
               {'name': '256px', 'AP50': 0.288, 'step': 150, 'of_steps': 1500, 'minutes': 2.2}]
    line = search.result_line(results, '192px')
    assert line == ('tried 192px (AP50 0.312 at step 244 of 2440, 1.9 min) and 256px (AP50 '
                    '0.288 at step 150 of 1500, 2.2 min); 192px goes on: the higher AP50 at '
                    'the same evaluation of its run')
    tie = [dict(results[0], AP50=0.3), dict(results[1], AP50=0.3)]
    assert search.result_line(tie, '192px').endswith("a tie, which goes to the plan's own")


def test_the_score_is_the_evaluations_ap50(tmp_path):
    os.makedirs(tmp_path / 'eval')
    (tmp_path / 'eval' / 'metrics-80.json').write_text(json.dumps(
        {'metrics': {'AP': 0.12, 'AP50': 0.34}}))
    assert search.evaluation_score(str(tmp_path), 80) == (0.34, 0.12)
    assert search.evaluation_score(str(tmp_path), 160) is None


def test_a_candidate_stopped_before_its_evaluation_is_said():
    results = [{'name': '128px', 'AP50': -1.0, 'step': 73, 'of_steps': 730, 'minutes': 2.4},
               {'name': '192px', 'AP50': 0.2, 'step': 55, 'of_steps': 440, 'minutes': 2.4}]
    assert search.result_line(results, '192px').startswith(
        'tried 128px (no evaluation: stopped by the budget before it at step 73 of 730')


def test_the_search_line_stays_in_plan_yaml_when_the_steps_change(tmp_path):
    from efficientdet_hpu.finetune import plan_file
    path = tmp_path / 'plan.yaml'
    path.write_text('# header\nmode: train_and_eval\nnum_epochs: 10\n')
    plan_file.set_num_epochs(str(path), 8, ['tried 128px and 192px'])
    plan_file.set_num_epochs(str(path), 6)
    text = path.read_text()
    assert text.startswith('# header\n# search: tried 128px and 192px\n')
    assert plan_file.planned_num_epochs(str(path)) == 6


def test_a_slow_start_skips_the_search(tmp_path):
    """SMALL_PHOTOS in 20 min from the ImageNet backbone plans 192 px against 192 px from
    random weights (tests/finetune/test_sizing.py): the data stage planned at 66 s took 198,
    three times: the search's 158.67 s would cost 476 s, over 50% of the 1000 - (115 + 30)
    x 3 = 565 s of training left."""
    import time
    from efficientdet_hpu.finetune import plan as plan_lib
    from efficientdet_hpu.finetune import prepare
    from efficientdet_hpu.finetune import runner as runner_lib
    from finetune_cases import LITE0_PTH, ROOMY, SMALL_PHOTOS, SEARCH_TABLE as TABLE

    class Runner:
        layout = runner_lib.Layout(str(tmp_path))
        said = []

        def elapsed(self):
            return 198.0

        def say(self, text=''):
            self.said.append(text)
    plan = plan_lib.make_plan(SMALL_PHOTOS, ROOMY,
                              plan_lib.Request(weights=LITE0_PTH, max_minutes=20), table=TABLE)
    assert plan.candidates == ('192px', '192px-random')
    runner = Runner()
    kept, last = search.search_stage(runner, plan, time.time() + 1000,
                                     prepare.plan_from_record, 198.0)
    assert last is None
    assert kept.image_size == 192 and kept.steps == plan.steps
    line = dict(kept.reasons)['search']
    assert line.startswith('not searched: 16.7 min left, and the stages before took 3.0 times')
    assert line.endswith("192px, the plan's own, goes on")
    with open(tmp_path / 'search.json') as stream:
        assert json.load(stream)['tried'] == []


def test_stages_half_again_as_slow_keep_a_planned_search_three_times_drop_it():
    """The same plan (search 158.67 s, end 115 s, start-up 30 s) with 1000 s left: at 1.5
    times the search costs 238 s of 1000 - 145 x 1.5 = 782.5 s of training left, 30.4%, over
    the plan's 25% and kept (the run's 50% leaves room for a slower machine and a noisy data
    stage); at twice, 317.33 s of 710 s, 44.7%, kept too (a VM at half the table's speed); at
    3 times, 476 s of 565 s, dropped with the line that says why."""
    from efficientdet_hpu.finetune import plan as plan_lib
    from finetune_cases import LITE0_PTH, ROOMY, SMALL_PHOTOS, SEARCH_TABLE as TABLE
    plan = plan_lib.make_plan(SMALL_PHOTOS, ROOMY,
                              plan_lib.Request(weights=LITE0_PTH, max_minutes=20), table=TABLE)
    parts = dict(plan.seconds)
    assert (round(parts['search']), round(parts['whole photos + export'] + parts['start-up'],
                                          2)) == (159, 145.0)
    assert search.skipped_line(plan, 1000.0, 1.5) is None
    assert search.skipped_line(plan, 1000.0, 2.0) is None
    assert search.skipped_line(plan, None, 3.0) is None  # No deadline: nothing to fit.
    assert search.skipped_line(plan, 1000.0, 3.0) == (
        'not searched: 16.7 min left, and the stages before took 3.0 times their estimate: the '
        'search would cost about 7.9 min, over 50.0% of the training left (the plan\'s 25%, '
        'with room for stages 2.0 times their estimate); 192px, the plan\'s own, goes on')


def test_each_candidate_is_written_under_its_name_and_read_back(tmp_path):
    """The random start's plan.yaml has no --backbone_ckpt, the from-scratch rate and D0 with
    configs/demo.yaml's network; the plan's own keeps the backbone. A plan.json written when
    candidates were sizes reads back as names."""
    import dataclasses
    import yaml
    from efficientdet_hpu.finetune import plan as plan_lib
    from efficientdet_hpu.finetune import plan_file
    from efficientdet_hpu.finetune import prepare
    from efficientdet_hpu.finetune import runner as runner_lib
    from finetune_cases import LITE0_PTH, ROOMY, SMALL_PHOTOS, SEARCH_TABLE as TABLE
    request = plan_lib.Request(weights=LITE0_PTH, max_minutes=20)
    plan = plan_lib.make_plan(SMALL_PHOTOS, ROOMY, request, table=TABLE)
    layout = runner_lib.Layout(str(tmp_path))
    search.write_candidates(layout, [(name, plan_lib.candidate_plan(
        plan, SMALL_PHOTOS, ROOMY, request, name, table=TABLE) if index else plan)
        for index, name in enumerate(plan.candidates)], lambda chosen: yaml.safe_dump(
            plan_file.recipe(chosen, 'train-*', 'val-*', 'val.json')))
    recipes = {}
    for name in ('192px', '192px-random'):
        with open(tmp_path / 'candidates' / name / 'plan.yaml') as stream:
            recipes[name] = yaml.safe_load(stream)
        with open(tmp_path / 'candidates' / name / 'plan.json') as stream:
            read = prepare.plan_from_record(json.load(stream))
        assert read.image_size == 192
    assert recipes['192px']['backbone_ckpt'] == LITE0_PTH.path
    assert 'act_type' not in recipes['192px'] and recipes['192px']['learning_rate'] == 0.08
    assert 'backbone_ckpt' not in recipes['192px-random']
    assert (recipes['192px-random']['model_name'], recipes['192px-random']['fpn_num_filters'],
            recipes['192px-random']['learning_rate']) == ('efficientdet-d0', 48, 1.28)
    old = dict(json.loads(json.dumps(dataclasses.asdict(plan))), candidates=[192, 256])
    assert prepare.plan_from_record(old).candidates == ('192px', '256px')


def test_the_candidates_steps_fit_the_time_left_before_their_rungs(tmp_path):
    """SMALL_PHOTOS' candidates (2380 steps, intervals of 238, search 158.67 s, start-up 30 s,
    24 images/s) with the 1134 s left after the data stage: at the stages' ratio 1.0 the plan
    stands; at 1.5, 16 images/s and 1134 - 238 of search - 172.5 of end - 45 of start-up =
    678.5 s hold 5.45 intervals of 238 steps, 119 + 5.5 s each, 5 planned (a last one counts
    where half of it fits, for the time-budget stop to end; 0.45 does not): 1190 steps, the
    random start's warm-up a quarter of them (297 steps) from its first step, which its
    continuation keeps. The last candidate is fitted as it starts instead, to the time then
    left with no search cost to keep."""
    import yaml
    from efficientdet_hpu.finetune import plan as plan_lib
    from efficientdet_hpu.finetune import plan_file
    from efficientdet_hpu.finetune import prepare
    from efficientdet_hpu.finetune import runner as runner_lib
    from finetune_cases import LITE0_PTH, ROOMY, SMALL_PHOTOS, SEARCH_TABLE as TABLE

    class Runner:
        layout = runner_lib.Layout(str(tmp_path))
        said = []

        def say(self, text=''):
            self.said.append(text)
    request = plan_lib.Request(weights=LITE0_PTH, max_minutes=20)
    plan = plan_lib.make_plan(SMALL_PHOTOS, ROOMY, request, table=TABLE)
    named = [(name, plan_lib.candidate_plan(plan, SMALL_PHOTOS, ROOMY, request, name,
                                            table=TABLE) if index else plan)
             for index, name in enumerate(plan.candidates)]
    search.write_candidates(Runner.layout, named, lambda chosen: yaml.safe_dump(
        plan_file.recipe(chosen, 'train-*', 'val-*', 'val.json')))
    runner = Runner()
    assert search._fitted(runner, named, 1134.0, 1.0) == named and runner.said == []
    fitted = dict(search._fitted(runner, named, 1134.0, 1.5))
    random_start = fitted['192px-random']
    # What fits is 5 of its 238-step intervals, 1190 steps; not yet started, they are spread
    # over 10 evaluations as the plan spreads them: 119 steps each, 1190 (its rung, the first
    # evaluation, a tenth of the run as planned, not a fifth); the warm-up a quarter of 1190,
    # at most 1190 // 4 = 297.
    assert (random_start.steps, random_start.eval_interval, random_start.warmup_steps) == (
        1190, 119, 297)
    assert random_start.evaluations == 10
    assert dict(random_start.reasons)['evaluation'].startswith(
        '10 evaluations, one every 119 steps')
    recipe = yaml.safe_load((tmp_path / 'candidates' / '192px-random' / 'plan.yaml').read_text())
    assert recipe['num_epochs'] == 10
    assert (recipe['num_examples_per_epoch'], recipe['cp_every_n_steps'],
            recipe['log_every_n_steps']) == (119 * random_start.global_batch, 119, 29)
    assert recipe['lr_warmup_epoch'] == plan_file.warmup_epochs(297, 119)
    with open(tmp_path / 'candidates' / '192px-random' / 'plan.json') as stream:
        assert prepare.plan_from_record(json.load(stream)).steps == 1190
    assert runner.said[1] == (
        "  192px-random: 1190 steps instead of 2380: fitted before the search to the 18.9 min "
        "left, less the search's 4.0, at 16.0 images/s (the table's 24.0 over the stages' "
        "ratio 1.50)")
    # Fitted as it starts instead, the others' runs done: 896 s left (1134 less the first's
    # 238) hold the same 5 intervals with no search to keep; 1134 s would hold 7 (7.36),
    # 1666 steps, spread over 10 evaluations of 166.
    for left, steps in ((896.0, 1190), (1134.0, 1660)):
        search.write_candidates(Runner.layout, named, lambda chosen: yaml.safe_dump(
            plan_file.recipe(chosen, 'train-*', 'val-*', 'val.json')))
        assert dict(search._fitted(runner, named[1:], left, 1.5, last=True))[
            '192px-random'].steps == steps
    assert runner.said[-1].endswith(
        "fitted as it starts to the 18.9 min left, the search's other runs done, at 16.0 "
        "images/s (the table's 24.0 over the stages' ratio 1.50)")
    # Stages faster than the table's (0.75) shorten the estimates of the start-up and the end,
    # not the training: the candidates keep the table's 24 images/s and the search its 158.67
    # s. 900 s less 158.67, the end's 86.25 and the start-up's 22.5, 632.58 s, hold 7.71
    # intervals of 238 steps (79.33 s of training and a 2.75 s evaluation each), 8 planned:
    # 1904 steps spread over 10 evaluations of 190, 1900.
    faster = dict(search._fitted(runner, named, 900.0, 0.75))
    assert (faster['192px-random'].images_per_second, faster['192px-random'].steps) == (
        24.0, 1900)
    assert runner.said[-1].endswith(
        "at 24.0 images/s (the table's 24.0; the stages' ratio 0.75 is not read as faster "
        "training)")


class _FakeMain:
    """A runner whose `train` commands play main.py: from the plan.json beside --hparams, a
    train record every tenth of the evaluation interval (each a line for stop_when), the
    evaluation at the interval with the AP50 `scores` gives the start ('backbone' or
    'random'), a checkpoint where it stops or ends, and its name in model_dir/who."""

    def __init__(self, root, scores):
        from efficientdet_hpu.finetune import runner as runner_lib
        self.layout, self.scores = runner_lib.Layout(root), scores
        self.verbose, self.said, self.calls = False, [], []

    def say(self, text=''):
        self.said.append(text)

    def command(self, name, kind, args, timeout, echo=False, stop_after=None, stop_when=None):
        import time
        from efficientdet_hpu.finetune import prepare
        del kind, timeout, echo, stop_after
        flags = dict(a[2:].split('=', 1) for a in args if a.startswith('--') and '=' in a)
        self.calls.append((name, flags))
        model_dir = flags['model_dir']
        with open(os.path.join(os.path.dirname(flags['hparams']), 'plan.json')) as stream:
            plan = prepare.plan_from_record(json.load(stream))
        os.makedirs(os.path.join(model_dir, 'eval'), exist_ok=True)
        start = (rerun.latest_step(model_dir) or 0) + 1
        if start == 1:
            with open(os.path.join(model_dir, 'who'), 'w') as stream:
                stream.write(os.path.basename(os.path.dirname(flags['hparams'])))
        every, stopped, step = max(1, plan.eval_interval // 10), False, start
        for step in range(start, plan.steps + 1):
            if step % every and step != plan.eval_interval:
                continue
            records = [{'event': 'train', 'step': step, 'loss': 1.0, 'time': time.time(),
                        'images_per_sec': 20.0}]
            if step == plan.eval_interval:
                ap50 = self.scores[plan.weights.kind or 'random']
                with open(os.path.join(model_dir, 'eval', 'metrics-%d.json' % step), 'w') as out:
                    json.dump({'metrics': {'AP50': ap50, 'AP': ap50 / 2}}, out)
                records.append({'event': 'eval', 'step': step})
            with open(os.path.join(model_dir, 'train_log.jsonl'), 'a') as out:
                out.write(''.join(json.dumps(record) + '\n' for record in records))
            if stop_when and stop_when('step %d 20.0 images/s' % step):
                stopped = True
                break
        with open(os.path.join(model_dir, 'checkpoint'), 'w') as stream:
            stream.write('model_checkpoint_path: "model.ckpt-%d"\n' % step)
        return 0, stopped


def _searched(tmp_path, scores):
    """SMALL_PHOTOS' search in 20 min (192px from the backbone, then 192px-random), run by
    _FakeMain with no deadline (nothing fitted) up to the training stage's first command."""
    import yaml
    from efficientdet_hpu.finetune import plan as plan_lib
    from efficientdet_hpu.finetune import plan_file
    from efficientdet_hpu.finetune import prepare
    from finetune_cases import LITE0_PTH, ROOMY, SMALL_PHOTOS, SEARCH_TABLE as TABLE
    request = plan_lib.Request(weights=LITE0_PTH, max_minutes=20)
    plan = plan_lib.make_plan(SMALL_PHOTOS, ROOMY, request, table=TABLE)
    runner = _FakeMain(str(tmp_path), scores)
    search.write_candidates(runner.layout, [(name, plan_lib.candidate_plan(
        plan, SMALL_PHOTOS, ROOMY, request, name, table=TABLE) if index else plan)
        for index, name in enumerate(plan.candidates)], lambda chosen: yaml.safe_dump(
            plan_file.recipe(chosen, 'train-*', 'val-*', 'val.json')))
    trained, last = search.search_stage(runner, plan, None, prepare.plan_from_record, 0.0)
    return runner, trained, last


def test_the_last_candidate_that_wins_goes_on_in_the_same_run(tmp_path):
    """The random start, last, trains in model/ as the training itself; at its rung it beats
    the backbone's score and main.py is not started again: one training command to the end,
    search.json and plan.yaml the winner's, no candidates/ left."""
    from efficientdet_hpu.finetune import stages
    runner, trained, last = _searched(tmp_path, {'backbone': 0.10, 'random': 0.30})
    assert [call[0] for call in runner.calls] == ['search-192px']
    assert last.name == '192px-random' and trained.weights.kind == ''
    assert rerun.search_undecided(runner.layout)  # A stop now: the rerun searches again.
    record = stages.training_stage(runner, trained, None, last)
    assert [call[0] for call in runner.calls] == ['search-192px', 'train']
    assert runner.calls[1][1]['model_dir'] == runner.layout.model_dir
    assert record['step'] == trained.steps and record['ended'] == 'completed'
    with open(tmp_path / 'search.json') as stream:
        found = json.load(stream)
    assert found['winner'] == '192px-random'
    assert [entry['AP50'] for entry in found['tried']] == [0.10, 0.30]
    assert '# search: ' + found['line'] in (tmp_path / 'plan.yaml').read_text()
    assert (tmp_path / 'model' / 'who').read_text() == '192px-random'
    assert not os.path.exists(tmp_path / 'candidates')
    assert not rerun.search_undecided(runner.layout)
    assert any('as the training itself' in line for line in runner.said)


def test_the_last_candidate_that_loses_stops_at_its_rung_and_the_winner_resumes(tmp_path):
    """The backbone scores higher: the random start stops at its rung, its model/ gives way
    to the backbone's, which resumes from its rung's checkpoint with the run's plan.yaml."""
    from efficientdet_hpu.finetune import stages
    runner, trained, last = _searched(tmp_path, {'backbone': 0.30, 'random': 0.10})
    record = stages.training_stage(runner, trained, None, last)
    names = [call[0] for call in runner.calls]
    assert names == ['search-192px', 'train', 'train']
    assert runner.calls[2][1]['hparams'] == runner.layout.plan_yaml
    with open(tmp_path / 'search.json') as stream:
        assert json.load(stream)['winner'] == '192px'
    assert (tmp_path / 'model' / 'who').read_text() == '192px'
    with open(tmp_path / 'plan.json') as stream:
        plan = json.load(stream)
    assert plan['weights']['kind'] == 'backbone' and record['step'] == plan['steps']
    assert not os.path.exists(tmp_path / 'candidates')



def test_a_stop_before_the_verdict_says_the_rerun_searches_again(tmp_path):
    """model/ holds the last candidate's checkpoint while the search is undecided: the stop's
    line does not offer it as the run's, and a rerun's flag check does not count it as
    trained; once search.json is written, it is the run's."""
    import signal
    from efficientdet_hpu.core import processes
    from efficientdet_hpu.finetune import stages
    runner = _FakeMain(str(tmp_path), {})
    runner.stage = (4, 'training')
    os.makedirs(tmp_path / 'candidates' / '128px-random')
    os.makedirs(tmp_path / 'model')
    (tmp_path / 'model' / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-30"\n')
    stop = processes.Stopped(signal.SIGTERM)
    stages.explain_stop(runner, stop, False)
    assert stop.line('finetune') == (
        'finetune: stopped by SIGTERM during the search (stage 4/6), before its verdict; rerun '
        'the same command to search again')
    assert rerun.trained_step(runner.layout) is None
    (tmp_path / 'search.json').write_text('{}')
    stop = processes.Stopped(signal.SIGTERM)
    stages.explain_stop(runner, stop, False)
    assert stop.line('finetune').endswith('training at step 30; checkpoint model/model.ckpt-30 '
                                          'kept; rerun the same command to continue')
    assert rerun.trained_step(runner.layout) == 30
