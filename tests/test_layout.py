"""The package's shape: no import cycles, model/ independent of training/ and results/, the
trainer's layers (training/, model/, data/) importing no post-hoc procedure, experiment layer
or command line, no imports inside functions, no placement-name checks outside the placement
table, the table refuses unknown features and validation reads its modifier rows, and a rung's process
leaves the results readers unimported. Static (ast), config validation and one import in a
subprocess, no JAX compilation."""

import ast
import io
import pathlib
import re
import subprocess
import sys
import tokenize

import pytest

from depthscale.config import validate
from depthscale.errors import ConfigError
from depthscale.model import placements
from tests.helpers import small_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'depthscale'


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in PACKAGE.rglob('*.py'):
    name = '.'.join(path.relative_to(ROOT).with_suffix('').parts)
    out[name.removesuffix('.__init__')] = path
  return out


def _imports(path: pathlib.Path, modules) -> set[str]:
  """The depthscale modules a file imports (at any depth of the file)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    names = []
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith('depthscale'):
      names = [f'{node.module}.{a.name}' if f'{node.module}.{a.name}' in modules else node.module
               for a in node.names]
    elif isinstance(node, ast.Import):
      names = [a.name for a in node.names if a.name.startswith('depthscale')]
    found.update(names)
  return found


def test_no_import_cycles():
  modules = _modules()
  graph = {m: _imports(p, modules) - {m} for m, p in modules.items()}
  state: dict[str, int] = {}

  def visit(m, stack):
    state[m] = 1
    for n in sorted(graph.get(m, ())):
      assert state.get(n) != 1, 'import cycle: ' + ' -> '.join(stack[stack.index(n):] + [m, n])
      if n not in state:
        visit(n, stack + [m])
    state[m] = 2
  for m in sorted(graph):
    if m not in state:
      visit(m, [])


def test_model_imports_nothing_from_training_or_results():
  modules = _modules()
  for name, path in modules.items():
    if name.startswith('depthscale.model'):
      bad = {m for m in _imports(path, modules)
             if m.startswith(('depthscale.training', 'depthscale.results'))}
      assert not bad, (name, bad)


LOWER_LAYERS = ('depthscale.training', 'depthscale.model', 'depthscale.data')
UPPER_LAYERS = ('depthscale.posthoc', 'depthscale.experiment', 'depthscale.results')  # and every CLI


def _is_cli(path: pathlib.Path) -> bool:
  """A command line: a module with an `if __name__ == '__main__'` block."""
  return any(isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
             and isinstance(n.test.left, ast.Name) and n.test.left.id == '__name__'
             for n in ast.parse(path.read_text()).body)


def _climbs(name: str, imported: set[str], clis: set[str]) -> set[str]:
  """What a lower-layer module imports from above it (a CLI module may run itself)."""
  return {m for m in imported if m.startswith(UPPER_LAYERS) or m in clis - {name}}


def test_the_trainer_imports_nothing_above_it(tmp_path):
  """The loop, the model and the data know no post-hoc procedure (they reach the loop through
  depthscale.training.procedures), no experiment layer, no results reader (a run's images
  are training.raster's) and no command line; imports inside functions count too."""
  modules = _modules()
  clis = {m for m, p in modules.items() if _is_cli(p)}
  assert {'depthscale.main', 'depthscale.compare', 'depthscale.data.prepare'} <= clis
  for name, path in modules.items():
    if name.startswith(LOWER_LAYERS):
      assert not _climbs(name, _imports(path, modules), clis), (name, _climbs(
          name, _imports(path, modules), clis))
  planted = tmp_path / 'planted.py'
  planted.write_text('def f():\n  from depthscale import posthoc\n  import depthscale.main\n')
  found = _climbs('depthscale.training.planted', _imports(planted, modules), clis)
  assert found == {'depthscale.posthoc', 'depthscale.main'}


def test_no_imports_inside_functions():
  """Every import is at module level, so the dependency graph above is the whole story."""
  for path in PACKAGE.rglob('*.py'):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        inner = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
        lazy = [n for n in inner if not all(a.name in LAZY_OPTIONAL for a in n.names)
                and getattr(n, 'module', None) not in LAZY_OPTIONAL]
        assert not lazy, f'{path.relative_to(ROOT)}:{node.lineno} imports inside {node.name}'


LAZY_OPTIONAL = ('sentencepiece', 'tokenizers', 'pyarrow', 'pyarrow.parquet', 'zstandard', 'ray',
                 'ray.util', 'ray.util.scheduling_strategies')  # optional extras


def _name_checks(path: pathlib.Path) -> list[int]:
  """Lines comparing something's `.block` (a placement name) with ==, !=, in or not in."""
  toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
          if t.type in (tokenize.NAME, tokenize.OP)]
  return [b.start[0] for a, b, c in zip(toks, toks[1:], toks[2:])
          if a.string == '.' and b.string == 'block' and c.string in ('==', '!=', 'in', 'not')]


