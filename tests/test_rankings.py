"""Rankings of a ladder's variants at 50% and 100% of the steps (Results.ranking) on
synthetic ladder directories with known eval logs."""

import json
import os

import pytest

from depthscale.results import loader


def ladder(path, evals: dict[str, dict[int, float]], steps: int = 100, unfinished=()):
  """Rungs named by `evals` (rung -> {step: eval loss}), each of `steps` steps; a summary
  for every rung but the unfinished ones."""
  for rung, log in evals.items():
    d = path / rung
    os.makedirs(d)
    (d / 'config.json').write_text(json.dumps({
        'model': {'num_layers': 2, 'd_model': 16}, 'data': {'seq_len': 16}, 'train': {'steps': steps}}))
    (d / 'eval_log.jsonl').write_text(''.join(
        json.dumps({'step': s, 'eval/loss': v}) + '\n' for s, v in log.items()))
    if rung not in unfinished:
      (d / 'summary.json').write_text(json.dumps({
          'final_eval_loss': log[max(log)], 'non_embedding_params': 6000, 'tokens': 12000}))
  return loader.load(str(path))


def test_the_order_at_half_and_at_the_end_with_means_over_seeds(tmp_path):
  res = ladder(tmp_path, {
      'a_s0': {25: 3.0, 50: 2.0, 75: 1.9, 100: 1.8}, 'a_s1': {25: 3.0, 50: 2.2, 75: 2.1, 100: 2.0},
      'b_s0': {25: 3.0, 50: 2.4, 75: 1.8, 100: 1.6}, 'b_s1': {25: 3.0, 50: 2.6, 75: 1.8, 100: 1.6},
      'c_s0_d32_L4': {25: 3.0, 50: 2.9, 75: 2.8, 100: 2.7},
      'd_s0': {25: 0.1, 50: 0.1, 75: 0.1, 100: 0.1}}, unfinished=('d_s0',))
  r = res.ranking()
  assert r.orders == {0.5: ['a', 'b', 'c_d32_L4'], 1.0: ['b', 'a', 'c_d32_L4']} and not r.stable
  t = r.table
  assert list(t.seeds) == [2, 2, 1] and list(t['step@50%']) == [50] * 3 and list(t['step@100%']) == [100] * 3
  assert t.loc['a', 'loss@50%'] == pytest.approx(2.1) and t.loc['b', 'loss@100%'] == pytest.approx(1.6)
  assert list(t['rank@50%']) == [1, 2, 3] and list(t['rank@100%']) == [2, 1, 3]
  assert r.describe().splitlines() == ['50% of the steps: a < b < c_d32_L4',
                                       '100% of the steps: b < a < c_d32_L4', 'changed']


def test_the_eval_nearest_half_the_steps_the_earlier_of_two(tmp_path):
  res = ladder(tmp_path, {'a_s0': {20: 2.0, 40: 3.0, 70: 1.0, 100: 1.0},
                          'b_s0': {25: 2.5, 75: 1.5, 100: 1.2}})
  r = res.ranking((0.5, 0.7, 1.0))
  assert list(r.table['step@50%']) == [40, 25] and list(r.table['step@70%']) == [70, 75]
  assert r.orders == {0.5: ['b', 'a'], 0.7: ['a', 'b'], 1.0: ['a', 'b']} and not r.stable
  assert res.ranking((0.7, 1.0)).stable and res.ranking((0.7, 1.0)).describe().endswith('\nstable')


def test_fractions_outside_zero_to_one_are_refused(tmp_path):
  res = ladder(tmp_path, {'a_s0': {100: 1.0}})
  assert res.ranking((0.5, 1.0)).orders == {0.5: ['a'], 1.0: ['a']}  # one eval: it counts at every fraction
  for bad in ((), (0.0, 1.0), (0.5, 1.5)):
    with pytest.raises(ValueError, match=r'fractions=.*allowed one or more numbers in \(0, 1\]'):
      res.ranking(bad)
