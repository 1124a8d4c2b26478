"""Shared fixtures.

In-process tests share one SDK provider that records into memory; the real-process
tests (``test_realgym_*.py``, in any folder, marked ``realgym``) use the harness in
``tests/harness`` instead; the programs they run are in ``tests/fixtures``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

REALGYM_PREFIX = "test_realgym_"
# Compares the in-process selection's outcomes at both ends of the OpenTelemetry range, the
# newest end's possibly from this session's own: it runs after every other test.
RUNS_LAST = "test_sdk_matrix.py"
# Under pytest-xdist (``GYM_TEST_WORKERS=N ./run-tests``) a file's tests run on one worker
# (they share module fixtures: a fleet, a cluster), and so do the files of one group here:
# they share a session fixture (a Slurm cluster, an sshd) that would otherwise start once per
# worker (``pytest_xdist_make_scheduler``).
SHARED_WORKER = {
    "test_harness_slurm.py": "slurm",
    "test_harness_ssh.py": "slurm",
    "test_realgym_slurm.py": "slurm",
    # the collection-job fleets (job_fleets)
    "test_realgym_job.py": "jobs",
    "test_realgym_outcome.py": "jobs",
    "test_realgym_follow.py": "jobs",
    "test_realgym_compare.py": "jobs",
    "test_realgym_export.py": "jobs",
    "test_realgym_run_table.py": "jobs",
}
# The files that take longest (tests/README.md, "Where the time goes"), longest first: under
# xdist they are handed out first, so the short ones fill the workers' gaps at the end.
LONGEST_FIRST = (  # worker seconds of a two-worker run (tests/README.md, "Now")
    "test_realgym_trace.py",
    "test_realgym_faults.py",
    "test_realgym_job.py",  # with test_realgym_outcome.py: one group, one worker
    "test_realgym_ray.py",
    "test_realgym_seams.py",
    "test_realgym_ray_actor.py",
    "test_realgym_backends.py",
    "test_realgym_losses.py",  # three fleets, about 65 s
    "test_realgym_phoenix.py",
    "test_realgym_slurm.py",
    "test_realgym_venvs.py",
    "test_realgym_coexistence.py",
    "test_doctor.py",
    "test_realgym_harness_trio.py",
    "test_ray_actor.py",
    "test_realgym_version_matrix.py",
    "test_realgym_metrics.py",
    "test_realgym_secrets.py",
    "test_realgym_sdk_floor.py",
    "test_realgym_readme.py",
    "test_realgym_demo.py",
    "test_realgym_view.py",
    "test_patch_lifecycle.py",
    "test_view_scale.py",
    "test_doctor_pipeline.py",
    "test_realgym_eval_submit.py",
    "test_realgym_doctor.py",
    "test_realgym_sandbox.py",
    "test_harness_slurm.py",
)


def pytest_addoption(parser):
    from tests.harness import selection

    selection.addoption(parser)


def pytest_configure(config):
    from tests.harness import selection

    selection.register(config, REPO)
    # the commands' caches of the runs they read (``commands/runs/store.py``): the session's
    # own, not the user's (every CLI the tests start inherits it)
    if "GYM_AUTOINSTR_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["GYM_AUTOINSTR_CACHE_DIR"] = tempfile.mkdtemp(prefix="gym-autoinstr-cache-")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: every collected test is checked
def pytest_collection_modifyitems(config, items):
    """The ``realgym`` marker and the file name agree: a test that starts real Gym processes
    is marked ``realgym`` and lives in a ``test_realgym_*.py`` file, and every test in such a
    file is marked (``pytestmark = pytest.mark.realgym``).  A mismatch fails the collection:
    ``-m "not realgym"`` would otherwise run a real fleet, or skip an in-process test.

    Then the tests of ``RUNS_LAST`` are moved to the end (in their order); in an xdist
    worker ``LONGEST_FIRST`` go first too (the order in which files are handed out)."""
    wrong = []
    for item in items:
        named = item.path.name.startswith(REALGYM_PREFIX)
        marked = item.get_closest_marker("realgym") is not None
        if named and not marked:
            wrong.append(f"{item.nodeid}: in a {REALGYM_PREFIX}*.py file but not marked realgym")
        elif marked and not named:
            wrong.append(f"{item.nodeid}: marked realgym but not in a {REALGYM_PREFIX}*.py file")
    if wrong:
        raise pytest.UsageError(
            "the realgym marker and the file names disagree (mark the whole module with "
            "`pytestmark = pytest.mark.realgym` and name it test_realgym_*.py, or move the "
            "test):\n  " + "\n  ".join(wrong)
        )
    if not hasattr(config, "workerinput"):  # (not an xdist worker: the controller collects nothing)
        items.sort(key=lambda item: item.path.name == RUNS_LAST)  # stable: the rest keep their order
        return

    def order(item):
        name = item.path.name
        return name == RUNS_LAST, LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=order)


def pytest_sessionfinish(session, exitstatus):
    """The Ray clusters the session's fleets shared (tests/harness/shared_ray.py) end with it."""
    import sys

    shared_ray = sys.modules.get("tests.harness.shared_ray")
    if shared_ray is not None:
        shared_ray.stop_all()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with a scope per ``worker_group``: a file's tests, or a shared
    group's files, go to one worker, handed out in collection order (not xdist's default, the
    scopes with most tests first: that hands out the real-Gym files, a few long tests each,
    last, where nothing is left to run beside them)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(REPO / nodeid.split("::", 1)[0])

    return ByGroup(config, log)


