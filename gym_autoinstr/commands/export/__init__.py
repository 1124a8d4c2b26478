"""``gym-autoinstr export``: a campaign's rollouts as a table a user queries with their own
tools (pandas, DuckDB, Polars, a spreadsheet), or their rewards as a UI's scores.

* ``columns``: what a row says, for a rollout (its row in the ``runs`` table: no span is
  read) and for a span (``--spans``: read from the span files, a file at a time);
* ``formats``: Parquet (pyarrow, when importable: row groups of ``ROW_GROUP`` rows), CSV
  and JSONL (the standard library, streamed), each written to a temporary file beside the
  target and renamed over it once whole;
* ``command``: the options, the choice of rows (``--job``, ``--where``, ``--all-traces``)
  and the dispatch of ``--to phoenix`` / ``--to mlflow`` to ``scores``.

A rollout's row joins Gym's own output row by ``(task_index, rollout_index)`` ==
``(_ng_task_index, _ng_rollout_index)`` within its job (docs/export.md)."""
