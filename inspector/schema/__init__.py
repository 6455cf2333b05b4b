"""The vocabularies both sides of the torch boundary share, written once, without torch.

The library (`inspector`), the web service (`server/`) and the CI client (`inspector.ci`)
import these modules; none of them re-spells a choice, a default, a label or a status.

- `options`: the analysis options with their choices and defaults.
- `inputspec`: the input-spec JSON grammar (dtype *names*; `inspector.inputspec` maps them
  to torch dtypes and checks the spec against the model).
- `figures`: the report's key figures: label, unit, how to read one off a report.
- `statuses`: job statuses and failure kinds.
- `presets`: the built-in presets as data.
"""
