"""The page's index: a row per trace (the list's columns, reward and tokens among them),
the controls above it (search, status, service, ``where``, start-up traces), the charts,
and the script behind them.

A click on a column's heading sorts by it (again: the other way round; first as
``--sort`` does: reward lowest first, duration, spans and tokens largest first), rows
without the value last, start-up traces within their own group.  The ``where`` box takes
the conditions ``--where`` takes (``reward<0.5 duration>2s``, all must hold; the box is
outlined red while it holds something else).  Every filter hides the trace's row, its
waterfall and its dot in the reward chart.  A collection run's per-task table (``tasks``)
is folded under the controls; a click on a task puts ``task==N`` in the box."""

from __future__ import annotations

import html
from collections.abc import Sequence

from gym_autoinstr.commands.view.charts import duration_chart, reward_chart
from gym_autoinstr.commands.view.model import Trace, display_name, short_service
from gym_autoinstr.commands.view.tasks import by_task, task_table_html
from gym_autoinstr.commands.view.text import (
    ID_SHOWN,
    MASKED_NOTE,
    clock,
    duration_text,
    reward_text,
    status_text,
    tokens_text,
)

STARTUP_HEADING = "Start-up traces (processes starting, not rollouts)"


def _index_row(trace: Trace, drawn: set[str]) -> str:
    trace_id = html.escape(trace.trace_id)
    services = sorted(short_service(s) for s in trace.services)
    ident = (
        f'<a href="#t-{trace_id}">{trace_id[:ID_SHOWN]}</a>'
        if trace.trace_id in drawn
        else f'<span title="not drawn on this page">{trace_id[:ID_SHOWN]}</span>'
    )
    root = html.escape(display_name(trace.root))
    names = html.escape(", ".join(services))
    rollouts = html.escape(", ".join(sorted(trace.rollout_ids)))
    values = {
        "duration": f"{trace.duration_ms:.3f}",
        "reward": None if trace.reward is None else repr(trace.reward),
        "tokens": trace.total_tokens,
        "task": trace.task_index,
        "repeat": trace.rollout_index,
        "masked": None if trace.reward is None else int(bool(trace.mask_sample)),
    }
    data = "".join(f' data-{key}="{value}"' for key, value in values.items() if value is not None)
    masked = trace.reward is not None and trace.mask_sample
    reward = (
        f'<td class="num reward masked" title="{MASKED_NOTE[2:]}">{reward_text(trace)}</td>'
        if masked
        else f'<td class="num reward">{reward_text(trace)}</td>'
    )
    return (
        f'<tr class="{"error " if trace.has_error else ""}{"startup" if trace.is_startup else "run"}" '
        f'data-trace-id="{trace_id}" data-status="{"error" if trace.has_error else "ok"}" '
        f'data-services="{html.escape(" ".join(services))}"{data}>'
        f'<td>{ident}</td><td>{clock(trace.start_ns)}</td><td class="root" title="{root}">{root}</td>'
        f'<td class="services" title="{names}">{names}</td><td class=num>{trace.span_count}</td>'
        f"<td class=num>{html.escape(duration_text(trace.duration_ms))}</td><td>{status_text(trace)}</td>"
        f'{reward}<td class="num tokens">{tokens_text(trace)}</td>'
        f'<td class="rollout" title="{rollouts}">{rollouts}</td>'
        f"<td>{'start-up' if trace.is_startup else ''}</td></tr>"
    )


# The index's columns: fixed widths for the short ones, so a long root or service list is
# cut (whole in its tooltip) instead of pushing duration and status out of the window.
# The third field: how a click on the heading sorts (the row's data attribute for a number,
# "desc" for the cell's number, largest first; "" for the cell's text).
INDEX_COLUMNS = (
    ("trace", "9.5em", ""),
    ("start (UTC)", "8.5em", ""),
    ("root", "", ""),
    ("services", "", ""),
    ("spans", "5em", "desc"),
    ("duration", "7em", "duration desc"),
    ("status", "5em", ""),
    ("reward", "5.5em", "reward"),
    ("tokens", "6.5em", "tokens desc"),
    ("rollout", "6em", ""),
    ("", "6em", ""),
)


