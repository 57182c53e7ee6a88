"""A 2-rung ladder: results.load round-trips its files, depthscale.compare prints the table
and writes non-empty PNGs, and TensorBoard holds per-layer scalars, images and HParams; a
real TensorBoard server shows the custom-scalars layout and the ladder's images."""

import contextlib
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import jax
import matplotlib.image
from matplotlib.figure import Figure
import numpy as np
import optax
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.custom_scalar import layout_pb2

from depthscale import compare
from depthscale import results
from depthscale.model.transformer import make_model
from depthscale.results import loader, plots
from depthscale.training import tb_layout
from depthscale.training.loop import _Logs, train_rung
from depthscale.training.steps import init_state
from depthscale.storage import read_jsonl
from tests.gcs import free_port
from tests.helpers import tiny_config

DEPTHS = (1, 2)


def rung_config(depth):
  return tiny_config(**{'model.num_layers': depth, 'model.d_model': 16, 'data.seq_len': 32,
                        'data.batch_size': 2, 'metrics.analysis_batch_size': 2,
                        'train.steps': 2, 'train.log_every': 1, 'train.eval_every': 2,
                        'metrics.analysis_every': 1, 'metrics.images': depth == 2,
                        'optim.warmup_steps': 0})


@pytest.fixture(scope='module')
def ladder(tmp_path_factory):
  root = tmp_path_factory.mktemp('ladder')
  for depth in DEPTHS:
    train_rung(rung_config(depth), str(root / f'L{depth}'))
  return root


@pytest.mark.slow  # a trained ladder through compare, the loader and TensorBoard
def test_flops_column_is_the_hand_count(ladder):
  """6 N tokens + 6 L T D tokens with N counted by hand for d16 (4 D^2 attention, 2 D 4D MLP
  and two LayerNorms of scale and bias per block, the final LayerNorm) and from the parameter
  tree init_state builds (embedding left out)."""
  d, t, tokens = 16, 32, 2 * 2 * 32  # D, T, steps * batch * T
  s = results.load(str(ladder)).summaries.set_index('rung')
  for depth in DEPTHS:
    model = make_model(rung_config(depth))
    params = jax.eval_shape(lambda m=model: init_state(m, optax.identity(), 0, t))
    tree = sum(x.size for path, x in jax.tree_util.tree_flatten_with_path(params['params'])[0]
               if path[0].key != 'embedding')
    hand = depth * (4 * d * d + 2 * d * 4 * d + 4 * d) + 2 * d
    assert tree == hand == s.loc[f'L{depth}', 'non_embedding_params']
    assert s.loc[f'L{depth}', 'flops'] == 6 * hand * tokens + 6 * depth * t * d * tokens


@pytest.mark.slow  # a trained ladder through compare, the loader and TensorBoard
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


@pytest.mark.slow  # a trained ladder through compare, the loader and TensorBoard
def test_compare_prints_table_and_writes_pngs(ladder, capsys):
  compare.main([str(ladder)])
  text = capsys.readouterr().out
  header = text.splitlines()[0].split()
  assert header[0] == 'rung' and {'eval_loss', 'params', 'tokens/s', 'ed_kl', 'ed_skip',
                                  'flops'} <= set(header)
  assert [line.split()[0] for line in text.splitlines()[2:4]] == ['L1', 'L2']
  for line in text.splitlines()[2:4]:  # the values are the rung's summary, formatted
    cell = dict(zip(header, line.split()))
    s = json.loads((ladder / cell['rung'] / 'summary.json').read_text())
    assert int(cell['L']) == int(cell['rung'][1:])
    assert float(cell['eval_loss']) == pytest.approx(s['final_eval_loss'], abs=5e-5)
    assert float(cell['train_loss']) == pytest.approx(s['final_train_loss'], abs=5e-5)
    assert int(cell['params'].replace(',', '')) == s['params']
    assert int(cell['non_emb_params'].replace(',', '')) == s['non_embedding_params']
    assert float(cell['flops']) == pytest.approx(6 * s['tokens'] * (
        s['non_embedding_params'] + int(cell['L']) * 32 * 16), rel=5e-3)
    for kind in ('kl', 'skip'):
      expect = s[f'final_effective_depth_{kind}']
      assert float(cell[f'ed_{kind}']) == pytest.approx(expect, rel=1e-5)
  for against in ('params', 'depth'):  # the rungs' two variants, one size each: said once
    assert f'  2 variants with one {against} each: not determined (the plain power law needs 3' in text
  assert 'images=False: loss vs' not in text
  assert 'iso-FLOP: no rungs of different depths at equal training FLOPs (within 15%)' in text
  for name in ('loss_vs_depth.png', 'profiles.png', 'loss_vs_params_fit.png',
               'loss_vs_depth_fit.png', 'loss_vs_flops.png'):
    img = matplotlib.image.imread(ladder / 'compare' / name)
    assert img.shape[0] > 100 and img.shape[1] > 100
    assert np.ptp(img[..., :3]) > 0.1  # something is drawn


