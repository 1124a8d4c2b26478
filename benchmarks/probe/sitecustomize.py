"""Benchmark probe: OpenTelemetry's start-up exactly as ``opentelemetry-instrument`` runs
it, then counters on the SDK pipeline that start-up built.

Used only by the burst benchmark: the trio is launched with this directory on
``PYTHONPATH`` instead of through ``opentelemetry-instrument`` (whose own sitecustomize
would shadow this one); every Python process Gym starts inherits it.  In each Gym server
process it counts spans ended (a span processor after the configured ones), spans handed
to the exporter and accepted, and spans the ``BatchSpanProcessor`` dropped (its own drop
counter), and writes them to ``$GYM_AUTOINSTR_BENCH_PROBE_DIR/<server>-<pid>.json``
every 200 ms.  Nothing in the pipeline is replaced or reconfigured.
"""

import os

try:
    from opentelemetry.instrumentation.auto_instrumentation import sitecustomize as _otel_start  # noqa: F401  (runs initialize())
except ImportError:
    _otel_start = None


def _install(directory: str, server: str) -> None:
    import json
    import threading

    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return
    counts = {"ended": 0, "exported": 0, "export_failed": 0, "dropped": 0, "batch_processors": 0}
    lock = threading.Lock()

    class Counting(SpanProcessor):
        def on_end(self, span) -> None:
            with lock:
                counts["ended"] += 1

    batch_processors = []
    for processor in getattr(provider._active_span_processor, "_span_processors", ()):
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
    provider.add_span_processor(Counting())
    path = os.path.join(directory, f"{server}-{os.getpid()}.json")

    def write() -> None:
        with lock:
            data = dict(counts, queued=sum(len(b._queue) for b in batch_processors), pid=os.getpid(), server=server)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)

    def loop() -> None:
        event = threading.Event()
        while True:
            try:
                write()
            except OSError:
                pass
            event.wait(0.2)

    threading.Thread(target=loop, name="bench-probe", daemon=True).start()


if _otel_start is not None and os.environ.get("GYM_AUTOINSTR_BENCH_PROBE_DIR") and os.environ.get("NEMO_GYM_CONFIG_PATH"):
    try:
        _install(os.environ["GYM_AUTOINSTR_BENCH_PROBE_DIR"], os.environ["NEMO_GYM_CONFIG_PATH"])
    except Exception as error:  # a probe must never stop a server
        import sys

        print(f"bench probe not installed: {error!r}", file=sys.stderr)
