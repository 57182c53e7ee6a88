"""A 2-rung ladder: results.load round-trips its files, depthscale.compare prints the table
and writes non-empty PNGs, and TensorBoard holds per-layer scalars, images and HParams."""

import glob
import json

import matplotlib.image
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from depthscale import compare
from depthscale import results
from depthscale.results import loader
from depthscale.training.loop import train_rung
from depthscale.storage import read_jsonl
from tests.helpers import tiny_config

DEPTHS = (1, 2)


@pytest.fixture(scope='module')
def ladder(tmp_path_factory):
  root = tmp_path_factory.mktemp('ladder')
  for depth in DEPTHS:
    cfg = tiny_config(**{'model.num_layers': depth, 'model.d_model': 16, 'data.seq_len': 32,
                         'data.batch_size': 2, 'metrics.analysis_batch_size': 2,
                         'train.steps': 2, 'train.log_every': 1, 'train.eval_every': 2,
                         'metrics.analysis_every': 1, 'metrics.images': depth == 2,
                         'optim.warmup_steps': 0})
    train_rung(cfg, str(root / f'L{depth}'))
  return root


def test_loader_round_trips_the_ladder(ladder):
  res = results.load(str(ladder))
  assert list(res.configs.rung) == ['L1', 'L2']
  assert list(res.configs['model.num_layers']) == list(DEPTHS)
  for rung in ('L1', 'L2'):
    summary = json.loads((ladder / rung / 'summary.json').read_text())
    row = res.summaries.set_index('rung').loc[rung]
    assert {k: row[k] for k in summary} == pytest.approx(summary, nan_ok=True)
    rebuilt = {}
    for r in res.layers[res.layers.rung == rung].itertuples():
      rebuilt.setdefault((r.step, r.metric), {})[r.layer] = r.value
    expected = {(rec['step'], k): dict(enumerate(v, 1))
                for rec in read_jsonl(ladder / rung / 'layer_metrics.jsonl')
                for k, v in rec.items() if k != 'step'}
    assert rebuilt == expected
    scal = res.scalars[res.scalars.rung == rung]
    for log in loader.SCALAR_LOGS:
      for rec in read_jsonl(ladder / rung / log):
        for k, v in rec.items():
          if k != 'step':
            got = scal[(scal.step == rec['step']) & (scal.tag == k)].value
            assert list(got) == pytest.approx([v], nan_ok=True), (log, k)
  profile = res.final_profile('L2')
  assert len(profile['skip_delta_loss']) == 2 and len(profile['update_ratio']) == 2
  assert {'grad_norm_attn', 'update_param_ratio', 'kurtosis', 'angular_distance',
          'logit_lens_kl', 'param_rotation', 'erank_acts'} <= set(profile)
  assert set(res.scalars.tag) >= {'train/param_norm', 'train/logit_max', 'effective_depth/kl',
                                  'effective_depth/skip_ratio', 'eval/loss'}


def test_compare_prints_table_and_writes_pngs(ladder, capsys):
  compare.main([str(ladder)])
  text = capsys.readouterr().out
  header = text.splitlines()[0].split()
  assert header[0] == 'rung' and {'eval_loss', 'params', 'tokens/s', 'ed_kl', 'ed_skip'} <= set(header)
  assert [line.split()[0] for line in text.splitlines()[2:4]] == ['L1', 'L2']
  for line in text.splitlines()[2:4]:  # the values are the rung's summary, formatted
    cell = dict(zip(header, line.split()))
    s = json.loads((ladder / cell['rung'] / 'summary.json').read_text())
    assert int(cell['L']) == int(cell['rung'][1:])
    assert float(cell['eval_loss']) == pytest.approx(s['final_eval_loss'], abs=5e-5)
    assert float(cell['train_loss']) == pytest.approx(s['final_train_loss'], abs=5e-5)
    assert int(cell['params'].replace(',', '')) == s['params']
    assert int(cell['non_emb_params'].replace(',', '')) == s['non_embedding_params']
    for kind in ('kl', 'skip'):
      expect = s[f'final_effective_depth_{kind}']
      assert float(cell[f'ed_{kind}']) == pytest.approx(expect, rel=1e-5)
  for name in ('loss_vs_depth.png', 'profiles.png'):
    img = matplotlib.image.imread(ladder / 'compare' / name)
    assert img.shape[0] > 100 and img.shape[1] > 100
    assert np.ptp(img[..., :3]) > 0.1  # something is drawn


def test_compare_rejects_a_missing_directory(tmp_path):
  with pytest.raises(SystemExit) as e:
    compare.main([str(tmp_path / 'nope')])
  assert e.value.code == 2


def test_tensorboard_layers_images_hparams(ladder):
  tags, plugins = set(), set()
  for path in glob.glob(str(ladder / 'L2' / 'events.out.tfevents.*')):
    for event in EventFileLoader(path).Load():
      for v in event.summary.value:
        tags.add(v.tag)
        plugins.add(v.metadata.plugin_data.plugin_name)
  assert {'layers/attn_contrib/0001', 'layers/attn_contrib/0002', 'layers/skip_delta_loss/0002',
          'images/heatmap/update_ratio', 'images/profile/logit_lens_kl',
          'effective_depth/cos', 'train/param_norm'} <= tags
  assert 'hparams' in plugins
