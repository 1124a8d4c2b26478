"""Benchmark probe: OpenTelemetry's start-up exactly as ``opentelemetry-instrument`` runs
it (where OpenTelemetry is installed), then what the benchmark wants to read from inside
each Gym server process.

The trio is launched with this directory on ``PYTHONPATH`` instead of through
``opentelemetry-instrument`` (whose own sitecustomize would shadow this one); every
Python process Gym starts inherits it.  Only the Gym server processes (those with
``NEMO_GYM_CONFIG_PATH``) do anything, and only with
``GYM_AUTOINSTR_BENCH_PROBE_DIR`` set.  Each writes a snapshot to
``$GYM_AUTOINSTR_BENCH_PROBE_DIR/<server>-<pid>.json`` every 200 ms, and at once when
the benchmark bumps the number in ``$GYM_AUTOINSTR_BENCH_PROBE_DIR/request`` (the
snapshot then carries that number as ``seq``, so the reader knows it is fresh).

What a snapshot holds, each part switched on by its own variable:

* ``GYM_AUTOINSTR_BENCH_SDK_COUNTERS`` (default on; the burst): counters on the SDK
  pipeline OpenTelemetry's start-up built: spans ended (a span processor after the
  configured ones), spans handed to the exporter and accepted, spans the
  ``BatchSpanProcessor`` dropped (its own drop counter).  Nothing in the pipeline is
  replaced or reconfigured.
* ``GYM_AUTOINSTR_BENCH_GC=1`` (the attribution, in bare Gym and ours alike):
  collections per generation with their pause (wall and the collecting thread's CPU,
  from the first ``gc.callbacks`` entry's start to the last one's stop, so every other
  callback's work is inside), objects collected; the Python threads (native id ->
  name), so the reader can tell the request thread from exporter threads in
  ``/proc/<pid>/task``; and, on a request whose number is negative, the heavy numbers
  (tracked objects, modules loaded), which cost a full walk of the heap.
"""

import os

try:
    from opentelemetry.instrumentation.auto_instrumentation import sitecustomize as _otel_start  # noqa: F401  (runs initialize())
except ImportError:
    _otel_start = None


def _flag(name: str, default: str) -> bool:
    return os.environ.get(name, default).strip().lower() not in ("", "0", "false", "no", "off")


def _sdk_counters(lock) -> "tuple[dict, list] | None":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return None
    counts = {"ended": 0, "exported": 0, "export_failed": 0, "dropped": 0, "batch_processors": 0}

    class Counting(SpanProcessor):
        def on_end(self, span) -> None:
            with lock:
                counts["ended"] += 1

    try:
        from gym_autoinstr.fastpath.batching import EncodingSpanProcessor
    except ImportError:
        EncodingSpanProcessor = None
    batch_processors = []
    encoding = False
    for processor in getattr(provider._active_span_processor, "_span_processors", ()):
        if EncodingSpanProcessor is not None and type(processor) is EncodingSpanProcessor:
            # gym-autoinstr's own processor: counted in place (an extra processor on the
            # provider would switch our lean spans off and measure something else).
            encoding = True
            batch_processors.append(processor)
            on_end, exporter = processor.on_end, processor._exporter
            export = exporter.export

            def counted_on_end(span, _on_end=on_end, _processor=processor) -> None:
                dropped = _processor.dropped_spans
                _on_end(span)
                with lock:
                    counts["ended"] += 1
                    counts["dropped"] += _processor.dropped_spans - dropped

            def counted_encoded_export(batch, _export=export):
                result = _export(batch)
                with lock:
                    counts["exported" if result == SpanExportResult.SUCCESS else "export_failed"] += len(batch)
                return result

            processor.on_end = counted_on_end
            exporter.export = counted_encoded_export
            continue
        if not isinstance(processor, BatchSpanProcessor):
            continue
        inner = processor._batch_processor
        batch_processors.append(inner)
        exporter = inner._exporter
        export = exporter.export

        def counted_export(batch, _export=export):
            result = _export(batch)
            with lock:
                counts["exported" if result == SpanExportResult.SUCCESS else "export_failed"] += len(batch)
            return result

        exporter.export = counted_export
        metrics = inner._metrics
        drop_items = metrics.drop_items

        def counted_drop(count, *args, _drop=drop_items, **kwargs):
            with lock:
                counts["dropped"] += count
            return _drop(count, *args, **kwargs)

        metrics.drop_items = counted_drop
    counts["batch_processors"] = len(batch_processors)
    if not encoding:
        provider.add_span_processor(Counting())
    return counts, batch_processors


