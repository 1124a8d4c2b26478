"""What one file of spans says about each trace in it, in a few numbers (a ``Partial``), and
the partials of a trace's files merged into its row (``resolve``).

A trace's spans are spread over the files of every process it crossed, so each file is
read once into partials that merge whichever order the files come in: earliest start,
latest end, span and error counts, the services, the time its callees' SERVER spans took
(model calls, tools, verify: additive, so no tree is needed), and for each outcome the
best candidate so far, ranked as ``outcome`` ranks spans: a span without a parent (the
trace's root) before ``gym.rollout`` before ``gym.verify``, the earlier before the later.

The trace's root is its earliest span without a parent (the earliest span when every span
has one: a trace whose upstream caller wrote elsewhere).  Tokens, counted once: the
rollout's own total (``nemo.gym.rollout.usage.*``), else an ``invoke_agent`` span's usage,
else the sum over model calls (their CLIENT spans; the seams when no CLIENT span has
usage), else over every span with usage.  A failure's ``error.type`` and stage are the
earliest span's that says them.

Partials are plain lists, tuples, sets and numbers: ``marshal`` stores them (``store``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator

from gym_autoinstr import attributes as attr
from gym_autoinstr.commands.runs import outcome
from gym_autoinstr.fastpath import span_facts
from gym_autoinstr.fastpath.wire_json import decoded as _value

# Partial fields (a list, so merges happen in place)
(
    START,
    END,
    COUNT,
    ERRORS,
    SERVICES,
    MODEL,
    TOOLS,
    VERIFY,
    TOPS,
    EARLIEST,
    REWARD,
    MASK,
    TASK,
    REPEAT,
    ROLLOUT_TOKENS,
    AGENT_TOKENS,
    CALL_TOKENS,
    SEAM_TOKENS,
    ANY_TOKENS,
    ERROR_TYPE,
    STAGE,
    ROLLOUT_IDS,
    TAGS,
    FILES,
) = range(24)
WIDTH = 24

# Attributes kept on a top span (a trace's root candidates), to name it as the list does
# (``model.display_name``) and, for a job's own ``gym.job`` span, its counts.
TOP_KEYS = frozenset(
    {
        attr.DESTINATION,
        attr.DESTINATION_ROUTE,
        attr.URL_FULL,
        attr.SERVER_ADDRESS,
        attr.HTTP_REQUEST_METHOD,
        attr.JOB_ID,
        attr.ROLLOUT_ID,
    }
)
TOP_PREFIXES = (attr.JOB_PREFIX,)
# Attributes ``--attr KEY=VALUE`` answers from the table (span or resource attributes);
# any other key makes ``view`` read the spans themselves.
TAG_KEYS = frozenset(
    {
        attr.JOB_ID,
        attr.ROLLOUT_ID,
        attr.SERVER_TYPE,
        attr.SERVER_NAME,
        attr.RUN_ID,
        attr.SERVICE_NAME,
        attr.HOST_NAME,
        attr.ERROR_TYPE,
        attr.FAILURE_STAGE,
        attr.REQUEST_MODEL,
        attr.RESPONSE_MODEL,
        attr.AGENT_NAME,
        attr.TOOL_NAME,
        attr.OPERATION,
        attr.HTTP_ROUTE,
    }
)
# What the reader looks at: the attributes the writer keeps in the facts files, no more
_WANTED = span_facts.ROOT_KEYS
assert TOP_KEYS <= _WANTED and TAG_KEYS <= _WANTED
_KIND_NAMES = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
_KIND_NUMBERS = {name: number for number, name in _KIND_NAMES.items()}
_SEAM_FIELDS = {span_facts.MODEL: MODEL, span_facts.TOOLS: TOOLS, span_facts.VERIFY: VERIFY}
_ERROR = (2, "STATUS_CODE_ERROR")
STARTUP_SPANS = ("gym.startup", "gym.server.startup")
JOB_SPAN = "gym.job"


def tag(key: str, value: object) -> str:
    """``key=value`` as ``--attr`` compares it (booleans lower case)."""
    if isinstance(value, bool):
        value = str(value).lower()
    return f"{key}={value}"


def _better(current, candidate) -> bool:
    return current is None or candidate < current


def _new(start: int, end: int, index: int) -> list:
    partial: list = [None] * WIDTH
    partial[FILES] = [index]
    partial[START], partial[END], partial[COUNT], partial[ERRORS] = start, end, 0, 0
    partial[SERVICES], partial[MODEL], partial[TOOLS], partial[VERIFY] = set(), 0.0, 0.0, 0.0
    partial[TOPS], partial[ROLLOUT_IDS], partial[TAGS] = [], set(), set()
    partial[CALL_TOKENS], partial[SEAM_TOKENS], partial[ANY_TOKENS] = [0, 0, 0], [0, 0, 0], [0, 0, 0]
    return partial


def _add_usage(total: list, found: dict) -> None:
    total[0] += _whole(found.get(attr.INPUT_TOKENS))
    total[1] += _whole(found.get(attr.OUTPUT_TOKENS))
    total[2] += 1


def _whole(value: object) -> int:
    return outcome.whole(value) or 0


def _resource(attributes: dict) -> tuple[str, object, list[str]]:
    """A resource's service name, Gym server type and the tags ``--attr`` answers."""
    tags = [tag(key, value) for key, value in attributes.items() if key in TAG_KEYS]
    return str(attributes.get(attr.SERVICE_NAME, "?")), attributes.get(attr.SERVER_TYPE), tags


