"""``gym-autoinstr compare``: two runs, groups of runs or jobs compared per task and overall
(``comparison``), with the statistics of ``stats``, shown as text (``text``), JSON or one
HTML page (``page``); ``command`` holds the options.  docs/compare.md says how to read it."""
