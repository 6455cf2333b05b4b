"""Hostile: kills its parent, then carries on as a normal model."""

import os
import signal

os.kill(os.getppid(), signal.SIGKILL)