@pytest.mark.parametrize('lines', [plots.LEGEND_MAX, plots.LEGEND_MAX + 1])
def test_a_legend_only_up_to_its_readable_size(lines):
  ax = Figure().subplots()
  ax.set_title('loss')
  for i in range(lines):
    ax.plot([1, 2], [i, i], label=f'variant{i}')
  plots.legend(ax, 6)
  if lines <= plots.LEGEND_MAX:
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [f'variant{i}' for i in range(lines)]
    assert ax.get_title() == 'loss'
  else:
    assert ax.get_legend() is None
    assert ax.get_title() == f'loss\n({lines} lines, no legend)'


def test_compare_rejects_a_missing_directory(tmp_path):
  with pytest.raises(SystemExit) as e:
    compare.main([str(tmp_path / 'nope')])
  assert e.value.code == 2


@pytest.mark.slow  # a trained ladder through compare, the loader and TensorBoard
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


@contextlib.contextmanager
def tensorboard_server(logdir: str, timeout_s: float = 60.0):
  """`python -m tensorboard.main` on a free port of 127.0.0.1, which reads the event files
  once before it answers; yields get(route, **query) -> the answer's bytes."""
  url = f'http://127.0.0.1:{free_port()}'
  with tempfile.TemporaryFile() as log:
    proc = subprocess.Popen([sys.executable, '-m', 'tensorboard.main', f'--logdir={logdir}',
                             '--host=127.0.0.1', f'--port={url.rsplit(":", 1)[1]}',
                             '--load_fast=false', '--reload_interval=0', '--reload_task=blocking'],
                            stdout=log, stderr=log)

    def get(route: str, **query) -> bytes:
      with urllib.request.urlopen(f'{url}{route}?{urllib.parse.urlencode(query)}', timeout=10) as r:
        return r.read()

    try:
      deadline = time.monotonic() + timeout_s
      while True:
        try:
          get('/data/runs')
          break
        except OSError:
          if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            raise RuntimeError(f'tensorboard did not answer on {url}: {log.read()[-2000:]}')
          time.sleep(0.2)
      yield get
    finally:
      proc.kill()
      proc.wait()