def worker_group(path: Path) -> str:
    """The xdist scope of a test file: its shared group, else the file itself."""
    return SHARED_WORKER.get(path.name) or path.resolve().relative_to(REPO).as_posix()


@pytest.fixture(scope="session")
def memory_exporter():
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "tests"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another test already set a global tracer provider")
    return exporter


@pytest.fixture
def spans(memory_exporter):
    memory_exporter.clear()
    yield memory_exporter
    memory_exporter.clear()


@pytest.fixture(scope="session")
def instrumented(memory_exporter):
    # Gym reads its whole config from this variable in a spawned server; an empty
    # config is enough for `server_utils.request` (its aiohttp client uses defaults).
    os.environ.setdefault("NEMO_GYM_CONFIG_DICT", "{}")
    from gym_autoinstr.instrumentor import GymInstrumentor

    os.environ.setdefault("GYM_AUTOINSTR_SPAN_GROUPS", "all")
    instrumentor = GymInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()
    _close_gyms_client()


def _close_gyms_client() -> None:
    """Gym closes its global aiohttp client at exit on a new event loop, which fails for
    a client made on the tests' shared loop: close it on that loop instead."""
    server_utils = sys.modules.get("nemo_gym.server_utils")
    client = getattr(server_utils, "_GLOBAL_AIOHTTP_CLIENT", None)
    if client is not None:
        from tests.harness.servers import run_async

        run_async(client.close())
        server_utils._GLOBAL_AIOHTTP_CLIENT = None


@pytest.fixture(scope="module")
def policy_model():
    """The deterministic OpenAI-compatible upstream (examples/policy_model.py), per module."""
    from tests.harness.trio import PolicyModel

    with PolicyModel() as model:
        yield model


@pytest.fixture(scope="session")
def bare_gym(tmp_path_factory):
    """``bare_gym(version)``: the session's one uninstrumented run of that Gym version
    (tests/harness/bare.py), made on first use, against a policy model of its own."""
    from tests.harness.bare import bare_run
    from tests.harness.trio import PolicyModel

    runs = {}
    models = []

    def run(version: str):
        if version not in runs:
            if not models:
                models.append(PolicyModel().start())
            runs[version] = bare_run(version, tmp_path_factory.mktemp(f"bare-{version}"), models[0].url)
        return runs[version]

    yield run
    for model in models:
        model.stop()


@pytest.fixture(scope="session")
def job_fleets(tmp_path_factory):
    """``job_fleets(version)``: the session's traced fleet of that Gym version for collection
    jobs (tests/harness/jobs.py), started on first use, with a policy model of its own."""
    from tests.harness.jobs import JobFleet
    from tests.harness.trio import PolicyModel

    fleets: dict = {}
    models = []

    def get(version: str):
        if version not in fleets:
            if not models:
                models.append(PolicyModel().start())
            workdir = tmp_path_factory.mktemp(f"jobs-{version}")
            fleets[version] = JobFleet(version, workdir, models[0].url).start()
        return fleets[version]

    yield get
    for fleet in fleets.values():
        fleet.stop()
    for model in models:
        model.stop()


@pytest.fixture(scope="session")
def campaign_jobs(job_fleets):
    """Two collection jobs on the 0.4.0 job fleet, as two checkpoints' runs of the same tasks
    (tests/harness/campaign.py), run once for ``compare`` and ``export``."""
    from tests.harness.campaign import run_two_jobs

    return run_two_jobs(job_fleets("0.4.0"))


@pytest.fixture
def collector(tmp_path):
    """A real collector (rotel) forwarding OTLP to the test's sink, per test."""
    from tests.harness.collector import Collector

    with Collector(log_dir=tmp_path / "collector") as running:
        yield running


def _require_system(what: str, lacking: list[str], packages: str, root_reason: str) -> None:
    """Skip (fail under ``CI=true``) a test whose harness needs Debian packages or root."""
    reason = ""
    if lacking:
        reason = f"{what} (missing {', '.join(lacking)}; apt-get install {packages})"
    elif os.geteuid() != 0:
        reason = root_reason
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real single-node Slurm cluster (tests/harness/slurm.py), started on first use and
    shared by the session.  Without Slurm (``./run-tests`` installs it as root) or root, the
    tests skip; under ``CI=true`` they fail instead."""
    from tests.harness.slurm import APT_PACKAGES, SlurmCluster, missing

    _require_system(
        "Slurm is not installed", missing(), APT_PACKAGES, "the Slurm test cluster runs its daemons as root"
    )
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def ssh_server(tmp_path_factory):
    """A real sshd on loopback (tests/harness/ssh.py), started on first use and shared by the
    session; ``ssh_server.client({...})`` gives a client whose sessions carry those variables.
    Without OpenSSH's server or rsync (``./run-tests`` installs them as root) or root, the
    tests skip; under ``CI=true`` they fail instead."""
    from tests.harness.ssh import APT_PACKAGES, SshServer, missing

    _require_system(
        "OpenSSH or rsync is not installed", missing(), APT_PACKAGES, "the test sshd runs as root (and logs in as root)"
    )
    with SshServer(tmp_path_factory.mktemp("sshd")) as server:
        yield server
