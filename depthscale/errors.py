"""The one error type of bad input (every subsystem raises it, the CLIs turn it into one line),
and the errors of an output that could not be written or a store that did not answer."""


class ConfigError(ValueError):
  """An invalid config value or input; the message names the field and what is allowed."""


class WriteError(RuntimeError):
  """A checkpoint or log could not be written (full disk, lost bucket, permission); what was
  written before it, the previous checkpoint included, stays usable."""


class StoreTimeout(WriteError):
  """A store did not answer a read or a write within its deadline (depthscale.storage); it
  ends a run as a failed write does. `cause` says so without the path."""

  def __init__(self, message: str, cause: str):
    super().__init__(message)
    self.cause = cause


def reason(e: BaseException) -> str:
  """A one-line description of an exception: its type and first line."""
  first = next((line.strip() for line in str(e).splitlines() if line.strip()), '')
  return f'{type(e).__name__}: {first[:200]}' if first else type(e).__name__


def invalid(field: str, value, allowed: str) -> ConfigError:
  """The error for `field=value`: '<field>=<value> is invalid: allowed <allowed>'."""
  return ConfigError(f'{field}={value!r} is invalid: allowed {allowed}')