@pytest.mark.slow  # a trained ladder through compare, the loader and TensorBoard
def test_tensorboard_server_shows_layout_and_ladder_images(ladder):
  for _ in range(2):  # the second call's event file hides the first's images
    _, written = compare.compare(str(ladder))
  with tensorboard_server(str(ladder)) as get:
    get_json = lambda route, **query: json.loads(get(route, **query))
    images = get_json('/data/plugin/images/tags')
    layout = get_json('/data/plugin/custom_scalars/layout')
    scalar_tags = get_json('/data/plugin/scalars/tags')
    charts = {c['title']: c['multiline']['tag'] for cat in layout['category']
              for c in cat['chart']}
    ladder_images = {t: get_json('/data/plugin/images/images', run='compare', tag=t)
                     for t in images['compare']}
    served = {t: [get('/data/plugin/images/individualImage',
                      **dict(urllib.parse.parse_qsl(e['query']))) for e in v]
              for t, v in ladder_images.items()}
    l2_regex_tags = {m: set(get_json('/data/plugin/custom_scalars/scalars', run='L2',
                                     tag=regexes[0])['tag_to_events'])
                     for m, regexes in charts.items()}

  # one chart per per-layer metric of the logs, holding exactly that metric's layer tags
  metrics = {k for r in read_jsonl(ladder / 'L2' / 'layer_metrics.jsonl') for k in r} - {'step'}
  assert sum(len(cat['chart']) for cat in layout['category']) == len(charts) == len(metrics)
  assert set(charts) == metrics and {'act_rms', 'skip_delta_loss', 'param_rotation'} <= metrics
  assert 'layers: other' not in [cat['title'] for cat in layout['category']]  # all categorized
  for rung, depth in (('L1', 1), ('L2', 2)):
    for m, regexes in charts.items():
      assert {t for t in scalar_tags[rung] if any(re.match(r, t) for r in regexes)} == {
          f'layers/{m}/{l:04d}' for l in range(1, depth + 1)}, (rung, m)
  assert all(tags == {f'layers/{m}/0001', f'layers/{m}/0002'} for m, tags in l2_regex_tags.items())

  assert {'images/heatmap/update_ratio', 'images/profile/skip_delta_loss'} <= set(images['L2'])
  figures = ['loss_vs_depth', 'profiles', 'loss_vs_params_fit', 'loss_vs_depth_fit',
             'loss_vs_flops']
  assert set(images['compare']) == {f'ladder/{f}' for f in figures}  # no iso-FLOP group here
  assert [[e['step'] for e in v] for v in ladder_images.values()] == [[0]] * len(figures)
  assert len(glob.glob(str(ladder / 'compare' / 'events.out.tfevents.*'))) >= 2
  assert [os.path.basename(p) for p in written[:-1]] == [f'{f}.png' for f in figures]
  assert served == {f'ladder/{os.path.basename(p)[:-4]}': [open(p, 'rb').read()]
                    for p in written[:-1]}
  assert os.path.dirname(written[-1]) == str(ladder / 'compare') and 'tfevents' in written[-1]


def test_layout_grows_with_the_metrics_the_records_bring(tmp_path):
  logs = _Logs(str(tmp_path), 0, [0, 2])  # 3 layers, TensorBoard shows layers 1 and 3
  logs.log_train(1, {'train/loss': 1.0}, {'act_rms': [1.0, 2.0, 3.0]})
  logs.log_analysis(2, {'skip_delta_loss': [0.1, 0.2, 0.3], 'my_metric': [0, 0, 1]}, {})
  logs.log_train(2, {'train/loss': 0.5}, {'act_rms': [1.0, 2.0, 3.0]})
  logs.close()
  acc = EventAccumulator(str(tmp_path), size_guidance={'tensors': 0})
  acc.Reload()
  layouts = [layout_pb2.Layout.FromString(e.tensor_proto.string_val[0])
             for e in acc.Tensors('custom_scalars__config__')]
  charts = [{c.title: (cat.title, list(c.multiline.tag)) for cat in l.category for c in cat.chart}
            for l in layouts]
  assert [e.step for e in acc.Tensors('custom_scalars__config__')] == [1, 2]
  assert charts == [{'act_rms': ('layers: activations', [tb_layout.layer_regex('act_rms')])},
                    {'act_rms': ('layers: activations', [tb_layout.layer_regex('act_rms')]),
                     'skip_delta_loss': ('layers: depth use (analyses)',
                                         [tb_layout.layer_regex('skip_delta_loss')]),
                     'my_metric': ('layers: other', [tb_layout.layer_regex('my_metric')])}]
  shown = [t for t in acc.Tags()['scalars'] if t.startswith('layers/')]
  assert sorted(shown) == ['layers/act_rms/0001', 'layers/act_rms/0003', 'layers/my_metric/0001',
                           'layers/my_metric/0003', 'layers/skip_delta_loss/0001',
                           'layers/skip_delta_loss/0003']