def html_index(listed: Sequence[Trace], drawn: set[str]) -> str:
    """Every trace listed: the rollouts (and jobs' own traces) first, start-up traces in a
    group of their own below."""
    rows = "".join(_index_row(t, drawn) for t in listed if not t.is_startup)
    startup = [t for t in listed if t.is_startup]
    if startup:
        rows += (
            f'</tbody><tbody class="startup"><tr class="group"><th colspan="{len(INDEX_COLUMNS)}">'
            f"{STARTUP_HEADING}: {len(startup)}</th></tr>" + "".join(_index_row(t, drawn) for t in startup)
        )
    all_services = sorted({short_service(s) for t in listed for s in t.services})
    options = "".join(f'<option value="{html.escape(s)}">{html.escape(s)}</option>' for s in all_services)
    columns = "".join(f'<col style="width:{width}">' if width else "<col>" for _name, width, _sort in INDEX_COLUMNS)
    any_masked = any(t.mask_sample and t.reward is not None for t in listed)
    masked = f'<p class="masked-note">{MASKED_NOTE}</p>' if any_masked else ""
    heads = "".join(
        f'<th data-sort="{sort}" title="sort by {html.escape(name)} (click again: the other way round)">'
        f"{html.escape(name)}</th>"
        if name
        else "<th></th>"
        for name, _width, sort in INDEX_COLUMNS
    )
    return (
        '<section class="index"><h2>Traces</h2><p class="controls">'
        '<input id="search" type="search" placeholder="search: trace id, root span, service, rollout" size="44"> '
        '<select id="status-filter"><option value="">any status</option><option value="ok">ok</option>'
        '<option value="error">error</option></select> '
        f'<select id="service-filter"><option value="">any service</option>{options}</select> '
        '<input id="where" type="search" size="26" placeholder="where: reward&lt;0.5 duration&gt;2s" '
        'title="conditions FIELD OP NUMBER, all must hold: fields reward, tokens, duration (ms, or 2s), task, '
        'repeat, masked (1 or 0); operators &lt; &lt;= &gt; &gt;= == !="> '
        '<label><input id="startup-filter" type="checkbox" checked> start-up traces</label>'
        f'<span id="shown-count">{len(listed)} of {len(listed)} shown</span></p>'
        f'<div class="charts">{duration_chart(listed)}{reward_chart(listed)}</div>{masked}'
        f"{task_table_html(by_task(listed))}"
        f'<div class="index-table"><table id="index"><colgroup>{columns}</colgroup><thead><tr>{heads}</tr></thead>'
        f"<tbody>{rows}</tbody></table></div></section>"
    )


