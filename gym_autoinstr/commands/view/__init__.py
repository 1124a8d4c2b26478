"""``gym-autoinstr view``: the traces of a run, listed, and one trace as a waterfall, in the
terminal or one HTML page (what it shows: docs/view.md).

One module per layer, each importing only those before it (docs/architecture.md,
"Layout").  Spans are the plain dicts ``setup.files.spans_from_request`` yields; a list, a
filter or ``--by-task`` reads only each trace's row in ``commands/runs``' table.
"""