def test_no_placement_name_checks_outside_the_table():
  for path in PACKAGE.rglob('*.py'):
    if path.name != 'placements.py':
      assert not _name_checks(path), (path.relative_to(ROOT), _name_checks(path))


def test_placement_rows_refuse_unknown_features():
  with pytest.raises(ValueError, match='unknown placement features'):
    placements.Placement(placements.pre_ln, final_norm=True, inner=frozenset({'attn_outt'}))
  with pytest.raises(ValueError, match='unknown placement features'):
    placements.Placement(placements.pre_ln, final_norm=True, modifiers=frozenset({'gpass'}))


# a value that switches each modifier on (placements.MODIFIERS)
SWITCHED_ON = {'gpas': True, 'ln_scaling': True, 'layer_rope': True, 'parallel_block': 'gptj',
               'init': 'deepscalelm', 'norm': 'crmsnorm'}


@pytest.mark.parametrize('name', sorted(placements.MODIFIERS))
def test_validation_reads_the_modifier_rows(name):
  """A modifier switched on with a placement whose row lacks it fails in one line naming its
  row's field and the placements that have it; with one that has it, it validates."""
  modifier = placements.MODIFIERS[name]
  on = {f'model.{modifier.field}': SWITCHED_ON[modifier.field]}
  allowed = ', '.join(placements.with_modifier(name))
  with pytest.raises(ConfigError, match=rf'^model.{modifier.field}=.* is invalid: allowed '
                                        rf'{re.escape(modifier.off)} unless model.block in '
                                        rf'{allowed}'):
    validate(small_config(**on, **{'model.block': 'sub_ln'}))
  validate(small_config(**on, **{'model.block': placements.with_modifier(name)[0]}))


# Files that are not a run's: the experiment file (Python code, imported like a module), the
# package's own embedded source text, the host's TPU and NVIDIA device files, the host's
# cache files (CPU dot-library choices, the parsed python_docs corpus: properties of the
# machine, not of any run), the launcher's probe of whether every node sees a local (never
# a bucket) workdir, the working directory a rung process starts in, and Hugging Face
# checkpoint directories (a local format: safetensors read by memory map, written with the
# tokenizer files).
LOCAL_FILES_OK = ('depthscale/storage.py', 'depthscale/experiment.py',
                  'depthscale/data/python_docs.py', 'depthscale/host_cache.py',
                  'depthscale/training/host_libtpu.py', 'depthscale/training/host_cuda.py',
                  'depthscale/training/cpu_calibration.py',
                  'depthscale/launch/cluster.py', 'depthscale/launch/host.py',
                  'depthscale/hf/__init__.py', 'depthscale/hf/safetensors.py',
                  'depthscale/hf/tokenizer_files.py')
LOCAL_ONLY_OS = ('makedirs', 'mkdir', 'listdir', 'scandir', 'walk', 'stat', 'rename', 'replace',
                 'remove', 'unlink', 'rmdir')


def _local_file_calls(source: str) -> list[str]:
  """open(), os.path.*, os's file functions and glob / shutil / tempfile / pathlib in source."""
  found = []
  for n in ast.walk(ast.parse(source)):
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == 'open':
      found.append(f'{n.lineno}: open')
    elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and (
        (n.value.id == 'os' and n.attr in LOCAL_ONLY_OS + ('path',))
        or n.value.id in ('glob', 'shutil', 'tempfile', 'pathlib')):
      found.append(f'{n.lineno}: {n.value.id}.{n.attr}')
  return found


def test_run_paths_go_through_storage():
  """Every path a run reads or writes may be a bucket URL: only depthscale/storage.py touches
  files with local-only calls (a ./gs:/ directory was once the result)."""
  for path in PACKAGE.rglob('*.py'):
    if str(path.relative_to(ROOT)) not in LOCAL_FILES_OK:
      assert not _local_file_calls(path.read_text()), (str(path.relative_to(ROOT)),
                                                        _local_file_calls(path.read_text()))
  planted = 'import os\n\ndef f(d):\n  os.makedirs(d)\n  return open(os.path.join(d, "x"))\n'
  assert sorted(_local_file_calls(planted)) == ['4: os.makedirs', '5: open', '5: os.path']


def test_a_rung_process_imports_no_results_reader():
  """`depthscale.main` (every rung's process under the launcher) leaves pandas, scipy and
  matplotlib's figures unimported: ~1.3 s of each process's start (they come with the
  ladder's table and figures, depthscale.results, when those are asked for)."""
  probe = ('import sys, depthscale.main; print(sorted(m for m in ("pandas", "scipy", '
           '"matplotlib.figure", "depthscale.results.loader") if m in sys.modules))')
  out = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, cwd=ROOT,
                       check=True)
  assert out.stdout.strip() == '[]', out.stdout + out.stderr
