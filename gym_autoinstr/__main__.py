"""``python -m gym_autoinstr``: the ``gym-autoinstr`` command."""

import sys

from .commands.cli import main

sys.exit(main())