INDEX_SCRIPT = """
(function () {
  var search = document.getElementById('search');
  var statusFilter = document.getElementById('status-filter');
  var serviceFilter = document.getElementById('service-filter');
  var startupFilter = document.getElementById('startup-filter');
  var whereBox = document.getElementById('where');
  var whereTitle = whereBox.title;
  var counter = document.getElementById('shown-count');
  var rows = Array.prototype.slice.call(document.querySelectorAll('#index tbody tr[data-trace-id]'));
  var startupHeadings = document.querySelectorAll('#index tr.group, h2.startup');
  var sections = {}, dots = {};
  document.querySelectorAll('section.trace').forEach(function (s) { sections[s.dataset.traceId] = s; });
  document.querySelectorAll('figure.scatter circle').forEach(function (d) { dots[d.dataset.traceId] = d; });
  var OPS = {
    '<': function (a, b) { return a < b; }, '<=': function (a, b) { return a <= b; },
    '>': function (a, b) { return a > b; }, '>=': function (a, b) { return a >= b; },
    '==': function (a, b) { return a === b; }, '!=': function (a, b) { return a !== b; }
  };
  var FIELDS = ['reward', 'tokens', 'duration', 'task', 'repeat', 'masked'];
  var CONDITION = /([a-z]+)\\s*(<=|>=|==|!=|<|>)\\s*(-?(?:\\d+\\.?\\d*|\\.\\d+)(?:e[-+]?\\d+)?)\\s*(ms|s)?(?![\\w.])/gi;
  function conditions(text) {
    // what --where takes, FIELD OP NUMBER, spaces or commas between; null when a part is not one
    var found = [], bad = false;
    var rest = text.replace(CONDITION, function (all, field, op, number, unit) {
      field = field.toLowerCase();
      var value = parseFloat(number);
      if (FIELDS.indexOf(field) < 0 || (unit && field !== 'duration')) bad = true;
      if (unit && unit.toLowerCase() === 's') value *= 1000;
      found.push([field, op, value]);
      return ' ';
    });
    return bad || /[^\\s,]/.test(rest) ? null : found;
  }
  function apply() {
    var words = search.value.toLowerCase().split(/\\s+/).filter(Boolean);
    var status = statusFilter.value, svc = serviceFilter.value, startup = startupFilter.checked, shown = 0;
    var where = conditions(whereBox.value);
    whereBox.classList.toggle('invalid', where === null);
    whereBox.title = where === null ? 'not understood: ' + whereTitle : whereTitle;
    where = where || [];
    rows.forEach(function (row) {
      var text = row.textContent.toLowerCase() + ' ' + row.dataset.traceId;
      var keep = words.every(function (w) { return text.indexOf(w) >= 0; })
        && (!status || row.dataset.status === status)
        && (!svc || row.dataset.services.split(' ').indexOf(svc) >= 0)
        && (startup || !row.classList.contains('startup'))
        && where.every(function (c) {
          var value = row.dataset[c[0]];
          return value !== undefined && OPS[c[1]](parseFloat(value), c[2]);
        });
      row.hidden = !keep;
      var section = sections[row.dataset.traceId];
      if (section) section.hidden = !keep;
      var dot = dots[row.dataset.traceId];
      if (dot) dot.classList.toggle('off', !keep);
      if (keep) shown += 1;
    });
    startupHeadings.forEach(function (heading) { heading.hidden = !startup; });
    counter.textContent = shown + ' of ' + rows.length + ' shown';
  }
  [search, statusFilter, serviceFilter, startupFilter, whereBox].forEach(function (control) {
    control.addEventListener('input', apply);
    control.addEventListener('change', apply);
  });
  function sortBy(th) {
    // data-sort: the row's data attribute holding the number, "desc": largest first
    var how = th.dataset.sort.split(' '), key = how[0] === 'desc' ? '' : how[0], numeric = how[0] !== '';
    var ascending = th.classList.contains('sorted') ? !th.classList.contains('ascending') : how.indexOf('desc') < 0;
    document.querySelectorAll('#index thead th').forEach(function (other) {
      other.classList.remove('sorted', 'ascending');
    });
    th.classList.add('sorted');
    if (ascending) th.classList.add('ascending');
    document.querySelectorAll('#index tbody').forEach(function (body) {
      var keyed = Array.prototype.slice.call(body.querySelectorAll('tr[data-trace-id]')).map(function (row, at) {
        var value = key ? row.dataset[key] : row.cells[th.cellIndex].textContent;
        if (numeric) value = parseFloat(value);
        return [value === undefined || value === '' || value !== value ? null : value, at, row];
      });
      keyed.sort(function (a, b) {
        if (a[0] === null || b[0] === null) return (a[0] === null) - (b[0] === null) || a[1] - b[1];
        var order = a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0;
        return (ascending ? order : -order) || a[1] - b[1];
      });
      keyed.forEach(function (k) { body.appendChild(k[2]); });
    });
  }
  document.querySelectorAll('#index thead th[data-sort]').forEach(function (th) {
    th.addEventListener('click', function () { sortBy(th); });
  });
  document.querySelectorAll('table.tasks tbody tr').forEach(function (row) {
    row.addEventListener('click', function () {
      whereBox.value = 'task==' + row.dataset.task;
      apply();
      document.querySelector('.index-table').scrollIntoView();
    });
  });
  var scatter = document.querySelector('figure.scatter svg');
  if (scatter) scatter.addEventListener('click', function (event) {
    var id = event.target.getAttribute && event.target.getAttribute('data-trace-id');
    if (id && sections[id]) location.hash = 't-' + id;
  });
  apply();
})();
"""
