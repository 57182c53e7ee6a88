"""The one error type of bad input: every subsystem raises it, the CLIs turn it into one line."""


class ConfigError(ValueError):
  """An invalid config value or input; the message names the field and what is allowed."""


def invalid(field: str, value, allowed: str) -> ConfigError:
  """The error for `field=value`: '<field>=<value> is invalid: allowed <allowed>'."""
  return ConfigError(f'{field}={value!r} is invalid: allowed {allowed}')