def add_request(partials: dict[str, list], request: dict, index: int = 0) -> None:
    """Every span of one OTLP-JSON ``ExportTraceServiceRequest`` into ``partials`` (by trace
    id), read from the file numbered ``index``."""
    for resource_spans in request.get("resourceSpans", ()):
        resource = {}
        for kv in resource_spans.get("resource", {}).get("attributes", ()):
            key = kv.get("key")
            if key in _WANTED:
                resource[key] = _value(kv.get("value") or {})
        service, server_type, tags = _resource(resource)
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                top = not span.get("parentSpanId")
                found = {}
                wanted = _WANTED if top else span_facts.KEYS  # what the writer's facts keep
                for kv in span.get("attributes", ()):
                    key = kv.get("key")
                    if key in wanted or key.startswith(TOP_PREFIXES):
                        found[key] = _value(kv.get("value") or {})
                name = span.get("name", "")
                kind = span.get("kind", 0)
                kind = kind if isinstance(kind, int) else _KIND_NUMBERS.get(str(kind).removeprefix("SPAN_KIND_"), 0)
                start, end = int(span.get("startTimeUnixNano", 0)), int(span.get("endTimeUnixNano", 0))
                links = span.get("links")
                _add(
                    partials,
                    span.get("traceId", ""),
                    span.get("spanId", ""),
                    top,
                    name,
                    kind,
                    start,
                    end,
                    (span.get("status") or {}).get("code") in _ERROR,
                    found,
                    [(link.get("traceId", ""), link.get("spanId", "")) for link in links] if links else (),
                    service,
                    span_facts.seam(kind, server_type, str(found.get(attr.HTTP_ROUTE) or name.partition(" ")[2])),
                    tags,
                    index,
                )


