"""One run directory per run: a collection process joins the fleet it sends rollouts to.

With the embedded default (spans to local files), ``gym env start`` (the orchestrator)
mints a run id and writes under ``./gym-autoinstr-runs/<run id>/``; its servers inherit
both.  A collection process (``ng_collect_rollouts``, ``gym eval run --no-serve``, a
script of the user's) is started on its own, usually from another terminal in the same
directory, and inherits neither.  So the orchestrator leaves a note in its run directory
(``run.json``: its run id, pid and the process's start time), and a Gym process that
starts no servers (``starts_fleet``) and has no run of its own (no
``GYM_AUTOINSTR_OUTPUT_DIR``, no run id) joins the newest run in
``./gym-autoinstr-runs`` whose orchestrator is still running: the same directory, the same
``nemo.gym.run.id``, inherited by its own children.  It says so once, with the way to
choose otherwise; a process that finds none says where it writes instead.

A Slurm submission (``gym eval submit``) writes ``gym.submit`` into its own run directory,
but each job writes into its job directory, on the cluster.  So the submitting process
leaves a note beside its files (``submission-<id>.json``: the submission, the host, each
job's Slurm id and trace directory), which ``gym-autoinstr view`` follows: viewing the
submit's directory reads the jobs' files too where they are on this machine, and names
where they are where not (``submitted_jobs``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gym_autoinstr import settings
from gym_autoinstr._log import logger

RUN_NOTE = "run.json"
# Gym's commands that start servers (legacy names without their ng_/nemo_gym_ prefix).
_FLEET_LEGACY = frozenset({"run", "e2e_collect_rollouts"})


def starts_fleet(argv: list[str]) -> bool:
    """Whether this Gym command starts servers of its own (``gym env start``, ``gym eval
    run`` without ``--no-serve``, ``ng_run``, ``ng_e2e_collect_rollouts``): it owns a run.
    Anything else Gym runs (``ng_collect_rollouts``, ``gym eval run --no-serve``, a user's
    script calling Gym's collection) sends its work to a fleet that is already running."""
    if not argv:
        return False
    program = os.path.basename(argv[0])
    legacy = program.removeprefix("nemo_gym_").removeprefix("ng_")
    if legacy != program:
        return legacy in _FLEET_LEGACY
    if program not in ("gym", "ng"):
        return False
    words = [arg for arg in argv[1:] if not arg.startswith(("-", "+"))][:2]
    return words == ["env", "start"] or (words == ["eval", "run"] and "--no-serve" not in argv)


def _process_start(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, from ``/proc``): a pid Linux handed
    to another process since has another start.  None where there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return None


def _running(note: dict) -> bool:
    pid = note.get("pid")
    if type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    if _zombie(pid):  # exited, not yet reaped by its parent
        return False
    recorded = note.get("process_start")
    return recorded is None or _process_start(pid) in (None, recorded)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def record_run(directory: Path, run_id: str) -> None:
    """The orchestrator's note in its run directory (written once, whole)."""
    note = {
        "run_id": run_id,
        "pid": os.getpid(),
        "process_start": _process_start(os.getpid()),
        "started": time.time(),
    }
    # (the files themselves report an unwritable directory; without the note a collection
    # process writes beside, not inside, this run)
    _write_note(directory, RUN_NOTE, note)


def _write_note(directory: Path, name: str, note: dict) -> None:
    """``note`` as ``directory/name``, whole or not at all (written aside, then renamed)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f".{name}.{os.getpid()}"
        partial.write_text(json.dumps(note) + "\n")
        os.replace(partial, directory / name)
    except OSError as error:
        logger.debug("note %s not written in %s: %s", name, directory, error)


def live_run(parent: Path) -> tuple[Path, dict] | None:
    """The newest run directory under ``parent`` whose orchestrator is still running."""
    found: list[tuple[float, Path, dict]] = []
    try:
        candidates = list(parent.glob(f"*/{RUN_NOTE}"))
    except OSError:
        return None
    for path in candidates:
        try:
            note = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(note, dict) and isinstance(note.get("run_id"), str) and _running(note):
            found.append((float(note.get("started") or 0), path.parent, note))
    if not found:
        return None
    _, directory, note = max(found, key=lambda item: item[0])
    return directory, note


def join_live_run(parent: Path, environ: dict[str, str] | os._Environ[str] | None = None) -> Path | None:
    """For a Gym process with no run of its own: the running fleet's directory and run id,
    set in ``environ`` (so children inherit them), said once.  None when it has a run
    already or there is none to join."""
    environ = os.environ if environ is None else environ
    if settings.OUTPUT_DIR.raw(environ):
        return None
    if any(setting.raw(environ) for setting in (settings.GYM_RUN_ID, settings.SLURM_JOB_ID, settings.RUN_ID)):
        return None
    joined = live_run(parent)
    if joined is None:
        return None
    directory, note = joined
    environ[settings.RUN_ID.name] = note["run_id"]
    environ[settings.OUTPUT_DIR.name] = str(directory)
    logger.info(
        "traces of this process go to %s, beside the servers of run %s (its `gym env start`, pid %s, "
        "runs from this directory). Set %s to write elsewhere.",
        directory,
        note["run_id"],
        note["pid"],
        settings.OUTPUT_DIR.name,
    )
    return directory


# -- Slurm submissions ----------------------------------------------------------------------

SUBMISSION_NOTE_PREFIX = "submission-"


def record_submission(directory: Path, submission: str, hostname: str | None, jobs: list[dict[str, str]]) -> None:
    """The submitting process's note in its run directory: ``jobs`` as
    ``{"benchmark", "slurm_job_id", "traces"}`` (the job's trace directory, on ``hostname``
    when the submit went over SSH, else on this machine)."""
    note = {"submission": submission, "hostname": hostname, "jobs": jobs}
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in submission)
    _write_note(directory, f"{SUBMISSION_NOTE_PREFIX}{safe}.json", note)


def submitted_jobs(path: Path) -> list[dict]:
    """Every job the submission notes under the directory ``path`` name, each
    with its ``submission`` and ``hostname``; notes that cannot be read are skipped."""
    try:
        notes = sorted(path.rglob(f"{SUBMISSION_NOTE_PREFIX}*.json")) if path.is_dir() else []
    except OSError:
        return []
    jobs = []
    for note_path in notes:
        try:
            note = json.loads(note_path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(note, dict) or not isinstance(note.get("jobs"), list):
            continue
        for job in note["jobs"]:
            if isinstance(job, dict) and isinstance(job.get("traces"), str):
                jobs.append({**job, "submission": note.get("submission"), "hostname": note.get("hostname")})
    return jobs
