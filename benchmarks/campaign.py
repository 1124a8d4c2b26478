"""Campaign reads: the time and peak memory of the query commands over 10^4-10^6 traces.

Run with ``./run-benchmarks --campaign [--traces 10000,100000,1000000] [--runs R]``.  The
seed is a real run: a Gym 0.4.0 collection job (100 tasks of varied rewards x 4 repeats)
under ``opentelemetry-instrument``, nothing configured for export (``.cache/benchmarks/
campaign-seed/``; made again when its span segments lack facts files, ``fastpath/span_facts.py``).
A campaign (``.cache/benchmarks/campaign-<traces>/``, kept while the seed is the same) is R
run directories of its span segments copied K times, every 32-hex id (trace and job ids)
replaced per copy: links hold within a copy, no trace repeats.  A run directory holds each
seed process once (one pid, its copies' lines in gzipped segments of at most 16 MB plain
named as the embedded writer names them, each with its facts file: each seed line's facts
line, ids replaced as in the line, at the line's new offsets; its note with the counts
scaled, its own run and instance ids, a job note per copy).  Checked with the project's
reader, and the facts against the spans.

Each command runs as ``python -m gym_autoinstr ...`` with ``XDG_CACHE_HOME`` a fresh
directory per size: the first ``view`` reads with an empty cache, the later reads with what
it left.  Wall and CPU seconds (``os.wait4``: with the children it waited for); peak memory,
the larger of ``ru_maxrss`` (its largest process) and its process tree's RSS summed every
50 ms.  A command the CLI lacks (``invalid choice``) is "not available"; one past
``--max-memory-gb`` or ``--timeout`` is stopped.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import multiprocessing
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

from benchmarks.options import campaign_parser
from benchmarks.rundir import directory_bytes

CACHE = pathlib.Path(__file__).resolve().parents[1] / ".cache" / "benchmarks"
SEED = CACHE / "campaign-seed"
GYM_VERSION = "0.4.0"
TASKS, REPEATS = 100, 4
GENERATOR = 2  # bump when the generated files change: cached campaigns are made again
SEGMENT_BYTES = 16 * 1024 * 1024  # the writer's default GYM_AUTOINSTR_SEGMENT_MB
DEFAULT_RUNS = {10**4: 3, 10**5: 10, 10**6: 30}
NAME = re.compile(r"^(?P<service>.+)-(?P<pid>\d+)\.(?P<number>\d{4,})\.jsonl(?:\.gz)?$")
FACTS_LINE = re.compile(rb'\{"from":(\d+),"at":(\d+),(.*)', re.DOTALL)  # as SegmentWriter._write_facts writes it
INSTANCE = re.compile(rb'"service\.instance\.id","value":\{"stringValue":"([0-9a-f]{32})"')
COMMANDS = (  # (label, arguments): CAMPAIGN, RUN_A, RUN_B, TRACE and OUT filled in
    # what a terminal shows (the summary and the rows that matter: --summary, as when piped here)
    ("view", ["view", "CAMPAIGN", "--summary"]),
    ("view --by-task", ["view", "CAMPAIGN", "--by-task"]),
    ("view --where reward<0.5", ["view", "CAMPAIGN", "--where", "reward<0.5", "--summary"]),
    ("view --all (every line)", ["view", "CAMPAIGN", "--all"]),
    ("view --trace ID", ["view", "CAMPAIGN", "--trace", "TRACE"]),
    ("compare RUN_A RUN_B", ["compare", "RUN_A", "RUN_B"]),
    ("export --to parquet", ["export", "CAMPAIGN", "--to", "OUT"]),
)
MB = 2**20


def log(message: str) -> None:
    print(f"[campaign {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _plain(path: pathlib.Path) -> bytes:
    return gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()


# ------------------------------------------------------------------ the seed


def build_seed() -> dict:
    """The seed run, made on first use (``seed.json`` says what it holds), then cached."""
    marker = SEED / "seed.json"
    if marker.exists() and _has_facts(SEED / "run"):
        return json.loads(marker.read_text())
    if marker.exists():
        log(f"seed: {SEED} was made before segments had facts files: made again")
    from benchmarks.fleet import use_bench_venvs
    from tests.harness import shared_ray
    from tests.harness.gym_install import gym_venv
    from tests.harness.trio import GymTrio, PolicyModel

    use_bench_venvs()
    venv = gym_venv(GYM_VERSION)
    shutil.rmtree(SEED, ignore_errors=True)
    run_dir, work = SEED / "run", pathlib.Path(tempfile.mkdtemp(prefix="gym-campaign-seed-"))
    log(f"seed: a real Gym {GYM_VERSION} job of {TASKS} tasks x {REPEATS}, nothing configured, into {run_dir}")
    t0 = time.monotonic()
    policy = PolicyModel().start()
    env = {"GYM_AUTOINSTR_OUTPUT_DIR": str(run_dir)}  # (no exporter: the embedded default's files)
    # the graded resources server, as tests/harness/jobs.py's fleets: each row's own reward
    trio = GymTrio(venv, GYM_VERSION, work / "gym", policy.url, env=env, instrument=True, resources="graded")
    try:
        trio.start(timeout=300)
        row = trio.default_row()
        rows = [{**row, "verifier_metadata": {"reward": (t % 5) / 4, "row": t}} for t in range(TASKS)]
        output, done = trio.collect(rows, work / "collect", num_repeats=REPEATS, parallel=16)
        if done.returncode != 0:
            raise RuntimeError("the seed's collection job failed:\n" + done.stderr[-3000:])
        shutil.copy(output, SEED / "gym-output.jsonl")
    finally:
        trio.stop()  # SIGINT, as a user: every process seals its files and writes its final note
        policy.stop()
        shared_ray.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    if not _has_facts(run_dir):
        raise RuntimeError(f"the seed run {run_dir} has span segments without a facts file: not the current writer?")
    info = {**describe_seed(run_dir), "built_s": round(time.monotonic() - t0, 1)}
    marker.write_text(json.dumps(info, indent=1) + "\n")
    return info


def _facts_path(segment: pathlib.Path) -> pathlib.Path:
    from gym_autoinstr.commands.runs.store import _facts_file

    return _facts_file(segment)


def _has_facts(run_dir: pathlib.Path) -> bool:
    """Every span segment of ``run_dir`` has its facts file beside it."""
    from gym_autoinstr.setup.files import span_segments

    found = span_segments(run_dir)
    return bool(found) and all(_facts_path(p).exists() for p in found)


def describe_seed(run_dir: pathlib.Path) -> dict:
    """The seed's spans, traces and rollouts, read with the project's reader."""
    from gym_autoinstr.setup.files import read_path, span_segments

    spans = read_path(run_dir)
    rollouts = sorted(
        s["trace_id"] for s in spans if not s["parent_span_id"] and "nemo.gym.task.index" in s["attributes"]
    )
    if len(rollouts) != TASKS * REPEATS:
        raise RuntimeError(f"the seed run {run_dir} holds {len(rollouts)} rollout traces, not {TASKS * REPEATS}")
    key = hashlib.blake2b(digest_size=8)
    for path in sorted(run_dir.iterdir()):
        key.update(path.name.encode() + path.read_bytes())
    plain = [_plain(p) for p in span_segments(run_dir)]
    return {
        "key": key.hexdigest(),
        "gym": GYM_VERSION,
        "spans": len(spans),
        "traces": len({s["trace_id"] for s in spans}),
        "rollouts": len(rollouts),
        "rollout_trace": rollouts[len(rollouts) // 2],
        "plain_bytes": sum(map(len, plain)),
        "facts_bytes": sum(_facts_path(p).stat().st_size for p in span_segments(run_dir) if _facts_path(p).exists()),
        "gz_bytes": sum(len(gzip.compress(text, 6)) for text in plain),
    }


# ------------------------------------------------------------------ the campaign

_PLAN: dict = {}  # set before the workers fork: the seed's processes, tokenized, and the runs


def new_id(old: bytes, copy: int, digits: int = 32) -> bytes:
    return hashlib.blake2b(old + b"/%d" % copy, digest_size=digits // 2).hexdigest().encode()


def _seed_facts(segment: pathlib.Path) -> dict[tuple[int, int], bytes]:
    """A seed segment's facts lines by the byte range of the span line each is of, without
    their ``from`` and ``at`` (what follows them, ``"groups":[...]}`` and the newline)."""
    found: dict[tuple[int, int], bytes] = {}
    try:
        text = _facts_path(segment).read_bytes()
    except OSError:
        return found
    for line in text.splitlines(keepends=True):
        match = FACTS_LINE.match(line)
        if match and line.endswith(b"\n"):
            found[int(match[1]), int(match[2])] = match[3]
            continue
        try:  # (written otherwise: parsed)
            record = json.loads(line)
            rest = json.dumps({"groups": record["groups"]}, separators=(",", ":"))[1:]
            found[int(record["from"]), int(record["at"])] = rest.encode() + b"\n"
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short: no facts for that span line
    return found


def _seed_plan(run_dir: pathlib.Path) -> dict:
    """Each seed process's span lines (its segments', in order), each with its facts line
    (or None: none written), both split around the ids, and its note; the ids a run
    directory keeps (its run id, its processes' instance ids)."""
    from gym_autoinstr.setup.files import span_segments

    run_note = json.loads((run_dir / "run.json").read_text())
    per_run = {run_note["run_id"].encode()}
    split = re.compile(rb"(?<![0-9a-f])([0-9a-f]{32}|" + run_note["run_id"].encode() + rb")(?![0-9a-f])")
    by_process: dict[tuple[str, int], list[pathlib.Path]] = {}
    for path in span_segments(run_dir):
        match = NAME.match(path.name)
        by_process.setdefault((match["service"], int(match["pid"])), []).append(path)
    processes = []
    for (service, pid), paths in sorted(by_process.items()):
        lines, size = [], 0
        for path in paths:
            text, by_range, at = _plain(path), _seed_facts(path), 0
            per_run.update(INSTANCE.findall(text))
            for line in text.splitlines(keepends=True):
                facts = by_range.get((at, at + len(line)))
                lines.append((split.split(line), None if facts is None else split.split(facts)))
                at += len(line)
            size += len(text)
        note = run_dir / f"{service}-{pid}.process.json"
        note = json.loads(note.read_text()) if note.exists() else None
        processes.append({"service": service, "seed_pid": pid, "lines": lines, "note": note, "bytes": size})
    jobs = [json.loads(p.read_text()) for p in run_dir.glob("job-*.json")]
    return {"processes": processes, "per_run_ids": per_run, "run_note": run_note, "jobs": jobs}


def _pid(run: int, seed_pid: int) -> int:
    return 200000 + 1000 * run + [p["seed_pid"] for p in _PLAN["processes"]].index(seed_pid)


def _write_process(unit: tuple[int, int]) -> tuple[int, int]:
    """A worker's unit: one run directory's files of one seed process, every copy of the
    run in segments rotated at ``SEGMENT_BYTES``, each with its facts file, and its note.
    Returns (segments written, those of them whose facts do not cover them: a seed line
    without facts)."""
    from gym_autoinstr.setup.segments import FACTS_SUFFIX

    run, index = unit
    process, copies, directory = _PLAN["processes"][index], _PLAN["runs"][run], _PLAN["dirs"][run]
    pid, number, in_segment, out = _pid(run, process["seed_pid"]), 0, 0, None
    facts_lines: list[bytes] = []  # the open segment's facts file
    whole, lacking = True, 0
    ids = {piece for line, facts in process["lines"] for piece in [*line[1::2], *(facts or ())[1::2]]}
    per_run = {old: new_id(old, -1 - run, len(old)) for old in ids & _PLAN["per_run_ids"]}

    def close() -> None:
        out.close()
        if facts_lines:
            stem = f"{process['service']}-{pid}.{number:04d}"
            # gzipped, as the writer leaves a closed segment's facts
            facts = gzip.compress(b"".join(facts_lines), compresslevel=_PLAN["level"], mtime=0)
            (directory / f"{stem}{FACTS_SUFFIX}.gz").write_bytes(facts)

    for copy in copies:
        mapping = {**{old: new_id(old, copy) for old in ids}, **per_run}
        for parts, facts in process["lines"]:
            pieces = parts[:]
            pieces[1::2] = [mapping[p] for p in parts[1::2]]
            line = b"".join(pieces)
            if out is None or in_segment + len(line) > SEGMENT_BYTES:
                if out is not None:
                    close()
                    lacking += not whole
                number, in_segment, whole = number + 1, 0, True
                facts_lines = []
                name = f"{process['service']}-{pid}.{number:04d}.jsonl.gz"
                out = gzip.GzipFile(directory / name, "wb", compresslevel=_PLAN["level"], mtime=0)
            out.write(line)
            if facts is None:
                whole = False  # (a gap: readers parse this segment's spans)
            else:
                pieces = facts[:]
                pieces[1::2] = [mapping[p] for p in facts[1::2]]
                facts_lines.append(b'{"from":%d,"at":%d,' % (in_segment, in_segment + len(line)) + b"".join(pieces))
            in_segment += len(line)
    if out is not None:
        close()
        lacking += not whole
    if process["note"] is not None:  # its counts those of every copy it wrote
        n, note = len(copies), process["note"]
        note = {**note, "pid": pid, "spans": {k: v * n for k, v in note["spans"].items()}}
        note["lost"] = [{**e, "count": e.get("count", 0) * n} for e in note.get("lost") or ()]
        (directory / f"{process['service']}-{pid}.process.json").write_text(json.dumps(note) + "\n")
    return number, lacking


def _write_notes(run: int) -> None:
    """The run directory's own note (its run id) and each copy's job note."""
    directory, run_note = _PLAN["dirs"][run], _PLAN["run_note"]
    run_id = new_id(run_note["run_id"].encode(), -1 - run, len(run_note["run_id"])).decode()
    note = {**run_note, "run_id": run_id, "pid": _pid(run, run_note["pid"])}
    (directory / "run.json").write_text(json.dumps(note) + "\n")
    for copy in _PLAN["runs"][run]:
        for job in _PLAN["jobs"]:
            job = {**job, "job_id": new_id(job["job_id"].encode(), copy).decode(), "pid": _pid(run, job["pid"])}
            (directory / f"job-{job['job_id']}.json").write_text(json.dumps(job) + "\n")


def campaign(size: int, runs: int, seed: dict, level: int, workers: int) -> dict:
    """The campaign of about ``size`` traces in ``runs`` run directories: from its cache
    when it was made from this seed, else generated now (and checked)."""
    folder = CACHE / f"campaign-{size}"
    copies = max(runs, round(size / seed["traces"]))
    want = {"seed": seed["key"], "generator": GENERATOR, "size": size, "runs": runs, "copies": copies, "level": level}
    try:
        info = json.loads((folder / "campaign.json").read_text())
        if {k: info.get(k) for k in want} == want:
            log(f"campaign of {size:,}: cached in {folder} ({info['bytes'] / MB:,.0f} MB)")
            return info
    except (OSError, ValueError):
        pass
    expected = (seed["gz_bytes"] + seed.get("facts_bytes", 0)) * copies
    free = shutil.disk_usage(CACHE).free + directory_bytes(folder)[0]
    if free < 3 * expected:
        raise SystemExit(
            f"campaign of {size:,} traces: about {expected / 2**30:.1f} GB gzipped, and {free / 2**30:.1f} GB "
            f"free under {CACHE}: less than 3x that. Free some space, or take a smaller --traces."
        )
    shutil.rmtree(folder, ignore_errors=True)
    log(f"campaign of {size:,}: {copies} copies of the seed in {runs} run directories, ~{expected / MB:,.0f} MB")
    t0 = time.monotonic()
    _PLAN.update(_seed_plan(SEED / "run"), level=level, dirs=[folder / f"run-{r:02d}" for r in range(runs)])
    _PLAN["runs"] = [range(r * copies // runs, (r + 1) * copies // runs) for r in range(runs)]
    for run, directory in enumerate(_PLAN["dirs"]):
        directory.mkdir(parents=True)
        _write_notes(run)
    units = sorted(  # the largest first: the workers end together
        ((r, i) for r in range(runs) for i in range(len(_PLAN["processes"]))),
        key=lambda u: -_PLAN["processes"][u[1]]["bytes"],
    )
    segments = lacking = 0
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for done, (written, without) in enumerate(pool.imap_unordered(_write_process, units), 1):
            segments, lacking = segments + written, lacking + without
            if done % max(1, len(units) // 5) == 0:
                log(f"campaign of {size:,}: {done} of {len(units)} (run directory, process) written")
    seconds = time.monotonic() - t0
    if lacking:
        log(f"campaign of {size:,}: {lacking} of {segments} segments lack full facts (seed lines without): read whole")
    size_bytes, files = directory_bytes(folder)
    info = {**want, "traces": copies * seed["traces"], "rollouts": copies * seed["rollouts"], "bytes": size_bytes}
    info.update(files=files, plain_bytes=copies * seed["plain_bytes"], generated_s=round(seconds, 1))
    info.update(segments=segments, segments_without_facts=lacking)
    # read back: the whole campaign when small, else its first run directory
    info["verified"] = (
        verify(folder, copies, seed) if copies <= 30 else verify(_PLAN["dirs"][0], len(_PLAN["runs"][0]), seed)
    )
    (folder / "campaign.json").write_text(json.dumps(info, indent=1) + "\n")
    log(f"campaign of {size:,}: {size_bytes / MB:,.0f} MB in {files} files, generated in {seconds:.0f} s")
    return info


def verify(directory: pathlib.Path, copies: int, seed: dict) -> dict:
    """``directory`` read back with the project's reader, file by file: its distinct trace
    ids are copies x seed traces, and every link points at one of them.  And its facts:
    which segments' facts cover them (the reader takes those), and for a few of them (each
    process's first two: the second's lines re-packed at new offsets), that what the reader
    makes of them equals what it makes of their spans."""
    from gym_autoinstr.setup.files import read_path, span_segments

    traces, linked, spans = set(), set(), 0
    found = span_segments(directory)
    for path in found:
        for span in read_path(path):
            traces.add(span["trace_id"])
            linked.update(link["trace_id"] for link in span["links"])
            spans += 1
    got = {"directory": directory.name, "traces": len(traces), "spans": spans, "links_outside": len(linked - traces)}
    if len(traces) != copies * seed["traces"] or spans != copies * seed["spans"] or linked - traces:
        raise RuntimeError(f"{directory}: {got}; expected {copies} x {seed['traces']} traces, x {seed['spans']} spans")
    covered = [path for path in found if facts_cover(path)]
    checked = covered  # every one: a trace's root is in one of them
    from_facts, from_spans = facts_agree(checked)
    if from_facts != from_spans:
        raise RuntimeError(f"{directory}: the facts of {len(checked)} segments do not say what their spans say")
    got.update(segments=len(found), facts_cover=len(covered), facts_checked=len(checked))
    log(
        f"checked {directory.name}: {len(traces):,} traces = {copies} copies x {seed['traces']}, links inside; "
        f"facts cover {len(covered)} of {len(found)} segments, {len(checked)} of them agree with their spans"
    )
    return got


def facts_cover(segment: pathlib.Path) -> bool:
    """``segment``'s facts file covers it from its first byte to its last, line after line
    (``store.segment_partials`` then reads the facts alone)."""
    from gym_autoinstr.commands.runs import store

    covered = 0
    for record in sorted(store._facts_records(store._facts_file(segment)), key=lambda r: r.get("from", -1)):
        if record.get("from") != covered:
            return False
        covered = record.get("at", -1)
    return covered > 0 and covered == store._plain_size(segment)


def facts_agree(segments: list[pathlib.Path]) -> tuple[dict, dict]:
    """What the reader makes of ``segments`` together (from their facts where they cover
    them), and of their spans: each trace's partials merged and resolved to its row, which
    files hold it aside (a trace's root is in one process's segment: alone, another
    process's segment names a trace by its earliest span there, which facts need not name)."""
    from gym_autoinstr.commands.runs import facts, store
    from gym_autoinstr.setup.files import segment_lines

    def rows(read) -> dict:
        merged: dict = {}
        for index, segment in enumerate(segments):
            read(segment, merged, index)
        return {t: facts.resolve(t, p)[: facts.R_FILES] for t, p in merged.items()}

    from_spans = lambda segment, into, index: facts.partials_of(segment_lines(segment), "", into, index)  # noqa: E731
    return rows(store.segment_partials), rows(from_spans)


# ------------------------------------------------------------------ the reads


def timed(argv: list[str], env: dict, timeout: float, cap_bytes: int, out_dir: pathlib.Path) -> dict:
    """One command of the project's CLI, a process of its own: wall and CPU seconds, peak
    memory, and what became of it."""
    stdout, stderr = out_dir / "stdout", out_dir / "stderr"
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        t0 = time.perf_counter()
        command = [sys.executable, "-m", "gym_autoinstr", *argv]
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=err, start_new_session=True)
    peak, stopped, done = [0], [""], threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            try:
                root = psutil.Process(proc.pid)
                tree = [root, *root.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in tree if p.status() != psutil.STATUS_ZOMBIE)
            except psutil.Error:
                continue
            peak[0] = max(peak[0], rss)
            over = rss > cap_bytes and f"stopped: its processes held {rss / 2**30:.1f} GB"
            late = time.perf_counter() - t0 > timeout and f"stopped: still running after {timeout:.0f} s"
            if (over or late) and not stopped[0] and not done.is_set():
                stopped[0] = over or late
                os.killpg(proc.pid, 9)  # (its own session: the command and its workers)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = stderr.read_text(errors="replace")
    outcome = stopped[0] or ("ok" if proc.returncode == 0 else f"failed (exit {proc.returncode}): ")
    if outcome.startswith("failed"):
        missing = proc.returncode == 2 and "invalid choice" in text
        outcome = "not available" if missing else outcome + (text.strip().splitlines() or [""])[-1][:200]
    with open(stdout, "rb") as handle:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(MB), b""))
    largest, tree = usage.ru_maxrss / 1024, peak[0] / MB
    got = {"outcome": outcome, "seconds": seconds, "cpu_s": usage.ru_utime + usage.ru_stime, "stdout_lines": lines}
    return {**got, "largest_process_mb": largest, "tree_peak_mb": tree, "peak_mb": max(largest, tree)}


def measure(info: dict, seed: dict, a, cap_bytes: int) -> list[dict]:
    """Every command over one campaign: the first view with an empty cache, then each
    command with the cache it left (with ``--cold``, each with an empty one too)."""
    folder = CACHE / f"campaign-{info['size']}"
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="campaign-reads-", dir=CACHE))  # (not /tmp: a tmpfs is memory)
    trace = new_id(seed["rollout_trace"].encode(), info["copies"] // 2).decode()  # a rollout mid-campaign
    names = {"CAMPAIGN": str(folder), "RUN_A": str(folder / "run-00"), "RUN_B": str(folder / "run-01"), "TRACE": trace}
    names["OUT"] = str(scratch / "rollouts.parquet")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_AUTOINSTR_"))}
    env.update(COLUMNS="160", PYTHONDONTWRITEBYTECODE="1")
    rows: list[dict] = []

    def run(label: str, argv: list[str], read: str, cache: pathlib.Path, reps: int) -> None:
        argv, out = [names.get(x, x) for x in argv], pathlib.Path(names["OUT"])
        cache.mkdir(exist_ok=True)
        got: list[dict] = []
        while len(got) < reps and (not got or got[-1]["outcome"] == "ok"):
            out.unlink(missing_ok=True)
            got.append(timed(argv, {**env, "XDG_CACHE_HOME": str(cache)}, a.timeout, cap_bytes, scratch))
        row = {**got[len(got) // 2], "size": info["size"], "command": label, "read": read, "argv": argv}
        row.update(reps=[g["seconds"] for g in got], cache_mb=round(directory_bytes(cache)[0] / MB, 1))
        if all(g["outcome"] == "ok" for g in got):
            row["seconds"] = round(statistics.median(row["reps"]), 3)
        if out.exists():
            row["output_mb"] = round(out.stat().st_size / MB, 1)
        rows.append(row)
        log(f"{info['size']:,} {label} ({read}): {row['outcome']}, {row['seconds']:.2f} s, {row['peak_mb']:,.0f} MB")

    try:
        run(*COMMANDS[0], "first", scratch / "cache", 1)
        for label, argv in COMMANDS:
            run(label, argv, "later", scratch / "cache", a.reps)
            if a.cold and label != COMMANDS[0][0]:
                run(label, argv, "first", scratch / f"cache-{len(rows)}", 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


# ------------------------------------------------------------------ report and main


def report(results: dict) -> str:
    m, s = results["machine"], results["seed"]
    lines = [
        f"machine: {m['nproc']} CPUs, {m['memory_gb']} GB; load average at start "
        + ", ".join(f"{x:.1f}" for x in m["load_avg_at_start"]),
        f"seed: a real Gym {s['gym']} job, {s['rollouts']} rollouts ({s['traces']} traces, {s['spans']:,} spans); "
        "each campaign its copies with new ids; MB = 2^20 bytes",
        "",
        "| size | runs | traces | rollouts | files | on disk MB | plain MB | generated in s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in results["campaigns"]:
        lines.append(
            f"| {c['size']:,} | {c['runs']} | {c['traces']:,} | {c['rollouts']:,} | {c['files']:,} | "
            f"{c['bytes'] / MB:,.0f} | {c['plain_bytes'] / MB:,.0f} | {c['generated_s']:,.0f} |"
        )
    if results.get("rows"):
        lines += ["", "| size | command | read | seconds | CPU s | peak MB | largest process MB | cache MB | outcome |"]
        lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in results.get("rows", ()):
        numbers = (r["seconds"], r["cpu_s"], r["peak_mb"], r["largest_process_mb"], r["cache_mb"])
        shown = "{:.2f} | {:.2f} | {:,.0f} | {:,.0f} | {:,.1f}".format(*numbers)
        shown = "- | - | - | - | -" if r["outcome"] == "not available" else shown
        lines.append(f"| {r['size']:,} | `{r['command']}` | {r['read']} | {shown} | {r['outcome']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = campaign_parser().parse_args(argv)
    if a.report_from:
        print(report(json.loads(a.report_from.read_text())))
        return 0
    memory = psutil.virtual_memory().total
    cap = int(a.max_memory_gb * 2**30) if a.max_memory_gb else memory * 3 // 4
    CACHE.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    seed = build_seed()
    log(f"seed: {seed['rollouts']} rollouts, {seed['traces']} traces, {seed['spans']:,} spans ({SEED})")
    machine = {"nproc": os.cpu_count(), "memory_gb": round(memory / 2**30, 1), "load_avg_at_start": os.getloadavg()}
    results: dict = {"mode": "campaign", "machine": machine, "seed": seed, "max_memory_gb": round(cap / 2**30, 1)}
    results.update(campaigns=[], rows=[])
    output = a.output or CACHE / f"campaign-results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for size in [int(float(x)) for x in a.traces.split(",") if x.strip()]:
        runs = a.runs or DEFAULT_RUNS.get(size) or max(1, round(size / 33_000))
        info = campaign(size, runs, seed, a.gzip_level, a.workers or os.cpu_count() or 1)
        results["campaigns"].append(info)
        if not a.generate_only:
            results["rows"] += measure(info, seed, a, cap)
        output.write_text(json.dumps(results, indent=1) + "\n")  # (size by size: what is done so far)
    results["elapsed_s"] = round(time.monotonic() - t_start, 1)
    output.write_text(json.dumps(results, indent=1) + "\n")
    print(report(results))
    print(f"(total {results['elapsed_s'] / 60:.1f} min; results in {output})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