def add_facts_line(partials: dict[str, list], record: dict, index: int = 0) -> None:
    """One line of a segment's facts file (``fastpath/span_facts.py``), the file numbered
    ``index``, into ``partials``."""
    for group in record.get("groups", ()):
        service, _server_type, tags = _resource(group.get("resource") or {})
        for trace_id, start, end, flags, seam, name, span_id, kept, links in group.get("spans", ()):
            partial = partials.get(trace_id)
            if (
                partial is not None
                and not (flags & 3 or links)
                and (not name or (name not in span_facts.NAMED and start >= partial[EARLIEST][0]))
                and (not kept or _tags_only(kept, partial[TAGS]))
            ):
                # the usual span: no outcome, not a root, not the earliest: its times, seam and tags alone
                if service not in partial[SERVICES]:
                    partial[SERVICES].add(service)
                    partial[TAGS].update(tags)
                if partial[FILES][-1] != index:
                    partial[FILES].append(index)
                if start < partial[START]:
                    partial[START] = start
                if end > partial[END]:
                    partial[END] = end
                partial[COUNT] += 1
                if seam:
                    partial[_SEAM_FIELDS[seam]] += max(0, end - start) / 1e6
                continue
            _add(
                partials,
                trace_id,
                span_id or "",
                bool(flags & 2),
                name or "",
                flags >> 2,
                start,
                end,
                bool(flags & 1),
                {kv["key"]: _value(kv.get("value") or {}) for kv in kept} if kept else {},
                [tuple(link) for link in links] if links else (),
                service,
                seam,
                tags,
                index,
            )


# Kept attributes that say nothing of a trace's outcome: a span with only these is tagged, no more
_PLAIN_TAGS = TAG_KEYS - {attr.ROLLOUT_ID, attr.ERROR_TYPE, attr.FAILURE_STAGE}


def _tags_only(kept: list[dict], tags: set) -> bool:
    """Whether ``kept`` holds plain tags alone; if so, they are added to ``tags``."""
    for kv in kept:
        if kv.get("key") not in _PLAIN_TAGS:
            return False
    for kv in kept:
        for kind, value in (kv.get("value") or {}).items():  # (one: its text is the tag's, as ``tag`` writes it)
            if kind in ("stringValue", "intValue", "doubleValue"):
                tags.add(f"{kv['key']}={value}")
            else:
                tags.add(tag(kv["key"], _value(kv["value"])))
    return True


def _add(
    partials: dict[str, list],
    trace_id: str,
    span_id: str,
    top: bool,
    name: str,
    kind: int,
    start: int,
    end: int,
    error: bool,
    found: dict,
    links,
    service: str,
    seam: int,
    resource_tags: list,
    index: int,
) -> None:
    partial = partials.get(trace_id)
    if partial is None:
        partial = partials[trace_id] = _new(start, end, index)
    else:
        if start < partial[START]:
            partial[START] = start
        if end > partial[END]:
            partial[END] = end
        if partial[FILES][-1] != index:
            partial[FILES].append(index)
    partial[COUNT] += 1
    if error:
        partial[ERRORS] += 1
    if service not in partial[SERVICES]:
        partial[SERVICES].add(service)
        partial[TAGS].update(resource_tags)
    if top or partial[EARLIEST] is None or start < partial[EARLIEST][0]:
        # (attributes as found: ``resolve`` keeps those a top span shows)
        entry = (start, span_id, name, _KIND_NAMES.get(kind, str(kind)), end, found, tuple(links), service, error)
        if top:
            partial[TOPS].append(entry)
        if partial[EARLIEST] is None or start < partial[EARLIEST][0]:
            partial[EARLIEST] = entry
    if seam:
        partial[_SEAM_FIELDS[seam]] += max(0, end - start) / 1e6
    if not found:
        return
    for key in found.keys() & TAG_KEYS:
        partial[TAGS].add(tag(key, found[key]))
    if attr.ROLLOUT_ID in found:
        partial[ROLLOUT_IDS].add(str(found[attr.ROLLOUT_ID]))
    rank = 0 if top else 1 if name == "gym.rollout" else 2 if name == "gym.verify" else 3
    if rank < 3:
        for field, key in ((REWARD, attr.REWARD), (MASK, attr.MASK_SAMPLE)):
            if key in found and _better(partial[field], (rank, start)):
                partial[field] = (rank, start, found[key])
    for field, key in ((TASK, attr.TASK_INDEX), (REPEAT, attr.ROLLOUT_INDEX)):
        if key in found and _better(partial[field], (0 if top else 1, start)):
            partial[field] = (0 if top else 1, start, found[key])
    for field, key in ((attr.ERROR_TYPE, ERROR_TYPE), (attr.FAILURE_STAGE, STAGE)):
        if field in found and _better(partial[key], (start,)):
            partial[key] = (start, str(found[field]))
    if attr.ROLLOUT_INPUT_TOKENS in found or attr.ROLLOUT_OUTPUT_TOKENS in found:
        candidate = (0 if top else 1, start, _whole(found.get(attr.ROLLOUT_INPUT_TOKENS)))
        candidate += (_whole(found.get(attr.ROLLOUT_OUTPUT_TOKENS)),)
        if _better(partial[ROLLOUT_TOKENS], candidate):
            partial[ROLLOUT_TOKENS] = candidate
    if attr.INPUT_TOKENS in found or attr.OUTPUT_TOKENS in found:
        operation = found.get(attr.OPERATION)
        if operation == "invoke_agent":
            candidate = (0 if top else 1, start, _whole(found.get(attr.INPUT_TOKENS)))
            candidate += (_whole(found.get(attr.OUTPUT_TOKENS)),)
            if _better(partial[AGENT_TOKENS], candidate):
                partial[AGENT_TOKENS] = candidate
        elif operation == "chat":
            _add_usage(partial[CALL_TOKENS] if kind == 3 else partial[SEAM_TOKENS], found)
        _add_usage(partial[ANY_TOKENS], found)


