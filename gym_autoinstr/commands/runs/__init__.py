"""The one reader of runs under ``view``, ``compare`` and ``export``: a row per trace (its
rollout's outcome, times, tokens, where its time went, which files hold its spans), for any
number of run directories at once, without holding their spans in memory.

* ``outcome``: how a rollout ended, from its spans: reward, mask, task and repeat
  indexes, tokens (each model call once), failure (``view``'s trace model reads it too);
* ``facts``: what one file says about each trace in it (a partial), partials merged, and
  a trace's merged partial as its row;
* ``rollout``: a row read the way ``view`` reads a trace (``Rollout``);
* ``store``: files found, read once each (their facts files when the writer left them:
  ``fastpath/span_facts.py``) and cached with the merged table, ``load`` and the spans of
  the traces to draw.

Why this shape, and the numbers that chose it: docs/architecture.md, "Reading runs".
"""