def _gc_timing() -> dict:
    """Per generation: [collections, pause wall s, pause CPU s (collecting thread), collected]."""
    import gc
    import time

    stats = {0: [0, 0.0, 0.0, 0], 1: [0, 0.0, 0.0, 0], 2: [0, 0.0, 0.0, 0]}
    started = [0.0, 0.0]
    wall, cpu = time.perf_counter, time.thread_time

    def on_start(phase, info) -> None:
        if phase == "start":
            started[0] = wall()
            started[1] = cpu()

    def on_stop(phase, info) -> None:
        if phase == "stop":
            row = stats.get(info.get("generation"))
            if row is not None:
                row[0] += 1
                row[1] += wall() - started[0]
                row[2] += cpu() - started[1]
                row[3] += info.get("collected", 0)

    # First for "start", last for "stop": the pause includes every other callback.
    gc.callbacks.insert(0, on_start)
    gc.callbacks.append(on_stop)
    return stats


def _install(directory: str, server: str) -> None:
    import gc
    import json
    import sys
    import threading

    lock = threading.Lock()
    sdk = None
    if _otel_start is not None and _flag("GYM_AUTOINSTR_BENCH_SDK_COUNTERS", "1"):
        sdk = _sdk_counters(lock)
    gc_stats = _gc_timing() if _flag("GYM_AUTOINSTR_BENCH_GC", "0") else None
    path = os.path.join(directory, f"{server}-{os.getpid()}.json")
    request_path = os.path.join(directory, "request")

    def write(seq: int, heavy: bool) -> None:
        data = {"pid": os.getpid(), "server": server, "seq": seq}
        if sdk is not None:
            counts, batch_processors = sdk
            with lock:
                data.update(counts, queued=sum(len(b._queue) for b in batch_processors))
        if gc_stats is not None:
            data["gc"] = {str(g): list(row) for g, row in gc_stats.items()}
            data["threads"] = {str(t.native_id): t.name for t in threading.enumerate() if t.native_id}
            if heavy:
                data["tracked_objects"] = len(gc.get_objects())
                data["modules"] = len(sys.modules)
                data["otel_modules"] = sum(1 for m in list(sys.modules) if m.split(".")[0] == "opentelemetry")
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)

    def loop() -> None:
        event = threading.Event()
        seq, last_mtime, since_write, heavy = 0, None, 0, False
        while True:
            try:
                mtime = os.stat(request_path).st_mtime_ns
            except OSError:
                mtime = None
            if mtime != last_mtime and mtime is not None:
                last_mtime = mtime
                try:
                    with open(request_path) as fh:
                        seq = int(fh.read().strip() or 0)
                    heavy = seq < 0
                except (OSError, ValueError):
                    pass
                since_write = 4  # write now
            since_write += 1
            if since_write >= 4:
                since_write = 0
                try:
                    write(seq, heavy)
                except OSError:
                    pass
                heavy = False
            event.wait(0.05)

    threading.Thread(target=loop, name="bench-probe", daemon=True).start()


if os.environ.get("GYM_AUTOINSTR_BENCH_PROBE_DIR") and os.environ.get("NEMO_GYM_CONFIG_PATH"):
    try:
        _install(os.environ["GYM_AUTOINSTR_BENCH_PROBE_DIR"], os.environ["NEMO_GYM_CONFIG_PATH"])
    except Exception as error:  # a probe must never stop a server
        import sys

        print(f"bench probe not installed: {error!r}", file=sys.stderr)