def _first(a, b):
    """The better of two candidates: by rank and start (a top span: start and span id)."""
    if a is None:
        return b
    if b is None:
        return a
    return b if b[:2] < a[:2] else a


def merge(into: list, other: list) -> None:
    """``other`` (the same trace's partial from another file) into ``into``."""
    into[START] = min(into[START], other[START])
    into[END] = max(into[END], other[END])
    into[COUNT] += other[COUNT]
    into[ERRORS] += other[ERRORS]
    into[SERVICES] |= set(other[SERVICES])
    for field in (MODEL, TOOLS, VERIFY):
        into[field] += other[field]
    into[TOPS] = list(into[TOPS]) + list(other[TOPS])
    for field in (EARLIEST, REWARD, MASK, TASK, REPEAT, ROLLOUT_TOKENS, AGENT_TOKENS, ERROR_TYPE, STAGE):
        into[field] = _first(into[field], other[field])
    for field in (CALL_TOKENS, SEAM_TOKENS, ANY_TOKENS):
        into[field] = [a + b for a, b in zip(into[field], other[field])]
    into[ROLLOUT_IDS] = set(into[ROLLOUT_IDS]) | set(other[ROLLOUT_IDS])
    into[FILES] = list(dict.fromkeys(list(into[FILES]) + list(other[FILES])))
    into[TAGS] = set(into[TAGS]) | set(other[TAGS])


def partials_of(lines: Iterable[str], source: str = "", into: dict | None = None, index: int = 0) -> dict[str, list]:
    """The partials of one file's lines (OTLP-JSON requests, one per line), added ``into``
    those of other files when given; a line that is not JSON (a write cut short) is skipped,
    as ``setup.files`` skips it."""
    from gym_autoinstr.setup.files import json_lines

    partials: dict[str, list] = {} if into is None else into
    for request in json_lines(lines, source):
        add_request(partials, request, index)
    return partials


# Row fields (a tuple: what the table keeps of a trace once its files are merged)
(
    R_TRACE,
    R_START,
    R_END,
    R_COUNT,
    R_ERROR,
    R_SERVICES,
    R_SEAMS,
    R_ROOT,
    R_TOPS,
    R_REWARD,
    R_MASK,
    R_TASK,
    R_REPEAT,
    R_TOKENS,
    R_FAILURE,
    R_ROLLOUT_IDS,
    R_TAGS,
    R_FILES,
    R_KIND,
    R_JOB,
) = range(20)
ROLLOUT, STARTUP, JOB = 0, 1, 2  # R_KIND: what a trace is


