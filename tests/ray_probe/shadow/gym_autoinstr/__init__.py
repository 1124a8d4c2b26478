# Stands in for an interpreter without gym-autoinstr: first on PYTHONPATH, never imports.
raise ImportError("gym_autoinstr is not installed in this interpreter (test shadow)")
