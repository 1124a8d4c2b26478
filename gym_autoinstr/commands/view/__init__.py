"""``gym-autoinstr view``: the traces of a run, listed, and one trace as a waterfall, in the
terminal or one HTML page.

Reads what the embedded default wrote (a run directory of per-process OTLP-JSON files,
single files, or standard input) and joins the processes' spans by trace.

In the terminal, a run is first a LIST: one line per trace (start, trace id, duration,
span count, status, rollout id, reward, model tokens, root span, services), filtered
(service, attribute, status, rollout, ``--where`` conditions such as ``reward<0.5``) and
sorted on request (``--slowest N``, which ranks rollout traces alone; ``--sort duration``,
``reward`` (worst first), ``tokens``, ``task``; ``--reverse``); the processes' start-up
traces are listed apart, after the rest.  A trace's reward is the verifier's (a masked
sample's marked ``*``), its tokens each model call's counted once (``runs.outcome``).
``--by-task`` summarises a collection run per task index instead: rollouts, mean reward,
p50/p95 duration, failures.  One trace, chosen by
``--trace`` (any unique prefix of its id) or ``--rollout``, is drawn as a waterfall:
service, span name (indented under its parent; a CLIENT span says which Gym server and
route it called), start offset, a duration bar, status and the attributes that matter
when reading a rollout.  A summary line per trace says where the time went: model calls,
tools, verify.  Every line fits the terminal; ``--json`` prints the same as JSON.

Rollouts collected by Gym's driver are traces of their own, each linked to its job's
``gym.job`` span: traces are grouped by job, a job line (id, counts, how many rollout
traces link to it in the run and how many of them are shown) above its rollouts.

The HTML page is one self-contained file (inline style, script and SVG): an index of every
trace with search, filters (``where`` conditions among them) and sorting by any column
(start-up traces in a group below the rest), a histogram of the rollout traces' durations
and a chart of their reward against duration (a dot per rollout trace), then the detail
of at most ``max_detail`` traces (errors and the slowest first) as waterfalls with a time
axis, collapsible subtrees, span and resource attributes; the page opens on the first job
or rollout, start-up waterfalls last.

What a list, a filter or ``--by-task`` needs of a trace is its row in the table of
``commands/runs`` (``Rollout``, read the way a ``Trace`` is): no span is read for them, and
a later command reads the cached table alone.  Spans are read for the traces drawn (a
waterfall, the page's detail) and when ``--attr`` names an attribute the table does not keep.
On a terminal, a run larger than a screen is summed up first (``overview``).

One module per layer, each importing only those before it:

* ``model``: spans joined into ``Trace`` objects (rows depth-first), jobs and the rollout
  traces linked to them, where a trace's time went (``summary``);
* ``text``: the terminal's list and waterfall, and the ``--json`` records;
* ``overview``: at scale, the summary and the rows that matter (``--show``);
* ``where``: the ``--where`` conditions;
* ``filters``: the command's filters (``select``), the orders of ``--sort``, and what
  ``--service`` matches;
* ``tasks``: the per-task summary of ``--by-task``;
* ``charts``: the page's SVG charts (durations; reward against duration);
* ``index``: the page's index of traces, its controls and script;
* ``page``: the HTML page (index, charts, waterfalls);
* ``follow``: ``--follow``'s reader: a run directory read as it is written, each finished
  rollout kept as a few numbers (done, failed, rate, jobs and their ETA, reward, durations);
* ``live``: ``--follow`` on the screen (redrawn in place, or status lines when piped), its
  final summary and its loop;
* ``command``: the command's options and ``main``.

Spans are the plain dicts ``setup.files.spans_from_request`` yields.
"""