def _mask(value: object) -> bool | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def _tokens(partial: list) -> tuple[int, int] | None:
    for field in (ROLLOUT_TOKENS, AGENT_TOKENS):
        if partial[field] is not None:
            return partial[field][2], partial[field][3]
    for field in (CALL_TOKENS, SEAM_TOKENS, ANY_TOKENS):
        tokens_in, tokens_out, found = partial[field]
        if found:
            return tokens_in, tokens_out
    return None


def resolve(trace_id: str, partial: list) -> tuple:
    """A trace's merged partial as its row (``R_*`` fields)."""
    # a span read twice (a run copied beside itself) is one top span
    unique = {entry[1]: entry for entry in partial[TOPS]}.values()
    tops = sorted((_shared_entry(e) for e in unique), key=lambda e: e[:2]) or [_shared_entry(partial[EARLIEST])]
    failure = []
    if partial[ERROR_TYPE] is not None:
        failure.append(("error_type", partial[ERROR_TYPE][1]))
    if partial[STAGE] is not None:
        failure.append(("stage", partial[STAGE][1]))
    reward = outcome.number(partial[REWARD][2]) if partial[REWARD] else None
    task = outcome.whole(partial[TASK][2]) if partial[TASK] else None
    repeat = outcome.whole(partial[REPEAT][2]) if partial[REPEAT] else None
    seams = (partial[MODEL], partial[TOOLS], partial[VERIFY])
    return (
        trace_id,
        partial[START],
        partial[END],
        partial[COUNT],
        partial[ERRORS] > 0,
        _same(tuple(sorted(partial[SERVICES]))),
        seams,
        tops[0],
        tuple(tops),
        reward,
        _mask(partial[MASK][2]) if partial[MASK] else None,
        task,
        repeat,
        _tokens(partial),
        _same(tuple(failure)),
        tuple(sorted(partial[ROLLOUT_IDS])),
        _same(tuple(map(sys.intern, sorted(partial[TAGS])))),
        tuple(partial[FILES]),
        STARTUP
        if any(e[2].startswith(STARTUP_SPANS) for e in tops)
        else JOB
        if any(e[2] == JOB_SPAN for e in tops)
        else ROLLOUT,
        next((_same(str(e[5][attr.JOB_ID])) for e in tops if attr.JOB_ID in e[5]), None),
    )


# Values many rows hold alike (service lists, tags, names, job ids), one object each: a
# million rows stay about a kilobyte each, and marshal writes each once.
_SHARED: dict = {}


def _same(value):
    if len(_SHARED) > 1_000_000:
        _SHARED.clear()
    return _SHARED.setdefault(value, value)


def _shared_entry(entry: tuple) -> tuple:
    start, span_id, name, kind, end, found, links, service, error = entry
    attributes = {
        _same(k): _same(v) if isinstance(v, str) else v
        for k, v in found.items()
        if k in TOP_KEYS or (name == JOB_SPAN and k.startswith(TOP_PREFIXES))
    }
    return (start, span_id, _same(name), _same(kind), end, attributes, tuple(links), _same(service), error)


def trace_spans(lines: Iterable[str], trace_ids: set[str]) -> Iterator[dict]:
    """The spans (``setup.files`` dicts) of ``trace_ids`` among one file's lines: a line is
    parsed only when it names one of them."""
    from gym_autoinstr.setup.files import spans_from_request

    for line in lines:
        if not any(trace_id in line for trace_id in trace_ids):
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError:
            continue
        for span in spans_from_request(request):
            if span["trace_id"] in trace_ids:
                yield span
