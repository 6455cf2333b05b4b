"""Hostile: reads the process environment and reports it back in its error."""

import json
import os

raise RuntimeError("hostile env: " + json.dumps(dict(os.environ)))
