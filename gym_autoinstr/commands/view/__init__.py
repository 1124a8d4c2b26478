"""``gym-autoinstr view``: the traces of a run, listed, and one trace as a waterfall, in the
terminal or one HTML page.

Reads what the embedded default wrote (a run directory of per-process OTLP-JSON files,
single files, or standard input) and joins the processes' spans by trace.

In the terminal, a run is first a LIST: one line per trace (start, trace id, duration,
span count, status, rollout id, model tokens, root span, services), filtered (service,
attribute, status, rollout) and sorted on request (``--slowest N``, which ranks rollout
traces alone, ``--sort duration``); the processes' start-up traces are listed apart, after
the rest.  One trace, chosen by
``--trace`` (any unique prefix of its id) or ``--rollout``, is drawn as a waterfall:
service, span name (indented under its parent; a CLIENT span says which Gym server and
route it called), start offset, a duration bar, status and the attributes that matter
when reading a rollout.  A summary line per trace says where the time went: model calls,
tools, verify.  Every line fits the terminal; ``--json`` prints the same as JSON.

Rollouts collected by Gym's driver are traces of their own, each linked to its job's
``gym.job`` span: traces are grouped by job, a job line (id, counts, how many rollout
traces link to it in the run and how many of them are shown) above its rollouts.

The HTML page is one self-contained file (inline style, script and SVG): an index of every
trace with search and filters (start-up traces in a group below the rest), a histogram of
the rollout traces' durations, then the detail of at most ``max_detail`` traces (errors
and the slowest first) as waterfalls with a time axis, collapsible subtrees, span and
resource attributes; the page opens on the first job or rollout, start-up waterfalls last.

One module per layer, each importing only those before it:

* ``model``: spans joined into ``Trace`` objects (rows depth-first), jobs and the rollout
  traces linked to them, where a trace's time went (``summary``);
* ``text``: the terminal's list and waterfall, and the ``--json`` records;
* ``filters``: the command's filters (``select``), and what ``--service`` matches;
* ``page``: the HTML page (index, duration chart, waterfalls);
* ``command``: the command's options and ``main``.

Spans are the plain dicts ``setup.files.spans_from_request`` yields.
"""
