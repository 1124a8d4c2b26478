"""The benchmark's variants: what each trio runs with, and what it is (for ``--help`` and the
reports).  Standard library only: ``./run-benchmarks --help`` reads it without a venv."""

from __future__ import annotations

SPAN_GROUPS = "GYM_AUTOINSTR_SPAN_GROUPS"
RUN_ID = "NEMO_GYM_OTEL_RUN_ID"  # ours: the resource's nemo.gym.run.id, so the sink tells the trios apart
SAMPLED_OUT = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
INERT = {SPAN_GROUPS: "none", "OTEL_SDK_DISABLED": "true"}  # ours loaded and patched, no SDK
STOCK = {SPAN_GROUPS: "default", "GYM_AUTOINSTR_FAST_PATH": "off"}  # every fast-path replacement off
VARIANT_KEYS = (
    "bare",
    "generic",
    "inert",
    "off",
    "default",
    "files",
    "stock",
    "sampled",
    "per_rollout",
    "all",
    "bare2",
)
UNINSTRUMENTED = ("bare", "bare2", "inert")  # no metrics of ours to count at the sink
# Nothing configured for export: spans and metrics go to the embedded default's run directory
# (GYM_AUTOINSTR_OUTPUT_DIR, one per trio), never to the sink; counted in that directory instead.
IN_FILES = ("files",)
ONLY_WHEN_NAMED = ("bare2", "inert")  # not in a run that names no variants


def _env_text(env: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())


# What each variant is, for the commands' --help and reports (bare, the reference, is always run)
VARIANT_HELP = {
    "generic": "the generic OpenTelemetry stack",
    "inert": f"ours loaded and patched with {_env_text(INERT)}: the footprint alone",
    "off": "ours, span groups none, metrics on",
    "default": "ours, the default preset, exporting OTLP to the benchmark's collector",
    "files": "ours, the default preset with nothing configured for export: the embedded default's "
    "OTLP-JSON files in a run directory, what the README's first command gets",
    "stock": f"ours default with {_env_text({'GYM_AUTOINSTR_FAST_PATH': 'off'})}: the stock SDK path, "
    "what the fast path buys",
    "sampled": f"ours default with {_env_text(SAMPLED_OUT)}, rollouts sent without traceparent",
    "per_rollout": "ours, the per_rollout preset",
    "all": "ours, every span group",
    "bare2": "a second bare trio: an A/A",
}


def variants_help(by_default: bool = False) -> str:
    """The variants besides bare, each with what it is, in ``VARIANT_KEYS`` order
    (``by_default``: marking those a run that names none leaves out)."""
    return "; ".join(
        f"{key}: {VARIANT_HELP[key]}" + (" (only when named)" if by_default and key in ONLY_WHEN_NAMED else "")
        for key in VARIANT_KEYS
        if key != "bare"
    )
