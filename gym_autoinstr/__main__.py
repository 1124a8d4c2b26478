"""``python -m gym_autoinstr``: the ``gym-autoinstr`` command."""

import sys

from gym_autoinstr.commands.cli import main

sys.exit(main())
